"""`goodput bench scale` end to end at its smallest size (answers over HTTP from its own
process), and its report with live rows, one of them past the machine's ceiling."""

from __future__ import annotations

import json

from bench import scale
from detector import fields as F


def test_scale_bench_runs_the_whole_cycle_and_reports_it(tmp_path):
    doc = scale.run([1000], shards=1, cycles=2, out=tmp_path)
    row = doc["rows"][0]["worst_shard"]
    assert row["gpus"] == 1000 and row["jobs"] == 63
    assert row["jobs_fitted"] == 63  # measured in the steady state the service reached itself
    assert row["queries"] == len(F.DCGM_FIELDS) + 4
    # + the job -> node join (125 pairs) and three per-job answers (progress, step, pause; 63 jobs)
    # - the profiling fields of node100's 8 GPUs (one node in 100 without them: scale.NO_DCP)
    prof = sum(n.startswith("DCGM_FI_PROF") for n in F.DCGM_FIELDS)
    assert row["answer_series"] == 1000 * len(F.DCGM_FIELDS) + 125 + 3 * 63 - 8 * prof
    assert 0 < row["bare_orjson_parse_s_min"] and 0 < row["cycle_s_min"]
    # bounded (issue 18): at most 2 series per GPU plus per-job and per-node series, one per
    # detector (8 with the combined score) for each of the 63 jobs and 125 nodes
    assert row["metrics_series"] <= 2 * 1000 + 8 * (63 + 125) + 20
    # the long run's refits, timed after the measured cycles: each of the 63 jobs every 15 min
    assert row["refits_per_cycle_long_run"] == round(63 * 5.0 / 900.0, 2)
    assert 0 < row["refit_s_median"]
    assert row["engine_with_refits_vs_bare_numpy"] > row["engine_vs_bare_numpy"]
    saved = json.loads((tmp_path / "scale.json").read_text())
    assert saved["rows"][0]["gpus"] == 1000
    live = {
        "measured": "now",
        "interval_s": 5,
        "seconds": 20,
        "cores": 2,
        "rows": [{"nodes": 2000, "gpus": 16000, "failed": "simulator did not start", "phases": []}],
    }
    text = scale.markdown({**saved, "live": live})
    assert "0.35 refits a cycle on this shard" in text
    assert "| 1,000 | 1 | 1,000 |" in text and "| 16,000 | failed: simulator did not start" in text

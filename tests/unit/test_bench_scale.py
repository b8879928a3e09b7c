"""`goodput bench scale` end to end at its smallest size (answers over HTTP from its own
process), and its report with live rows, one of them past the machine's ceiling."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench import scale
from detector import fields as F


def test_scale_bench_runs_the_whole_cycle_and_reports_it(tmp_path):
    doc = scale.run([1000], shards=1, cycles=2, out=tmp_path)
    row = doc["rows"][0]["worst_shard"]
    assert row["gpus"] == 1000 and row["jobs"] == 63
    assert row["jobs_fitted"] == 63  # measured in the steady state the service reached itself
    # + host CPU, node info, 3 per-job values, the GPUs' sample times (`ingest.SAMPLED`)
    assert row["queries"] == len(F.DCGM_FIELDS) + 6
    # + the host CPU of every GPU (each runs a job), the job -> node join (125 pairs) and three
    # per-job answers (progress, step, pause; 63 jobs) - the profiling fields of node100's 8
    # GPUs (one node in 100 without them: scale.NO_DCP); scale_data answers the sample times
    # as it answers every query it does not know, one series per job (no GPU key: unused)
    prof = sum(n.startswith("DCGM_FI_PROF") for n in F.DCGM_FIELDS)
    assert row["answer_series"] == 1000 * (len(F.DCGM_FIELDS) + 1) + 125 + 4 * 63 - 8 * prof
    assert 0 < row["bare_orjson_parse_s_min"] and 0 < row["cycle_s_min"]
    # bounded (issue 18): at most 2 series per GPU plus per-job and per-node series, one per
    # detector (8 with the combined score) for each of the 63 jobs and 125 nodes
    assert row["metrics_series"] <= 2 * 1000 + 8 * (63 + 125) + 20
    # the long run: as many cycles again, measured after `_age` spread the jobs' refits
    assert row["long_run_refits_per_cycle"] >= 0
    assert 0 < row["long_run_score_s_median"] and 0 < row["long_run_engine_vs_bare_numpy"]
    assert 0 < row["long_run_total_engine_vs_bare_numpy"]
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
    assert "- Long run: after the measured cycles" in text
    assert f"({row['long_run_refits_per_cycle']}) |" in text
    assert "| 1,000 | 1 | 1,000 |" in text and "| 16,000 | failed: simulator did not start" in text


def test_age_spreads_refits_and_fills_reservoirs():
    """`_age`: each fitted job's last fit at a phase spread over `refit_s` (so about jobs x
    interval / refit_s come due a cycle), its reservoir full of its own rows, and its rows
    learned scaled to 2 hours; a job not fitted yet is left as it is."""
    from detector.learning import JobInfo
    from detector.service import Service, ServiceConfig

    svc = Service(ServiceConfig(prometheus_url="http://127.0.0.1:9"))
    base, cfg = svc.engine.base, svc.engine.cfg
    now = 1.8e9
    for k in range(400):
        info = JobInfo(name=f"j{k}", first_seen=now - 420.0, fitted_at=now - 60.0, seen=128)
        info.rows = np.zeros((cfg.reservoir, len(F.ALL_FIELDS)), np.float32)
        info.rows[:128] = np.arange(1, 129)[:, None]
        info.fitted_rows = 24
        base.jobs[f"j{k}"] = info
    young = base.jobs["young"] = JobInfo(name="young", first_seen=now - 30.0)
    scale._age(svc, now)
    aged = [i for i in base.jobs.values() if i is not young]
    phase = np.array([now - i.fitted_at for i in aged])
    assert 0 <= phase.min() and phase.max() <= cfg.refit_s
    quartiles = np.quantile(phase, [0.25, 0.5, 0.75]) / cfg.refit_s  # uniform: not bunched
    assert quartiles == pytest.approx([0.25, 0.5, 0.75], abs=0.08)
    for info in aged:
        assert info.fitted_rows == 0  # no early refit left: the periodic ones only
        assert set(np.unique(info.rows[:, 0])) == set(range(1, 129))  # its own rows, repeated
        # 128 rows in 300 s of learning -> 2 h minus warm-up at that rate
        assert info.seen == int(128 * (7200.0 - cfg.warmup_s) / 300.0)
    assert young.fitted_at is None and young.seen == 0 and young.rows is None


def test_age_fills_level_windows_with_each_series_own_samples():
    from detector.univariate import Bank

    bank = Bank(1e-4)
    rows = bank.add(3)
    for t in range(1, 8):  # row 0: 7 samples, row 1: 3 (from t = 5), row 2: none
        x = np.array([t, t * 10.0 if t >= 5 else np.nan, np.nan])
        bank.update(rows, x, np.zeros(3, bool))
    scale._fill_windows(bank)
    assert list(bank.nbuf_[:3]) == [bank.window, bank.window, 0]
    assert list(bank.buf_[0, :8]) == [1, 2, 3, 4, 5, 6, 7, 1]  # oldest first, repeated
    assert list(bank.buf_[1, :4]) == [50, 60, 70, 50]
    assert set(bank.buf_[0]) == set(range(1, 8))
    assert bank.bhead_[0] == 0  # the next sample replaces the oldest

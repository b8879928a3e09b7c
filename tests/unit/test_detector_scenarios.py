"""The engine on the simulator's real scenarios (recorded once per scenario into tmp).

Every scenario: 4 nodes, 20 min, the fault at 7 min on job 1001 (node1 + node2), job 1002 a
healthy neighbour on node3 + node4. Asserted (1.0 = alert threshold):
- faults that metrics or progress show raise job 1001's combined score above 1.0 after onset,
  and where there is a culprit node the metrics can name, that node's suspect score is the
  highest of the job and >= 1.0;
- faults left to the logs (NaN, OOM, segfault, application XID) raise nothing;
- nothing reaches 1.0 before onset (warm-up, checkpoints, evaluations) or on the neighbour.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from detector.pipeline import Config, Engine
from detector.replay import load, steps

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
METRIC_VISIBLE = {
    "xid79-off-bus": "node2",
    "ecc-dbe": "node2",
    "gsp-timeout": "node2",
    "nvlink-error": "node2",
    "node-lost": "node2",
    "degradation": "node2",
    "thermal-straggler": "node2",
    "host-straggler": "node2",  # the half-slow 2-node job: localised by the shift detector
    "spin-hang": "node2",
    "ib-flap": None,  # every rank times out alike: the link is named by the logs
    "dataloader-stall": None,
    "fs-stall": None,
}
LEFT_TO_LOGS = ("nan-divergence", "cuda-oom", "segfault", "app-fault")

_cache: dict[str, tuple[dict, pd.DataFrame, pd.DataFrame]] = {}


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """name -> (truth, job scores, node scores), recorded and replayed once per scenario."""
    pytest.importorskip("exporters.sim.recording")
    from exporters.sim.recording import run_scenario

    root = tmp_path_factory.mktemp("recordings")

    def get(name: str):
        if name not in _cache:
            rec = run_scenario(SCENARIOS / f"{name}.yaml", out=root / name)
            frame, names, interval = load(rec.path)
            eng = Engine(Config(interval_s=interval or 5.0))
            jobs, nodes = [], []
            for _, now, res in steps(frame, names, eng):
                jobs.append(res.jobs.assign(t=now))
                nodes.append(res.nodes.assign(t=now))
            _cache[name] = (rec.truth, pd.concat(jobs), pd.concat(nodes))
        return _cache[name]

    return get


def _onset(truth: dict) -> float:
    return min(f["onset"] for f in truth["faults"])


def _combined(jobs: pd.DataFrame) -> pd.DataFrame:
    return jobs[jobs.detector == "combined"]


@pytest.mark.parametrize("name", sorted(METRIC_VISIBLE))
def test_metric_visible_fault_raises_job_and_culprit(scored, name):
    truth, jobs, nodes = scored(name)
    onset = _onset(truth)
    comb = _combined(jobs)
    assert comb[comb.t < onset].score.max() < 1.0, "alarm before the fault (warm-up, phases)"
    after = comb[(comb.t >= onset) & (comb.job_id == "1001")]
    assert after.score.max() > 1.0, f"{name}: job score never crossed 1.0"
    if name != "fs-stall":  # a filesystem stall hits every job; otherwise the neighbour is calm
        assert comb[comb.job_id == "1002"].score.max() < 1.0
    culprit = METRIC_VISIBLE[name]
    if culprit:
        assert truth["faults"][0]["nodes"] == [culprit]
        peak = nodes[(nodes.t >= onset) & (nodes.job_id == "1001")].groupby("node").score.max()
        assert peak.idxmax() == culprit and peak[culprit] >= 1.0, peak.to_dict()
        assert peak.drop(culprit).max() < peak[culprit]


@pytest.mark.parametrize("name", LEFT_TO_LOGS)
def test_log_only_faults_raise_no_metric_score(scored, name):
    _, jobs, nodes = scored(name)
    assert _combined(jobs).score.max() < 1.0
    assert nodes.score.max() < 1.0


def test_healthy_short_is_quiet_through_checkpoints_and_evals(scored):
    truth, jobs, nodes = scored("healthy-short")
    assert truth["faults"] == []
    assert _combined(jobs).score.max() < 1.0 and nodes.score.max() < 1.0

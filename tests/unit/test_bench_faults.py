"""`goodput bench faults` in reduced form: the pipeline works and the report has every field.

The targets are not asserted here (the committed full results say where they are met).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pandas as pd
import pytest

from alertdsl import evaluation as E
from bench import faults_plan as P
from bench.faults_summary import TARGETS

pytestmark = pytest.mark.filterwarnings("ignore")


def test_plan_varies_job_size_and_covers_every_kind() -> None:
    from exporters.sim import FAULT_KINDS

    runs = P.plan(seeds=3)
    fault = [r for r in runs if not r.healthy]
    kinds = {P.scenario_for(r).faults[0].kind for r in fault if r.seed_index == 0}
    assert kinds == set(FAULT_KINDS) - {"healthy"}
    assert {r.job_nodes for r in fault} == {1, 2, 3}
    healthy = [r.scenario for r in runs if r.healthy]
    assert healthy == [
        "healthy-long",
        "healthy-monitoring-gap",
        "healthy-rank0-evals",
        "healthy-rank0-saves",
    ]
    quick = P.plan(quick=True)
    assert len(quick) == len(P.QUICK) and {r.seed_index for r in quick} == {0}
    cold = P.plan_cold(seeds=2)
    assert {r.group for r in cold} == {"cold-start"} and all(r.job_nodes is None for r in cold)
    assert [r.scenario for r in cold if r.healthy] == [
        "healthy-ckpt-load",
        "healthy-long-pauses",
        "healthy-rank0-silent-prep",
        "healthy-rank0-tokenise",
        "healthy-slow-compile",
        "healthy-small",
    ]
    spec = next(r for r in cold if r.seed_index == 1)
    assert P.scenario_for(spec).seed == spec.seed  # the run's seed, the job as written


def test_scenario_for_keeps_the_culprit_on_the_job_and_a_spare_node() -> None:
    spec = next(r for r in P.plan(seeds=3, pattern="spin-hang") if r.job_nodes == 1)
    sc = P.scenario_for(spec)
    assert sc.jobs[0].nodes == 1 and sc.nodes == sum(j.nodes for j in sc.jobs) + 1
    assert sc.faults[0].node == "node1"  # the scenario names node2: not on a 1-node job
    assert sc.seed == spec.seed


def test_online_alerts_match_a_full_evaluation(tmp_path: Path) -> None:
    """The pre-check only skips alerts that could not fire: compare with evaluate() over the
    whole history at every step of a run with a fault."""
    from bench.inproc import Harness

    spec = P.plan(pattern="xid79-off-bus", seeds=1)[0]
    sc = P.scenario_for(spec)
    h = Harness(sc, spec.seed, tmp_path)
    online: set[tuple[float, str, str, str]] = set()
    frames: dict[str, list[pd.DataFrame]] = {}
    orig_add = h.alerts.add

    def add(now: float, fr: dict[str, pd.DataFrame]) -> None:
        for k, v in fr.items():
            frames.setdefault(k, []).append(v)
        orig_add(now, fr)

    orig_firing = h.alerts.firing

    def firing(now: float) -> list[dict]:
        out = orig_firing(now)
        for a in out:
            online.add((now, a["alertname"], a.get("node", ""), a.get("job_id", "")))
        return out

    h.alerts.add = add  # type: ignore[method-assign,assignment]
    h.alerts.firing = firing  # type: ignore[method-assign,assignment]
    onset = sc.start + sc.faults[0].at_s
    try:
        while h.now < onset + 90:
            h.step()
    finally:
        h.close()
    full: set[tuple[float, str, str, str]] = set()
    for c in h.alerts.conds:
        parts = [f for f in frames[c.source] if len(f)]
        if not parts:
            continue
        df = pd.concat(parts, ignore_index=True)
        fired = E.evaluate(c.alert, df)
        for row in fired.to_dict("records"):
            node = "" if pd.isna(row.get("node", "")) else str(row.get("node", ""))
            job = "" if pd.isna(row.get("job_id", "")) else str(row.get("job_id", ""))
            full.add((row["timestamp"], c.alert.name, node, job))
    assert full, "the fault fired nothing"
    assert h.alerts.skipped > 0  # the pre-check did skip work
    assert online == full


def test_quick_benchmark_writes_a_complete_report(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from goodput.cli import app

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = CliRunner().invoke(app, ["bench", "faults", "--quick", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "faults.json").read_text())
    md = (tmp_path / "faults.md").read_text()
    s = doc["summary"]
    assert doc["meta"]["quick"] and doc["meta"]["runs"] == len(P.QUICK)
    assert set(s["targets"]) == set(TARGETS)
    for group in [*s["per_kind"].values(), s["overall"]]:
        for key in (
            "faults",
            "detected",
            "latency_p50_s",
            "latency_p95_s",
            "outcome_accuracy",
            "action_accuracy",
            "culprit_precision",
            "culprit_recall",
            "time_to_recover_p50_s",
            "gpu_hours_lost_mean",
            "repeat_incidents",
        ):
            assert key in group
    fi = s["false_incidents"]
    assert fi["healthy_gpu_hours"] > 0 and fi["upper95_per_1000_gpu_hours"] is not None
    assert "destructive_false_actions" in fi
    faults = [f for r in doc["runs"] for f in r["faults"]]
    assert {f["kind"] for f in faults} == {"xid79_off_bus", "spin_hang", "cuda_oom"}
    for f in faults:  # the pipeline ran end to end: detected, diagnosed, decided, acted
        assert f["detected"] and f["outcome"] and f["action"] and f["result"]
        assert "gpu_hours_lost" in f and "time_to_recover_s" in f
    assert "| **overall** |" in md and "healthy GPU-hours" in md
    for name in TARGETS:
        assert f"| {name} |" in md
    # the cold-start and real-signal rows are reported apart from the simulator rows
    cold = doc["cold_start"]
    assert set(cold["per_kind"]) == set(P.QUICK_COLD) - {"healthy-small"}
    assert {r["run"]["group"] for r in doc["cold_start_runs"]} == {"cold-start"}
    assert cold["false_incidents"]["healthy_gpu_hours"] > 0
    assert {r["kind"] for r in doc["real_signal"]} == {
        "healthy",
        "spin_hang",
        "idle_hang",
        "straggler",
    }
    assert "## Cold-start rows" in md and "## Real-signal rows" in md


def test_bad_scenario_glob_is_a_clear_error(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from goodput.cli import app

    res = CliRunner().invoke(
        app, ["bench", "faults", "--scenario", "nothing-like-this*", "--out", str(tmp_path)]
    )
    assert res.exit_code != 0 and "no scenario matches" in res.output


def test_a_monitoring_gap_is_no_incident(tmp_path: Path) -> None:
    """Every exporter unscraped for 60 s, then the DCGM exporters alone for 90 s, under two
    healthy jobs: their series go stale (the harness gives empty frames, as Prometheus after a
    failed scrape) and nothing may be opened. Before the detector's guard (GPUs gone silent
    are `missing` only while as many nodes answer), the healthy jobs were scored 2.0 and an
    incident opened on them."""
    from bench.inproc import Harness
    from exporters.sim import load_scenario
    from exporters.sim.scenario import ScenarioError, parse_scenario

    sc = load_scenario(P.SCENARIOS / "healthy-monitoring-gap.yaml")
    assert sc.unscraped("slurm", 600.0) and not sc.unscraped("slurm", 960.0)
    assert sc.unscraped("dcgm", 1049.0) and not sc.unscraped("dcgm", 1050.0)
    h = Harness(sc, sc.seed, tmp_path)
    try:
        silent = []
        while h.sim.elapsed < 1100:
            h.step()
            if not len(h.alerts.hist["dcgm"][-1][1]):
                silent.append(h.sim.elapsed)
        assert len(silent) == 12 + 18  # the gaps took effect: 60 s and 90 s of 5 s samples
        assert h.incidents == []
    finally:
        h.close()
    with pytest.raises(ScenarioError, match="gaps.0.sources"):
        parse_scenario(sc.model_dump() | {"gaps": [{"at_s": 1, "duration_s": 5, "sources": ["x"]}]})

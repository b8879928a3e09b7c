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


def _fault(kind: str, truth_nodes: list[str], named: list[str], ok: bool = True) -> dict:
    return {
        "kind": kind,
        "truth": {"outcome": "x", "action": "requeue", "nodes": truth_nodes},
        "detected": True,
        "latency_s": 10.0,
        "outcome": "x",
        "effective_action": "requeue",
        "nodes": named,
        "outcome_ok": ok,
        "action_ok": ok,
    }


def test_naming_nodes_on_a_fault_without_culprit_costs_precision() -> None:
    """A node named where the truth names none is a false positive, and the fault a miss.
    Before, precision was counted over culprit faults only: naming three innocent nodes on
    every app_fault, cuda_oom or dataloader_stall kept it at 1.0, and none was listed."""
    from bench.faults_summary import summarize

    faults = [
        _fault("xid79_off_bus", ["node2"], ["node2"]),
        _fault("cuda_oom", [], ["node1", "node3"]),  # innocent nodes named
        _fault("segfault", [], []),
    ]
    run = {
        "run": {"scenario": "s", "seed": 1, "job_nodes": 2},
        "faults": faults,
        "incidents": [],
        "healthy_gpu_hours": 1.0,
    }
    s = summarize([run])
    assert s["overall"]["culprit_precision"] == round(1 / 3, 3)
    assert s["overall"]["culprit_recall"] == 1.0
    assert s["per_kind"]["cuda_oom"]["culprit_precision"] == 0.0
    assert s["per_kind"]["segfault"]["culprit_precision"] is None  # nothing named, nothing due
    assert [m["kind"] for m in s["misses"]] == ["cuda_oom"]
    assert not s["targets"]["culprit_precision"]["met"]


def _harness(onset: float, verbs: list, runs: dict, fault: dict, incident: object) -> object:
    from types import SimpleNamespace as NS

    job = NS(ever_nodes=["node1", "node2"], state="PENDING", end_t=onset + 60.0, ckpt_iter=0)
    cluster = NS(
        now=onset + 600.0,
        start=0.0,
        faults={fault["fault_id"]: fault},
        jobs={"1001": job},
        nodes={"node1": None, "node2": None, "node3": None},
        verbs=verbs,
    )
    return NS(
        sim=NS(cluster=cluster, errors=[]),
        incidents=[incident],
        recovered={},
        running={"1001": [(t, 16) for t in range(5, int(onset) + 60, 5)]},
        runs=runs,
        iters={},
        interval_s=5.0,
    )


def test_recovery_and_stop_cost_count_from_when_the_action_ran() -> None:
    """A drain recovers when the simulator drained the node, and a stopped job costs the GPU
    time it held until it stopped running: both timed by the simulator, not by when the
    incident opened. Before, both used the incident's open time (30 s after onset here),
    so an action that ran later, or never ran at all, looked as quick."""
    from bench.faults_score import score
    from bench.receiver import ActionView, Incident

    onset = 1000.0
    spec = P.RunSpec("s", 0, 1, False, 2, 2)
    sc = type("Sc", (), {"name": "s", "nodes": 4})()

    def incident(kind: str) -> Incident:
        inc = Incident(7, "1001", None, onset + 30.0, alert_names=["A"])
        inc.diagnosis = {"outcome": "x", "affected_nodes": ["node2"]}
        inc.action, inc.result = ActionView(kind, kind, None, ()), "executed"
        return inc

    drain = {"fault_id": "f1", "kind": "degradation", "onset": onset, "job_id": "1001",
             "outcome": "gpu_degradation", "action": "drain", "nodes": ["node2"]}  # fmt: skip
    verbs = [(onset - 100.0, "drain", "node2"), (onset + 45.0, "drain", "node3"),
             (onset + 50.0, "drain", "node2")]  # fmt: skip
    h = _harness(onset, verbs, {"1001": [[0.0, None, 16]]}, drain, incident("drain"))
    (f,) = score(h, spec, sc)["faults"]
    assert f["time_to_recover_s"] == 50.0  # the culprit's drain, after onset
    h = _harness(onset, [], {"1001": [[0.0, None, 16]]}, drain, incident("drain"))
    assert score(h, spec, sc)["faults"][0]["time_to_recover_s"] is None  # never drained

    stop = {"fault_id": "f1", "kind": "nan_divergence", "onset": onset, "job_id": "1001",
            "outcome": "workload_divergence", "action": "stop", "nodes": []}  # fmt: skip
    # the job ran on 60 s past onset, until the stop (a requeue-hold) ran; then a restart
    # (a wrong one) ran it again for 20 s
    runs = {"1001": [[0.0, onset + 60.0, 16], [onset + 200.0, onset + 220.0, 16]]}
    h = _harness(onset, [], runs, stop, incident("stop"))
    (f,) = score(h, spec, sc)["faults"]
    assert f["gpu_hours_lost"] == round(16 * (60 + 20) / 3600.0, 3)


def test_the_harness_times_each_run_of_a_job_by_the_simulator() -> None:
    """Runs end when the simulator ended them (a crash, a requeue, a hold), not at the next
    sample: a stop's cost is read from them."""
    from types import SimpleNamespace as NS

    from bench.inproc import Harness

    h = NS(runs={}, now=100.0)
    job = NS(job_id="1", state="RUNNING", start_t=10.0, end_t=0.0, alloc=[("n", 0)] * 8)
    Harness._track_runs(h, job)  # type: ignore[arg-type]
    job.state, job.end_t, h.now = "PENDING", 97.5, 105.0  # requeued at 97.5
    Harness._track_runs(h, job)  # type: ignore[arg-type]
    job.state, job.start_t, h.now = "RUNNING", 110.0, 110.0
    Harness._track_runs(h, job)  # type: ignore[arg-type]
    job.state, job.end_t, h.now = "FAILED", 131.0, 135.0
    Harness._track_runs(h, job)  # type: ignore[arg-type]
    assert h.runs == {"1": [[10.0, 97.5, 8], [110.0, 131.0, 8]]}

"""`goodput bench faults`: every fault scenario through the production code, in simulated time.

Each run drives `bench.inproc.Harness` (simulator → log parser / Slurm view → detector engine →
alert conditions → the receiver app itself: webhook, incidents, diagnosis worker, attribution,
decide (default policy, act mode), outbox and executor on a simulated clock → simulated
scheduler) and is scored against the simulator's ground truth (`cluster.faults`). Fault
scenarios run with several seeds; the seed index also picks the faulty job's size (1, 2 or 3
nodes; the cluster gets one spare node so that a requeue without the culprit can run).
Results: `faults.json` (every run, every incident) and `faults.md` (the tables). This module runs
and writes them; the plan, the scoring, the aggregation and the report are `bench.faults_*`.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from bench.faults_plan import RunSpec, plan, plan_cold, scenario_for
from bench.faults_report import NOTES, markdown
from bench.faults_score import first_incident, score
from bench.faults_summary import TARGETS, summarize

RESULTS = Path(__file__).resolve().parent / "results"
SETTLE_S = 300.0  # a fault run ends this long after the fault was handled (or at its end)


def _settled(h: Any) -> bool:
    """Every fault was handled (and its job runs again where a restart was due) long enough ago."""
    from recovery.policy import RESTARTS

    faults = list(h.sim.cluster.faults.values())
    if not faults:
        return False
    done = []
    for f in faults:
        inc = first_incident(h, f)
        if inc is None or inc.action is None:
            return False
        slurm_did = "already_requeued_by_slurm" in inc.action.reasons
        if slurm_did or (inc.action.kind in RESTARTS and inc.result == "executed"):
            t = h.recovered.get(f["fault_id"])
            if t is None:
                return False
            done.append(t)
        else:
            done.append(inc.opened_at)
    return h.now >= max(done) + SETTLE_S


def run_one(spec: RunSpec, directory: Path | None = None) -> dict[str, Any]:
    """Run one scenario in simulated time and score it against its ground truth."""
    from bench.inproc import Harness

    sc = scenario_for(spec, directory)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="goodput-bench-") as tmp:
        h = Harness(sc, spec.seed, Path(tmp))
        end = h.sim.cluster.start + sc.duration_s
        try:
            while h.now + 1e-6 < end:
                h.step()
                if not spec.healthy and _settled(h):
                    break
            result = score(h, spec, sc)
        finally:
            h.close()
    result["wall_s"] = round(time.perf_counter() - t0, 2)
    result["alert_evaluations"] = h.alerts.evaluations
    result["not_in_process"] = h.alerts.skipped_alerts()
    return result


def run_all(
    runs: list[RunSpec],
    workers: int = 1,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every spec (in `workers` processes when > 1); results in plan order."""
    if workers <= 1 or len(runs) <= 1:
        out = []
        for r in runs:
            res = run_one(r)
            if progress:
                progress(res)
            out.append(res)
        return out
    import multiprocessing as mp

    # the long healthy run first, so that it overlaps the fault runs
    order = sorted(range(len(runs)), key=lambda i: not runs[i].healthy)
    results: dict[int, dict[str, Any]] = {}
    ctx = mp.get_context("fork")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futs = {pool.submit(run_one, runs[i]): i for i in order}
        for fut in as_completed(futs):
            res = fut.result()
            results[futs[fut]] = res
            if progress:
                progress(res)
    return [results[i] for i in range(len(runs))]


def benchmark(
    quick: bool = False,
    seeds: int = 3,
    pattern: str | None = None,
    out: Path | None = RESULTS,
    workers: int = 1,
    progress: Callable[[dict[str, Any]], None] | None = None,
    notes: list[str] | None = None,
    cold: bool = True,
    real: bool = True,
) -> dict[str, Any]:
    """Plan, run, summarize; write faults.json and faults.md under `out` (unless None). The
    simulator rows, the cold-start rows and the real-signal rows are reported apart."""
    sim_runs = plan(quick, seeds, pattern)
    cold_runs = plan_cold(quick, seeds, pattern) if cold else []
    if not sim_runs and not cold_runs:
        raise ValueError(f"no scenario matches {pattern!r}")
    t0 = time.perf_counter()
    everything = run_all(sim_runs + cold_runs, workers, progress)
    results = [r for r in everything if r["run"]["group"] == "sim"]
    cold_results = [r for r in everything if r["run"]["group"] != "sim"]
    real_rows = readings = None
    if real and pattern is None:
        from bench import public_readings, realsignal

        real_rows, readings = realsignal.rows(), public_readings.rows()
    wall = time.perf_counter() - t0
    doc = {
        "meta": {
            "command": "goodput bench faults"
            + (" --quick" if quick else "")
            + (f" --seeds {seeds}" if seeds != 3 and not quick else "")
            + (f" --scenario '{pattern}'" if pattern else ""),
            "quick": quick,
            "seeds": 1 if quick else seeds,
            "runs": len(results),
            "fault_runs": sum(not r["run"]["healthy"] for r in results),
            "healthy_scenarios": sorted({r["scenario"] for r in results if r["run"]["healthy"]}),
            "interval_s": 5.0,
            "simulated_hours": round(sum(r["simulated_s"] for r in results) / 3600.0, 2),
            "wall_s": round(wall, 1),
            "workers": workers,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "not_evaluated_in_process": results[0].get("not_in_process", []) if results else [],
        },
        "targets": TARGETS,
        "summary": summarize(results),
        "cold_start": summarize(cold_results, by="scenario") if cold_results else None,
        "real_signal": real_rows,
        "public_readings": readings,
        "notes": NOTES if notes is None else notes,
        "runs": results,
        "cold_start_runs": cold_results,
    }
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "faults.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
        (out / "faults.md").write_text(markdown(doc))
    return doc

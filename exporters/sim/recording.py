"""The recording writer: the directory format of docs/contracts.md."""

from __future__ import annotations

import csv
import gzip
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from catalogue import recording
from exporters.sim.dcgm import FIELD_NAMES, OFF_BUS_FIELDS
from exporters.sim.logs import LogSink
from exporters.sim.runner import Simulation
from exporters.sim.scenario import Scenario, load_scenario

FORMAT = recording.FORMAT
JOB_COLUMNS = list(recording.JOB_METRICS)


@dataclass
class Recording:
    """A written recording: its directory, meta and ground truth."""

    path: Path
    meta: dict[str, Any]
    truth: dict[str, Any]

    def gpu_frame(self) -> Any:
        import pandas as pd

        return pd.read_csv(self.path / "gpu_metrics.csv.gz", dtype={"job_id": str})

    def job_frame(self) -> Any:
        import pandas as pd

        return pd.read_csv(self.path / "job_metrics.csv.gz", dtype={"job_id": str})


def _num(v: float) -> str:
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return "nan" if math.isnan(v) else ""
    if not isinstance(v, float):
        return str(v)
    # six significant digits for readings; timestamps (and other large values) keep milliseconds
    return f"{v:.3f}" if abs(v) >= 1e6 else f"{v:.6g}"


class RecordingWriter:
    """Streams samples to the two CSV files; `close` writes meta.json and truth.json."""

    def __init__(self, out: Path) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self._gf = gzip.open(out / "gpu_metrics.csv.gz", "wt", newline="")
        self._jf = gzip.open(out / "job_metrics.csv.gz", "wt", newline="")
        self._g = csv.writer(self._gf)
        self._j = csv.writer(self._jf)
        self._g.writerow(["timestamp", "node", "gpu", "job_id", "modelName", *FIELD_NAMES])
        self._j.writerow(["timestamp", "job_id", *JOB_COLUMNS])

    def sample(self, sim: Simulation) -> None:
        c = sim.cluster
        ts = f"{c.now:.3f}"
        for node in c.nodes.values():
            if not node.alive:
                continue  # a dead node's exporter does not answer
            for g in node.gpus:
                vals = [
                    ("" if g.off_bus and i not in OFF_BUS_FIELDS else _num(v))
                    for i, v in enumerate(g.values)
                ]
                self._g.writerow([ts, node.name, g.index, g.job_id, g.model_name, *vals])
        for job in c.jobs.values():
            if job.state != "RUNNING":
                continue
            progress = job.last_progress_t
            thr = job.global_batch / job.step_s if job.step_s and not job.stall else 0.0
            self._j.writerow(
                [
                    ts,
                    job.job_id,
                    job.logged_iter,
                    _num(progress) if progress else "",
                    _num(job.step_s) if job.step_s else "",
                    _num(thr),
                    _num(job.loss_logged),
                    job.nans,
                    job.skipped,
                    _num(job.last_ckpt_t) if job.last_ckpt_t else "",
                    _num(job.last_pause_t) if job.last_pause_t else "",
                ]
            )

    def close(self, sim: Simulation, scenario_name: str, interval_s: float) -> Recording:
        self._gf.close()
        self._jf.close()
        c = sim.cluster
        meta = {
            "format": FORMAT,
            "scenario": scenario_name,
            "seed": sim.seed,
            "start": c.start,
            "end": c.now,
            "interval_s": interval_s,
            "nodes": list(c.nodes),
            "gpus_per_node": c.gpus_per_node,
            "jobs": [
                {
                    "job_id": j.job_id,
                    "name": j.name,
                    "nodes": _all_nodes(j),
                    "start": j.start_t or None,
                    "end": j.end_t or None,
                    "state": j.state,
                    "exit_code": j.exit_code,
                    "restarts": j.restarts,
                }
                for j in c.jobs.values()
            ],
        }
        faults = [{k: v for k, v in f.items() if k != "active"} for f in c.faults.values()]
        truth = {
            "scenario": scenario_name,
            "expect": sim.scenario.expect or ("healthy" if not faults else "faults"),
            "faults": faults,
            "errors": sim.errors,
        }
        (self.out / "meta.json").write_text(json.dumps(meta, indent=2))
        (self.out / "truth.json").write_text(json.dumps(truth, indent=2))
        return Recording(self.out, meta, truth)


def _all_nodes(job: Any) -> list[str]:
    return list(job.ever_nodes)


def record(scenario: Scenario | str | Path, out: str | Path, seed: int | None = None) -> Recording:
    """Run a scenario accelerated in-process and write it as a recording under `out`."""
    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    out = Path(out)
    sink = LogSink(out / "logs")
    (out / "logs" / "jobs").mkdir(parents=True, exist_ok=True)
    (out / "logs" / "kernel").mkdir(parents=True, exist_ok=True)
    sim = Simulation(sc, seed=seed, sink=sink)
    writer = RecordingWriter(out)
    writer.sample(sim)
    steps = int(round(sc.duration_s / sc.interval_s))
    for _ in range(steps):
        sim.step(sc.interval_s)
        writer.sample(sim)
    sink.close()
    return writer.close(sim, sc.name, sc.interval_s)


def run_scenario(
    scenario: Scenario | str | Path, seed: int | None = None, out: str | Path | None = None
) -> Recording:
    """The in-process entry point: run and record (into a temporary directory if no `out`)."""
    if out is None:
        import tempfile

        out = tempfile.mkdtemp(prefix="goodput-rec-")
    return record(scenario, out, seed)

"""Threshold tuning over recordings: score, fire the alert conditions, sweep, write back.

The alert conditions come from the one source (`alertmanager/alerts.yaml`, through
`alertdsl`), so a sweep measures what production would alert on: the detector's scores
become the `goodput_*_score` series the rules read, `alertdsl.evaluation.evaluate` fires them with
a candidate threshold and `for`, firings become incidents (one per job while it keeps firing),
and incidents are matched against the recording's ground truth.

This module scores recordings and fires candidate alerts over them; `detector.tuning_sweep`
sweeps and chooses, `detector.tuning_write` writes the choice back into alerts.yaml.

>>> import pandas as pd
>>> fired = pd.DataFrame({"timestamp": [0, 5, 10, 100], "job_id": ["1"] * 4})
>>> incidents(fired, gap_s=30).start.tolist()
[0.0, 100.0]
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from alertdsl import evaluation as E
from alertdsl import spec as A
from detector.frame import Frame
from detector.pipeline import Config, Engine
from detector.replay import load, steps

JOB_SCORE = "goodput_job_anomaly_score"
NODE_SCORE = "goodput_node_suspect_score"
GPU_SCORE = "goodput_gpu_anomaly_score"
SCORE_METRICS = (JOB_SCORE, NODE_SCORE, GPU_SCORE)
ALERTS_ENV = A.PATH_ENV
alerts_path = A.configured_path  # `$GOODPUT_ALERTS_FILE`, else the project's alerts.yaml


# ------------------------------------------------------------------------------ scoring


@dataclass
class Run:
    """One recording scored by the engine: score series as Prometheus would hold them."""

    name: str
    path: Path
    meta: dict[str, Any]
    truth: dict[str, Any]
    frame: Frame
    jobs: pd.DataFrame  # timestamp, job_id, detector, goodput_job_anomaly_score
    nodes: pd.DataFrame  # timestamp, job_id, node, goodput_node_suspect_score
    gpus: pd.DataFrame  # timestamp, job_id, node, gpu, detector, goodput_gpu_anomaly_score
    interval_s: float

    @property
    def gpu_hours(self) -> float:
        """GPU-hours of running jobs in the recording (rows with a job x interval)."""
        return float((self.frame.job != "").sum() * self.interval_s / 3600.0)

    @cached_property
    def gpu_combined(self) -> pd.DataFrame:
        """The GPU score as the service exposes it: one series per GPU, the max over
        detectors (detector/exposition.py); `gpus` keeps each detector for the plots."""
        keys = ["timestamp", "job_id", "node", "gpu"]
        if "detector" not in self.gpus.columns:
            return self.gpus
        return self.gpus.groupby(keys, sort=False)[GPU_SCORE].max().reset_index()

    def series(self, metric: str) -> pd.DataFrame:
        return {JOB_SCORE: self.jobs, NODE_SCORE: self.nodes, GPU_SCORE: self.gpu_combined}[metric]

    def windows(self) -> pd.DataFrame:
        return fault_windows(self.meta, self.truth)


def score_recording(path: str | Path, cfg: Config | None = None) -> Run:
    """Replay the detector engine over a recording directory and keep every score."""
    p = Path(path)
    frame, names, interval = load(p)
    meta = _read_json(p / "meta.json")
    truth = _read_json(p / "truth.json")
    if cfg is None:
        cfg = Config(interval_s=interval or Config().interval_s)
    engine = Engine(cfg)
    jobs, nodes, gpus = [], [], []
    for sub, now, res in steps(frame, names, engine):
        jobs.append(res.jobs.assign(timestamp=now))
        nodes.append(res.nodes.assign(timestamp=now))
        on = sub.job != ""
        if on.any():
            g = pd.DataFrame(res.gpu[on], columns=list(res.detectors))
            g["job_id"], g["node"], g["gpu"] = sub.job[on], sub.node[on], sub.gpu[on].astype(str)
            gpus.append(g.assign(timestamp=now))
    job_df = _concat(jobs, ["timestamp", "job_id", "detector", "score"])
    node_df = _concat(nodes, ["timestamp", "job_id", "node", "score"])
    gpu_df = _concat(gpus, ["timestamp", "job_id", "node", "gpu"])
    gpu_long = gpu_df.melt(
        id_vars=["timestamp", "job_id", "node", "gpu"], var_name="detector", value_name="score"
    )
    return Run(
        name=str(meta.get("scenario") or p.name),
        path=p,
        meta=meta,
        truth=truth,
        frame=frame,
        jobs=job_df[["timestamp", "job_id", "detector", "score"]].rename(
            columns={"score": JOB_SCORE}
        ),
        nodes=node_df[["timestamp", "job_id", "node", "score"]].rename(
            columns={"score": NODE_SCORE}
        ),
        gpus=gpu_long.rename(columns={"score": GPU_SCORE}),
        interval_s=float(cfg.interval_s),
    )


def _concat(parts: list[pd.DataFrame], cols: list[str]) -> pd.DataFrame:
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)


def _read_json(p: Path) -> dict[str, Any]:
    if not p.exists():
        return {}
    doc = json.loads(p.read_text())
    if not isinstance(doc, dict):
        raise ValueError(f"{p}: expected a JSON object")
    return doc


def fault_windows(meta: dict[str, Any], truth: dict[str, Any]) -> pd.DataFrame:
    """One row per (fault, job): onset, end (the job's end, else the recording's), kind,
    culprit nodes. A fault lasts until its job ends: what follows onset is not a false alarm."""
    ends = {str(j["job_id"]): j.get("end") for j in meta.get("jobs", [])}
    rec_end = float(meta.get("end") or np.inf)
    rows = []
    for f in truth.get("faults", []):
        for job in f.get("job_ids") or ([f["job_id"]] if f.get("job_id") else []):
            end = ends.get(str(job))
            rows.append(
                {
                    "fault_id": f.get("fault_id", ""),
                    "kind": f["kind"],
                    "job_id": str(job),
                    "onset": float(f["onset"]),
                    "end": float(end) if end else rec_end,
                    "nodes": tuple(f.get("nodes") or ()),
                    "outcome": f.get("outcome", ""),
                }
            )
    cols = ["fault_id", "kind", "job_id", "onset", "end", "nodes", "outcome"]
    return pd.DataFrame(rows, columns=cols)


# ------------------------------------------------------------------------------ alerts


def score_condition(alert: A.Alert) -> A.Condition:
    """The alert's condition on a detector score (the one a threshold sweep moves)."""
    for c in alert.conditions:
        if c.kind == "threshold" and c.metric in SCORE_METRICS and c.threshold is not None:
            return c
    raise A.AlertsError(f"alert {alert.name} has no threshold condition on a detector score")


def with_threshold(alert: A.Alert, threshold: float, for_: str | None = None) -> A.Alert:
    """A copy of `alert` whose score condition uses `threshold` (and the alert `for_`)."""
    cond = score_condition(alert)
    new = dataclasses.replace(cond, threshold=float(threshold))
    conds = tuple(new if c is cond else c for c in alert.conditions)
    return dataclasses.replace(alert, conditions=conds, for_=for_ or alert.for_)


def fire(run: Run, alert: A.Alert) -> pd.DataFrame:
    """Where `alert` fires over the run's score series (alertdsl.evaluation.evaluate)."""
    cond = score_condition(alert)
    series = run.series(cond.metric)
    if cond.op in (">", ">=") and len(series):  # a series that never crosses cannot fire
        labels = [c for c in series.columns if c not in ("timestamp", cond.metric)]
        peak = series.groupby(labels, sort=False)[cond.metric].transform("max")
        series = series[A.OPS[cond.op](peak, cond.threshold)]
    return E.evaluate(alert, series)


def incidents(fired: pd.DataFrame, gap_s: float = 30.0) -> pd.DataFrame:
    """Firing rows -> incidents per job: a new incident after `gap_s` without firing."""
    cols = ["job_id", "start", "end"]
    if fired.empty:
        return pd.DataFrame(columns=cols)
    out = []
    for job, g in fired.groupby("job_id", sort=True):
        t = np.unique(g["timestamp"].to_numpy(dtype=float))
        cut = np.flatnonzero(np.diff(t) > gap_s) + 1
        for seg in np.split(t, cut):
            out.append({"job_id": str(job), "start": float(seg[0]), "end": float(seg[-1])})
    return pd.DataFrame(out, columns=cols)


def match(inc: pd.DataFrame, windows: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """(per-fault detection with latency_s, number of false incidents).

    A fault is detected by the first incident of its job that starts in [onset, end]; an
    incident is false when no fault window of its job contains its start."""
    det = windows.copy()
    det["latency_s"] = np.nan
    false = 0
    for row in inc.itertuples():
        w = windows[(windows.job_id == row.job_id)]
        inside = (w.onset <= row.start) & (row.start <= w.end)
        if not inside.any():
            false += 1
    for i, w in windows.iterrows():
        hit = inc[(inc.job_id == w.job_id) & (inc.start >= w.onset) & (inc.start <= w.end)]
        if len(hit):
            det.loc[i, "latency_s"] = float(hit.start.min() - w.onset)
    det["detected"] = det["latency_s"].notna()
    return det, false


# ------------------------------------------------------------------------------ over recordings


def evaluate_runs(
    runs: Sequence[Run], alerts: A.Alert | Sequence[A.Alert], gap_s: float = 30.0
) -> tuple[pd.DataFrame, int, float]:
    """(per-fault detections over all runs, false incidents, GPU-hours) for one alert, or for
    several together: their firings merge into one incident per job, as the receiver groups
    them, so a fault's latency is that of the first of them to fire."""
    group = [alerts] if isinstance(alerts, A.Alert) else list(alerts)
    dets, false, hours = [], 0, 0.0
    for run in runs:
        fired = [f for f in (fire(run, a) for a in group) if len(f)]
        inc = incidents(pd.concat(fired, ignore_index=True) if fired else pd.DataFrame(), gap_s)
        d, f = match(inc, run.windows())
        dets.append(d.assign(run=run.name))
        false += f
        hours += run.gpu_hours
    det = pd.concat(dets, ignore_index=True) if dets else pd.DataFrame()
    return det, false, hours


def score_alerts(spec: A.Spec) -> list[A.Alert]:
    """The alerts of `spec` that read a detector score (the ones a sweep can tune)."""
    out = []
    for a in spec.alerts:
        try:
            score_condition(a)
        except A.AlertsError:
            continue
        out.append(a)
    return out

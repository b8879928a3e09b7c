"""Offline replay: the service's engine over a recording, detections as JSON lines, and a
report of what each detector could see per job (`coverage`).

Inputs: a recording directory (docs/contracts.md), or a CSV/Parquet/Prometheus JSON file of
GPU samples with any column spelling of catalogue/columns.yaml (`detector.samples`).
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd

from catalogue.columns import columns
from catalogue.recording import gzip_checked, read_meta
from detector import fields as F
from detector import samples
from detector.baselines import BaselineStore
from detector.coverage import Coverage
from detector.frame import ALIASES, Frame, FrameError, join_progress
from detector.pipeline import Config, Engine, Result
from detector.thresholds import ALERT_OF, level

# (job log path, job_id, sample times) -> job_metrics rows: the log parser, passed in by the
# caller (goodput replay) since the detector does not import the exporters.
Derive = Callable[[Path, str, list[float]], list[dict[str, Any]]]


@dataclass
class Loaded:
    frame: Frame
    names: dict[str, str]  # job_id -> job name
    interval: float | None
    notes: list[str] = field(default_factory=list)  # what was read, derived or missing


def load(path: str | Path) -> tuple[Frame, dict[str, str], float | None]:
    """(frame, job_id -> job name, sample interval) from any supported input."""
    got = read(path)
    return got.frame, got.names, got.interval


def read(path: str | Path, derive: Derive | None = None) -> Loaded:
    """Any supported input, with notes on what was read as what. A recording without
    job_metrics.csv.gz gets its job metrics from logs/jobs/ through `derive` when given."""
    p = Path(path)
    if p.is_dir():
        return _read_dir(p, derive)
    got = samples.read(p)  # (its repeated samples already reduced: `samples.normalise`)
    gpu = join_progress(got.gpu, got.jobs) if got.jobs is not None else got.gpu
    if got.jobs is None:
        got.notes.append("no job metrics in the file: the progress detector has no input")
    return Loaded(Frame.from_dataframe(gpu), {}, None, got.notes)


def _read_dir(p: Path, derive: Derive | None) -> Loaded:
    try:
        meta = read_meta(p)
    except ValueError as exc:
        raise FrameError(str(exc)) from None
    gpu_path = next(
        (q for q in (p / "gpu_metrics.csv.gz", p / "gpu_metrics.csv") if q.exists()), None
    )
    if gpu_path is None:
        raise FrameError(f"{p}: no gpu_metrics.csv.gz (is it a recording? see goodput import)")
    gpu = _csv(gpu_path, {"job_id": str, "node": str}, ("timestamp", "node", "gpu"))
    notes = [f"metrics: {gpu_path.name} ({len(gpu)} rows)"]
    gpu = _once(gpu, gpu_path, notes)
    job_path = next(
        (q for q in (p / "job_metrics.csv.gz", p / "job_metrics.csv") if q.exists()), None
    )
    if job_path is not None:
        gpu = join_progress(gpu, _csv(job_path, {"job_id": str}, ("timestamp", "job_id")))
        notes.append(f"job metrics: {job_path.name}")
    else:
        gpu = _derived(p, gpu, derive, notes)
    names = {str(j["job_id"]): str(j.get("name", j["job_id"])) for j in meta.get("jobs", [])}
    interval = meta.get("interval_s")
    return Loaded(Frame.from_dataframe(gpu), names, float(interval) if interval else None, notes)


def _csv(path: Path, dtype: dict[str, Any], keys: tuple[str, ...]) -> pd.DataFrame:
    """A recording's CSV (gzipped when named .gz), its columns under the names the frame
    accepts (`frame.ALIASES`: `time`, `Hostname`, ...); a FrameError naming it when it is
    damaged, empty or without one of the columns `keys`."""
    with gzip_checked(path, FrameError):
        try:
            df = pd.read_csv(path, dtype=dtype)
        except pd.errors.EmptyDataError:
            raise FrameError(f"{path}: empty (want a CSV with a header line)") from None
        except ValueError as exc:  # pandas' parser errors, text that is no UTF-8
            raise FrameError(f"{path}: cannot read: {exc}") from None
    names = {c: "timestamp" if a == "time" else a for c, a in ALIASES.items() if c in df}
    df = df.rename(columns={c: a for c, a in names.items() if a not in df or c == a})
    if missing := [k for k in keys if k not in df]:
        raise FrameError(f"{path}: no {missing[0]} column")
    return df


def _once(gpu: pd.DataFrame, path: Path, notes: list[str]) -> pd.DataFrame:
    """`gpu` with each (timestamp, node, gpu) once (`samples.merge_repeats`), noted."""
    gpu, merged = samples.merge_repeats(gpu, str(path))
    notes += [f"{path.name}: {note}" for _, note in merged]
    return gpu


def _derived(p: Path, gpu: pd.DataFrame, derive: Derive | None, notes: list[str]):
    jobs = sorted({str(j) for j in gpu.get("job_id", pd.Series(dtype=str)).dropna() if j})
    rows: list[dict[str, Any]] = []
    for job in jobs:
        log = p / "logs" / "jobs" / f"slurm-{job}.out"
        if not log.is_file():
            notes.append(
                f"job {job}: no job_metrics.csv.gz and no logs/jobs/{log.name}: "
                "the progress detector has no input"
            )
        elif derive is None:
            notes.append(f"job {job}: no job_metrics.csv.gz; logs/jobs/{log.name} not parsed")
        else:
            times = sorted(set(gpu.loc[gpu.job_id == job, "timestamp"].astype(float)))
            got = derive(log, job, times)
            rows += got
            notes.append(
                f"job {job}: no job_metrics.csv.gz: job metrics derived from "
                f"logs/jobs/{log.name} ({len(got)} samples)"
            )
    return join_progress(gpu, pd.DataFrame(rows)) if rows else gpu


def on_one_grid(frame: Frame, interval: float | None) -> tuple[Frame, float | None, str | None]:
    """(frame, sample interval, note): where the GPUs do not share their timestamps (per-node
    nvidia-smi or NVML logs, whose clocks never line up), every sample moved to the nearest
    point of one grid from the first sample, a GPU's latest sample at a point kept, so that
    each instant holds every GPU and the peer and job-wide detectors compare them. The step is
    `interval`, else the median gap between a GPU's consecutive samples. Input already on one
    grid (recordings, Prometheus answers) comes back as it is."""
    if len(frame) < 2:
        return frame, interval, None
    step = interval or samples.gpu_interval(frame.time, frame.node, frame.gpu)
    times = np.unique(frame.time)
    if not step or len(times) <= 1.5 * ((times[-1] - times[0]) / step + 1):
        return frame, step, None
    snapped = times[0] + np.round((frame.time - times[0]) / step) * step
    rows = pd.DataFrame(
        {"t": snapped, "node": frame.node, "gpu": frame.gpu, "at": frame.time}
    ).sort_values(["t", "node", "gpu", "at"], kind="stable")
    idx = rows.drop_duplicates(["t", "node", "gpu"], keep="last").index.to_numpy()
    kept = frame.take(idx)
    out = Frame(snapped[idx], kept.job, kept.node, kept.gpu, kept.values, kept.fields, kept.model)
    note = (
        f"the GPUs' timestamps do not line up ({len(times)} distinct times): samples moved to "
        f"the nearest point of a {step:g} s grid ({len(frame) - len(idx)} rows merged)"
    )
    return out, step, note


def steps(
    frame: Frame, names: dict[str, str], engine: Engine
) -> Iterator[tuple[Frame, float, Result]]:
    """Step `engine` through `frame` one instant at a time: (rows, time, result) each."""
    for rows in frame.instants():
        sub = frame.take(rows)
        now = float(sub.time[0])
        yield sub, now, engine.step(sub, now, names)


def _why(kind: str, score: float, text: str) -> str:
    lvl = level(kind)
    mark = f" >= alert level {lvl:g} ({ALERT_OF[kind]})" if score >= lvl else ""
    return text + mark


def detections(
    result: Result, engine_dets: dict, min_score: float | None = None
) -> Iterator[dict[str, Any]]:
    """JSON-ready detections of one cycle. Written: scores at or above `min_score`, or, when
    None, at or above each score's alert level from alerts.yaml (`detector.thresholds`)."""
    t = float(result.frame.time[0]) if len(result.frame) else None

    def floor(kind: str) -> float:
        return level(kind) if min_score is None else min_score

    for r in result.jobs.itertuples():
        kind = r.detector if r.detector in ("progress", "pace") else "job"
        if r.score >= floor(kind):
            yield {
                "time": t,
                "job_id": r.job_id,
                "node": None,
                "gpu": None,
                "detector": r.detector,
                "score": round(float(r.score), 4),
                "reason": _why(kind, r.score, f"job score ({r.detector})"),
            }
    for r in result.nodes[result.nodes.score >= floor("node")].itertuples():
        yield {
            "time": t,
            "job_id": r.job_id,
            "node": r.node,
            "gpu": None,
            "detector": "node_suspect",
            "score": round(float(r.score), 4),
            "reason": _why("node", r.score, "suspect node (peer, shift, hardware, missing)"),
        }
    for r in result.missing.itertuples() if len(result.missing) else ():
        yield {
            "time": t,
            "job_id": r.job_id,
            "node": r.node,
            "gpu": int(r.gpu),
            "detector": "missing",
            "score": 2.0,
            "reason": f"no metrics since {r.since:.0f} while the job runs",
        }
    for d, name in enumerate(result.detectors):
        rows = np.flatnonzero(result.gpu[:, d] >= floor("gpu"))
        if not len(rows):
            continue
        reasons = engine_dets[name].explain(result.frame, rows)
        for i, reason in zip(rows, reasons, strict=True):
            yield {
                "time": t,
                "job_id": result.frame.job[i],
                "node": result.frame.node[i],
                "gpu": int(result.frame.gpu[i]),
                "detector": name,
                "score": round(float(result.gpu[i, d]), 4),
                "reason": _why("gpu", result.gpu[i, d], reason),
            }


def replay(
    src: str | Path,
    out: IO[str],
    min_score: float | None = None,
    cfg: Config | None = None,
    store: BaselineStore | None = None,
    derive: Derive | None = None,
    top: int = 10,
    job: str | None = None,
) -> dict[str, Any]:
    """Replay `src`, write detections to `out` (see `detections` for `min_score`); returns a
    summary with, per job, what each detector could see (`detector.coverage`) and the `top`
    detections. `store` loads baselines by job name and saves the ones fitted. `job`: one the
    caller wants, a ValueError naming the recording's jobs before the replay when absent."""
    if min_score is not None and not (math.isfinite(min_score) and min_score >= 0):
        raise ValueError(f"min_score must be a number >= 0, not {min_score!r}")
    got = read(src, derive)
    ids = sorted(str(j) for j in got.frame.job_codes[1] if j)
    if not ids:  # the detectors score jobs: a run over none would look like a healthy one
        raise FrameError(
            f"{src}: no row names a job (accepted job columns: {columns().accepted('job_id')}); "
            "a file without one goes through `goodput import --node NAME --job-id ID` first"
        )
    if job is not None and job not in ids:
        raise ValueError(f"no job {job} in the recording; jobs: {ids}")
    frame, step, note = on_one_grid(got.frame, got.interval)
    if note:
        got.notes.append(note)
    if cfg is None:
        cfg = Config()
        cfg.interval_s = step or cfg.interval_s
    engine = Engine(cfg, store=store)
    cov = Coverage()
    count = 0
    best: dict[str, list[tuple[float, int, dict[str, Any]]]] = {}
    for sub, now, res in steps(frame, got.names, engine):
        cov.observe(sub, now, res, engine)
        for det in detections(res, engine.det, min_score):
            out.write(json.dumps(det) + "\n")
            count += 1
            heap = best.setdefault(str(det["job_id"]), [])
            item = (float(det["score"]), -count, det)
            (heapq.heappush if len(heap) < top else heapq.heappushpop)(heap, item)
    jobs = cov.report(engine)
    for job, doc in jobs.items():
        doc["top_detections"] = [d for _, _, d in sorted(best.get(job, []), reverse=True)]
    return {
        "rows": len(frame),
        "instants": len(frame.instants()),
        "interval_s": cfg.interval_s,
        "detections": count,
        "min_score": min_score,
        "peak_job_score": {j: d["peak"]["score"] for j, d in jobs.items()},
        "fields_present": _present(frame),
        "inputs": got.notes,
        "baseline_errors": list(store.errors) if store is not None else [],
        "jobs": jobs,
    }


def _present(frame: Frame) -> list[str]:
    return [f for f in F.ALL_FIELDS if np.isfinite(frame.col(f)).any()]

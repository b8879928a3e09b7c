"""Offline replay: the service's engine over a recording, detections as JSON lines.

Inputs: a recording directory (docs/contracts.md), a wide CSV/Parquet with DCGM field names
and a timestamp column (plus Hostname/hostname, gpu, hpc_job), or a Prometheus range-query
JSON (`/api/v1/query_range` answer, or a list of such answers).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd

from detector import fields as F
from detector.frame import Frame, FrameError, join_progress
from detector.pipeline import Config, Engine, Result
from detector.thresholds import ALERT_OF, level


def load(path: str | Path) -> tuple[Frame, dict[str, str], float | None]:
    """(frame, job_id -> job name, sample interval) from any supported input."""
    p = Path(path)
    if p.is_dir():
        return _load_dir(p)
    if not p.exists():
        raise FrameError(f"{p}: no such file or directory")
    name = p.name.lower()
    if name.endswith(".json"):
        return Frame.from_dataframe(_prom_json(json.loads(p.read_text()))), {}, None
    if name.endswith(".parquet"):
        return Frame.from_dataframe(pd.read_parquet(p)), {}, None
    if name.endswith((".csv", ".csv.gz")):
        return Frame.from_dataframe(pd.read_csv(p, dtype={"hpc_job": str, "job_id": str})), {}, None
    raise FrameError(f"{p}: want a recording directory, .csv[.gz], .parquet or .json")


def _load_dir(p: Path) -> tuple[Frame, dict[str, str], float | None]:
    meta_path = p / "meta.json"
    meta: dict[str, Any] = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    if meta and not str(meta.get("format", "")).startswith("goodput-recording/"):
        raise FrameError(f"{meta_path}: unknown format {meta.get('format')!r}")
    gpu_path = next(
        (q for q in (p / "gpu_metrics.csv.gz", p / "gpu_metrics.csv") if q.exists()), None
    )
    if gpu_path is None:
        raise FrameError(f"{p}: no gpu_metrics.csv.gz")
    gpu = pd.read_csv(gpu_path, dtype={"job_id": str, "node": str})
    job_path = next(
        (q for q in (p / "job_metrics.csv.gz", p / "job_metrics.csv") if q.exists()), None
    )
    if job_path is not None:
        gpu = join_progress(gpu, pd.read_csv(job_path, dtype={"job_id": str}))
    names = {str(j["job_id"]): str(j.get("name", j["job_id"])) for j in meta.get("jobs", [])}
    interval = meta.get("interval_s")
    return Frame.from_dataframe(gpu), names, float(interval) if interval else None


def _prom_json(doc: Any) -> pd.DataFrame:
    docs = doc if isinstance(doc, list) else [doc]
    gpu_rows: list[dict[str, Any]] = []
    job_rows: list[dict[str, Any]] = []
    for d in docs:
        if not isinstance(d, dict) or d.get("status") != "success":
            raise FrameError("not a Prometheus query_range answer (status != success)")
        for series in d["data"]["result"]:
            m = series["metric"]
            name = m.get("__name__", "")
            for t, v in series.get("values", [series.get("value")] if "value" in series else []):
                if name.startswith("goodput_job_"):
                    job_rows.append(
                        {"time": float(t), "job_id": m.get("job_id", ""), name: float(v)}
                    )
                else:
                    gpu_rows.append(
                        {
                            "time": float(t),
                            "node": m.get("Hostname", m.get("hostname", "")),
                            "gpu": m.get("gpu"),
                            "job_id": m.get("hpc_job", ""),
                            name: float(v),
                        }
                    )
    if not gpu_rows:
        raise FrameError("the Prometheus answer holds no DCGM series")
    keys = ["time", "node", "gpu", "job_id"]
    wide = pd.DataFrame(gpu_rows).groupby(keys, dropna=False).first().reset_index()
    if job_rows:
        jobs = pd.DataFrame(job_rows).groupby(["time", "job_id"]).first().reset_index()
        wide = join_progress(wide, jobs)
    return wide


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
        kind = "progress" if r.detector == "progress" else "job"
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
    src: str | Path, out: IO[str], min_score: float | None = None, cfg: Config | None = None
) -> dict[str, Any]:
    """Replay `src`, write detections to `out` (see `detections` for `min_score`)."""
    frame, names, interval = load(src)
    if cfg is None:
        cfg = Config()
        if interval:
            cfg.interval_s = interval
        elif len(frame) > 1:
            diffs = np.diff(np.unique(frame.time))
            cfg.interval_s = float(np.median(diffs)) if len(diffs) else cfg.interval_s
    engine = Engine(cfg)
    count = 0
    peak: dict[str, float] = {}
    for _, _, res in steps(frame, names, engine):
        comb = res.jobs[res.jobs.detector == "combined"]
        for j, s in zip(comb.job_id, comb.score, strict=True):
            peak[j] = max(peak.get(j, 0.0), float(s))
        for det in detections(res, engine.det, min_score):
            out.write(json.dumps(det) + "\n")
            count += 1
    return {
        "rows": len(frame),
        "instants": len(frame.instants()),
        "detections": count,
        "peak_job_score": peak,
        "fields_present": _present(frame),
    }


def _present(frame: Frame) -> list[str]:
    return [f for f in F.ALL_FIELDS if np.isfinite(frame.col(f)).any()]

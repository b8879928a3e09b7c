"""How a job's baseline is learned and carried across requeues (for the baselines notebook).

A requeued job keeps its name, and baselines are stored per name (`BaselineStore`). Each
*session* here is one run of the job (a recording) replayed by a fresh `Engine` that shares the
store, which is what the detector service does when the job disappears and comes back: the
first session learns from scratch, later ones start from the stored baseline and refit it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from detector import fields as F
from detector.baselines import BaselineStore
from detector.pipeline import Config, Engine
from detector.replay import load

# dcgm-exporter's units for the gauges the baseline holds.
UNITS = {
    "DCGM_FI_DEV_GPU_UTIL": "%",
    "DCGM_FI_DEV_POWER_USAGE": "W",
    "DCGM_FI_DEV_SM_CLOCK": "MHz",
    "DCGM_FI_DEV_MEM_CLOCK": "MHz",
    "DCGM_FI_DEV_GPU_TEMP": "°C",
    "DCGM_FI_DEV_MEMORY_TEMP": "°C",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "%",
    "DCGM_FI_DEV_FB_USED": "MiB",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "ratio",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "ratio",
    "DCGM_FI_PROF_DRAM_ACTIVE": "ratio",
    "DCGM_FI_PROF_SM_ACTIVE": "ratio",
}


@dataclass
class Session:
    """One run of the job: when its baseline became usable, its scores, the stored baseline."""

    index: int
    job_id: str
    job_name: str
    start: float
    loaded: bool  # began with a stored baseline
    fitted_at: list[float]  # times a baseline was (re)fitted or loaded in this session
    scores: pd.DataFrame  # timestamp, detector, score (the job's scores per cycle)
    stored: dict[str, Any] | None  # the store's document after the session


def replay_sessions(
    recordings: list[str | Path], job_name: str, store_dir: str | Path, cfg: Config | None = None
) -> list[Session]:
    """Replay each recording as one session of `job_name`, sharing one baseline store."""
    store = BaselineStore(store_dir)
    out = []
    for i, rec in enumerate(recordings):
        frame, names, interval = load(rec)
        ids = [j for j, n in names.items() if n == job_name]
        if not ids:
            raise ValueError(f"{rec}: no job named {job_name!r} (have {sorted(names.values())})")
        c = dataclasses.replace(cfg or Config())
        if interval:
            c.interval_s = float(interval)
        engine = Engine(c, store=store)
        fitted: list[float] = []
        rows = []
        last_fit = None
        for idx in frame.instants():
            sub = frame.take(idx)
            now = float(sub.time[0])
            res = engine.step(sub, now, names)
            info = engine.base.jobs.get(ids[0])
            if info is not None and info.fitted_at != last_fit and info.fitted_at is not None:
                fitted.append(info.fitted_at)
                last_fit = info.fitted_at
            j = res.jobs[res.jobs.job_id == ids[0]]
            rows.append(j[["detector", "score"]].assign(timestamp=now))
        info = engine.base.jobs.get(ids[0])
        scores = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()
        out.append(
            Session(
                index=i + 1,
                job_id=ids[0],
                job_name=job_name,
                start=float(frame.time[0]) if len(frame) else 0.0,
                loaded=bool(info and info.loaded),
                fitted_at=fitted,
                scores=scores,
                stored=_doc(store, job_name),
            )
        )
    return out


def _doc(store: BaselineStore, name: str) -> dict[str, Any] | None:
    p = store.path(name)
    return json.loads(p.read_text()) if p.exists() else None


def baseline_table(doc: dict[str, Any] | None, session: int | str = "") -> pd.DataFrame:
    """The deviation detector's stored baseline as rows: field, unit, busy/idle median and
    scale (one robust sigma, floors applied)."""
    cols = ["session", "field", "unit", "busy_median", "busy_scale", "idle_median", "idle_scale"]
    if not doc:
        return pd.DataFrame(columns=cols)
    st = doc.get("detectors", {}).get("deviation")
    if not st:
        return pd.DataFrame(columns=cols)

    def arr(key: str) -> np.ndarray:
        return np.array([np.nan if v is None else v for v in st[key]], dtype=float)

    return pd.DataFrame(
        {
            "session": session,
            "field": list(F.GAUGE_NAMES),
            "unit": [UNITS.get(f, "") for f in F.GAUGE_NAMES],
            "busy_median": arr("busy_med_"),
            "busy_scale": arr("busy_scale_"),
            "idle_median": arr("idle_med_"),
            "idle_scale": arr("idle_scale_"),
        },
        columns=cols,
    )

"""What each detector could see during a replay, per job: which ran and why not, the baseline's
fitted-at time, and the peak of each detector with where and when it was reached.

A blind run must not look like a healthy one: a job seen for less than the first fit has no
baseline (deviation and shift cannot score), a one-node job has no node to compare with
(shift), fewer GPUs than `PeerComparison.min_peers` have no peers, a job without job metrics
gives the progress detector nothing, and an input without XID or error-counter fields gives
the hardware detector nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from catalogue import priors as P
from detector import fields as F
from detector.frame import Frame
from detector.peer import PeerComparison
from detector.physics import Physics
from detector.pipeline import Engine, Result
from detector.progress import Progress

HARDWARE_FIELDS = (F.XID_FIELD, *F.COUNTERS)
BASELINE = ("deviation", "shift", "multivariate", "pace")
SM = "DCGM_FI_PROF_SM_ACTIVE"


@dataclass
class Peak:
    score: float = 0.0
    time: float | None = None
    node: str | None = None
    gpu: int | None = None

    def doc(self) -> dict[str, Any]:
        return {
            "score": round(self.score, 4),
            "time": self.time,
            "node": self.node,
            "gpu": self.gpu,
        }


@dataclass
class JobSeen:
    first: float
    last: float
    nodes: set[str] = field(default_factory=set)
    gpus: set[tuple[str, int]] = field(default_factory=set)
    most_gpus: int = 0  # most GPUs of the job at one instant
    progress: bool = False  # job metrics (iteration time or last progress) present
    hardware: bool = False  # an XID or error-counter field present
    peaks: dict[str, Peak] = field(default_factory=dict)
    combined: Peak = field(default_factory=Peak)
    first_fit: float | None = None  # when the job first had a baseline (fitted or loaded)
    models: set[str] = field(default_factory=set)  # dcgm's modelName of its GPUs
    sm_active: bool = False  # DCGM_FI_PROF_SM_ACTIVE present (not in dcgm's default counters)


class Coverage:
    """Fed every replay step; `report` says per job what ran, what did not and why."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobSeen] = {}

    def observe(self, sub: Frame, now: float, res: Result, engine: Engine) -> None:
        codes, uniq = sub.job_codes
        prog = np.isfinite(sub.col(F.ITER_SECONDS)) | np.isfinite(sub.col(F.STALL_SECONDS))
        hw = np.isfinite(sub.cols(HARDWARE_FIELDS)).any(axis=1)
        sm = np.isfinite(sub.col(SM))
        for k, job in enumerate(uniq):
            if not job:
                continue
            rows = np.flatnonzero(codes == k)
            seen = self.jobs.setdefault(job, JobSeen(now, now))
            seen.last = now
            info = engine.base.jobs.get(job)
            if seen.first_fit is None and info is not None and info.fitted_at is not None:
                seen.first_fit = info.fitted_at
            seen.nodes.update(sub.node[rows])
            seen.gpus.update(zip(sub.node[rows], sub.gpu[rows].tolist(), strict=True))
            seen.most_gpus = max(seen.most_gpus, len(rows))
            seen.progress |= bool(prog[rows].any())
            seen.hardware |= bool(hw[rows].any())
            seen.sm_active |= bool(sm[rows].any())
            seen.models.update(sub.models[rows].tolist())  # "": no modelName in the input
            block = res.gpu[rows]
            if len(block):
                best = block.argmax(axis=0)
                for d, name in enumerate(res.detectors):
                    i = rows[best[d]]
                    _raise(
                        seen.peaks,
                        name,
                        float(block[best[d], d]),
                        now,
                        sub.node[i],
                        int(sub.gpu[i]),
                    )
        for r in res.missing.itertuples() if len(res.missing) else ():
            if r.job_id in self.jobs:
                _raise(self.jobs[r.job_id].peaks, "missing", 2.0, now, r.node, int(r.gpu))
        combined = res.jobs["detector"].to_numpy() == "combined"
        ids, scores = (
            res.jobs["job_id"].to_numpy()[combined],
            res.jobs["score"].to_numpy()[combined],
        )
        for job, score in zip(ids, scores, strict=True):
            got = self.jobs.get(job)
            if got is not None and score > got.combined.score:
                got.combined = Peak(float(score), now)

    def report(self, engine: Engine) -> dict[str, dict[str, Any]]:
        return {job: self._job(job, seen, engine) for job, seen in sorted(self.jobs.items())}

    def _job(self, job: str, seen: JobSeen, engine: Engine) -> dict[str, Any]:
        cfg = engine.cfg
        info = engine.base.jobs.get(job)
        fitted = info.fitted_at if info else None
        loaded = bool(info and info.loaded)
        span = seen.last - seen.first
        if loaded:
            base = "loaded from the state directory"
        elif fitted is not None and seen.first_fit is not None:
            base = (
                f"first fitted {seen.first_fit - seen.first:.0f} s after the job was first seen "
                "(the baseline detectors were blind before)"
            )
            if fitted > seen.first_fit:
                base += f", last refit {fitted - seen.first:.0f} s after"
        else:
            base = (
                f"none: the job was seen for {span:.0f} s; the first fit needs "
                f"{cfg.fit_rows} calm rows over {cfg.fit_cycles} cycles after the "
                f"{cfg.warmup_s:g} s warm-up (or {cfg.fit_after_s:g} s); "
                "--state-dir starts from a saved one"
            )
        peers = engine.det.get("peer")
        min_peers = peers.min_peers if isinstance(peers, PeerComparison) else 3
        why: dict[str, str | None] = {}
        for name in engine.names:
            reason = None
            if name in BASELINE and fitted is None:
                reason = "no baseline yet"
            if name == "shift" and len(seen.nodes) < 2:
                reason = f"{len(seen.nodes)} node: shift compares the job's nodes (needs 2)"
            if name == "peer" and seen.most_gpus < min_peers:
                reason = f"{seen.most_gpus} GPU(s) at a time: peer comparison needs {min_peers}"
            if name in ("progress", "pace") and not seen.progress:
                reason = "no progress seen (no job metrics, or no progress line in the log)"
            if name == "hardware" and not seen.hardware:
                reason = "no XID or error-counter field in the input"
            why[name] = reason
        note = None
        prog = engine.det.get("progress")
        if why.get("progress") is None and fitted is None and isinstance(prog, Progress):
            note = (
                f"progress: no baseline either, so only a stall of {prog.unfitted_stall_s:g} s "
                "without progress would alarm (no pace score)"
            )
        physics_note = None
        if "physics" in engine.names and not seen.sm_active:
            phys = engine.det["physics"]
            pri = phys.priors if isinstance(phys, Physics) else P.load()
            blind = sorted(m for m in seen.models if "spin_power_max_w" not in pri.params(m))
            physics_note = _no_spin_wattage(blind) if blind else None
        dets = {
            name: {
                "ran": why[name] is None,
                "why_not": why[name],
                "peak": seen.peaks.get(name, Peak()).doc(),
            }
            for name in engine.names
        }
        if "missing" in seen.peaks:
            dets["missing"] = {"ran": True, "why_not": None, "peak": seen.peaks["missing"].doc()}
        return {
            "name": info.name if info else job,
            "first_fit": seen.first_fit,
            "first_seen": seen.first,
            "last_seen": seen.last,
            "nodes": sorted(seen.nodes),
            "gpus": len(seen.gpus),
            "baseline": {"fitted_at": fitted, "loaded": loaded, "status": base},
            "progress_note": note,
            "physics_note": physics_note,
            "detectors": dets,
            "peak": seen.combined.doc(),
        }


def _no_spin_wattage(models: list[str]) -> str:
    named = ", ".join(m or "an unknown model (no modelName in the input)" for m in models)
    return (
        f"physics: no spin wattage for {named} in catalogue/priors.yaml and no "
        "DCGM_FI_PROF_SM_ACTIVE in the input, so a GPU spinning in a hung collective is not "
        "seen from its first sample (add a modelName column, the model's spin_power_max_w in "
        "a catalogue copy named by $GOODPUT_CATALOGUE_DIR, or the SM field)"
    )


def _raise(peaks: dict[str, Peak], name: str, score: float, t: float, node: str, gpu: int):
    p = peaks.get(name)
    if score > 0 and (p is None or score > p.score):
        peaks[name] = Peak(score, t, str(node), gpu)

"""Jobs whose rank 0 works alone (a save, an evaluation, host work) while the other ranks wait
for it in a collective, spinning: the shape of a collective hung on rank 0, as the detector
engine and the attribution see it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from detector import fields as F
from detector.baselines import BaselineStore
from detector.frame import Frame
from detector.pipeline import Config, Engine
from detector.progress import Progress
from detector.synthetic import healthy_frame
from recovery import attribution
from recovery.evidence import Bundle, Context, LogLine, Report, Series

COL = {n: i for i, n in enumerate(F.ALL_FIELDS)}
TRAIN = 100  # samples of healthy training (500 s: fitted) before rank 0 works alone
START, ONSET = 1_735_689_600.0, 6


def spin(f: Frame, rows: np.ndarray) -> None:
    """`rows` wait in a collective: 100 % util, one SM spinning, at a spin's power (H200)."""
    v = f.values
    v[rows, COL["DCGM_FI_DEV_GPU_UTIL"]] = 100.0
    v[rows, COL["DCGM_FI_DEV_POWER_USAGE"]] = 125.0
    v[rows, COL["DCGM_FI_PROF_SM_ACTIVE"]] = 0.008
    for name in ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"):
        v[rows, COL[name]] = 0.0


def job_scores(f: Frame, tmp_path, detector: str = "combined") -> list[float]:
    """The engine's `detector` score of the (one) job at each instant of `f` after TRAIN."""
    eng = Engine(Config(interval_s=5.0), BaselineStore(tmp_path))
    out = []
    for r in f.instants():
        res = eng.step(f.take(r), float(f.time[r[0]]), {"100": "trainer"})
        out.append(float(res.jobs.query("detector == @detector").score.iloc[0]))
    return out[TRAIN:]


def attribute(progress: Series, lines: list[LogLine], n: int = 16) -> dict:
    """The attribution of `n` samples (5 s apart) of that job, with its progress series and
    log lines."""

    def s(name: str, gpu: int, before: float, after: float) -> Series:
        pts = [(START + 5.0 * i, before if i < ONSET else after) for i in range(n)]
        return Series(name, pts, node="node1", gpu=str(gpu), job_id="1001")

    series = [s("DCGM_FI_DEV_GPU_UTIL", 0, 100, 0), s("DCGM_FI_PROF_SM_ACTIVE", 0, 0.96, 0.0)]
    series.append(s("DCGM_FI_DEV_FB_USED", 0, 60_000, 60_000))
    for g in (1, 2, 3):
        series += [
            s("DCGM_FI_DEV_GPU_UTIL", g, 100, 100),
            s("DCGM_FI_PROF_SM_ACTIVE", g, 0.96, 0.008),
        ]
    series.append(progress)
    bundle = Bundle(
        series=series,
        lines=lines,
        reports=[Report("prometheus", "ok"), Report("logs", "ok"), Report("slurm", "ok")],
    )
    ctx = Context(job_id="1001", nodes=["node1"], start=START, end=START + 5.0 * n)
    return attribution.attribute(bundle, ctx)


def progress_scorer(det: Progress) -> Callable[..., float]:
    """`at(t, stall, since, step)`: the higher of the progress (stall) and pace (slowdown)
    scores of a one-GPU job's sample then."""

    def at(t: float, stall: float, since: float, step: float = 0.5) -> float:
        f = healthy_frame(jobs=1, nodes=1, gpus=1, steps=1, seed=5, start=t)
        f.values[0, COL[F.STALL_SECONDS]] = stall
        f.values[0, COL[F.SINCE_PAUSE]] = since
        f.values[0, COL[F.ITER_SECONDS]] = step
        return float(max(part[0] for part in det.parts(f)))

    return at

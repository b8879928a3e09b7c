"""Rank 0 evaluates (or logs, or generates samples) while the other ranks wait for it in a
collective: the waiting GPUs spin at 100 % util on low power, exactly like a collective hung on
rank 0, but the job's log moves, rank 0 printing its evaluation's bar (the main-process
validation of accelerate and diffusers scripts: huggingface/accelerate#223, #3861). A hung
collective stops the log. Fails on the code before: the engine alerted 15 s into each
evaluation (physics spin, peer, deviation, level; bench: healthy-rank0-evals, 25 false
incidents in 24 GPU-hours)."""

from __future__ import annotations

import numpy as np
import pytest

from detector import fields as F
from detector.baselines import BaselineStore
from detector.frame import Frame
from detector.physics import Physics
from detector.pipeline import Config, Engine
from detector.progress import Progress
from detector.synthetic import healthy_frame
from recovery import attribution
from recovery.evidence import Bundle, Context, Report, Series

COL = {n: i for i, n in enumerate(F.ALL_FIELDS)}
TRAIN = 100  # samples of healthy training (500 s: fitted) before the evaluation


def _evaluate(f: Frame, rows: np.ndarray, gpu: np.ndarray) -> None:
    """Rank 0 evaluates (busy, less power than training); the others spin in a collective."""
    v = f.values
    rank0, waiting = rows[gpu[rows] == 0], rows[gpu[rows] > 0]
    v[rank0, COL["DCGM_FI_DEV_GPU_UTIL"]] = 97.0
    v[rank0, COL["DCGM_FI_DEV_POWER_USAGE"]] = 520.0
    v[rank0, COL["DCGM_FI_PROF_SM_ACTIVE"]] = 0.85
    v[waiting, COL["DCGM_FI_DEV_GPU_UTIL"]] = 100.0
    v[waiting, COL["DCGM_FI_DEV_POWER_USAGE"]] = 125.0
    v[waiting, COL["DCGM_FI_PROF_SM_ACTIVE"]] = 0.008
    for name in ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"):
        v[waiting, COL[name]] = 0.0


def _run(wait_s: int, live: bool, tmp_path) -> list[float]:
    """The job's combined score at each sample of a `wait_s` rank-0 phase after 500 s of
    training; `live`: the log moves (a bar every few seconds), else it stopped at the onset."""
    f = healthy_frame(jobs=1, nodes=1, gpus=8, steps=TRAIN + wait_s // 5, seed=7)
    rows = f.instants()
    f.values[:, COL[F.SINCE_PAUSE]] = 1000.0 + f.time  # the log announces pauses (none open)
    for k, r in enumerate(rows[TRAIN:]):
        _evaluate(f, r, f.gpu)
        f.values[r, COL[F.STALL_SECONDS]] = float(k % 2) * 4.0 if live else 5.0 * (k + 1)
    eng = Engine(Config(interval_s=5.0), BaselineStore(tmp_path))
    out = []
    for r in rows:
        res = eng.step(f.take(r), float(f.time[r[0]]), {"100": "trainer"})
        out.append(float(res.jobs.query("detector == 'combined'").score.iloc[0]))
    return out[TRAIN:]


def test_ranks_waiting_while_the_log_moves_are_not_a_hang(tmp_path) -> None:
    assert max(_run(120, live=True, tmp_path=tmp_path)) < 1.0


def test_the_same_wait_with_the_log_stopped_is_a_hang_as_soon_as_before(tmp_path) -> None:
    scores = _run(60, live=False, tmp_path=tmp_path)
    assert next(i for i, s in enumerate(scores) if s >= 1.25) * 5 <= 15  # the 15 s window


def _spin(stall: float, step: float, since_pause: float = np.nan) -> float:
    f = healthy_frame(jobs=1, nodes=1, gpus=2, steps=1, seed=3)
    _evaluate(f, np.array([0, 1]), f.gpu)
    f.values[:, COL[F.STALL_SECONDS]] = stall
    f.values[:, COL[F.SINCE_PAUSE]] = since_pause
    f.values[:, COL[F.ITER_SECONDS]] = step
    return float(Physics().score(f)[1])


def test_physics_scores_a_spin_with_a_live_log_as_a_wait_that_keeps_its_window() -> None:
    assert 0.0 < _spin(stall=3.0, step=0.5) < 1.0  # > 0: the persistence window holds
    assert _spin(stall=0.0, step=0.5) > 0.0
    assert _spin(stall=12.0, step=0.5) == 2.0  # the log stopped: counted at once
    # before the job's first step a spin is the first collective hung, whatever the log says
    assert _spin(stall=3.0, step=np.nan) == 2.0


def test_the_engine_reads_a_live_wait_for_every_gpu_of_the_job() -> None:
    f = healthy_frame(jobs=2, nodes=1, gpus=2, steps=1, seed=3)
    first = np.flatnonzero(f.job == f.job[0])
    _evaluate(f, first, f.gpu)
    f.values[:, COL[F.STALL_SECONDS]] = 2.0
    f.values[:, COL[F.ITER_SECONDS]] = 0.5
    live = Physics().live_wait(f)
    assert live[first].all() and not live[np.setdiff1d(np.arange(len(f)), first)].any()


def test_settling_after_a_save_waits_for_the_first_step_after_a_live_evaluation() -> None:
    """A save, then at once an evaluation printing its bar: the bar closes the pause, but the
    job trains again (and runs its first slow steps) only after the evaluation."""
    det = Progress().fit(healthy_frame(jobs=1, nodes=1, gpus=1, steps=120, seed=4))

    def at(t: float, stall: float, since: float, step: float) -> float:
        f = healthy_frame(jobs=1, nodes=1, gpus=1, steps=1, seed=5, start=t)
        f.values[0, COL[F.STALL_SECONDS]] = stall
        f.values[0, COL[F.SINCE_PAUSE]] = since
        f.values[0, COL[F.ITER_SECONDS]] = step
        return float(det.score(f)[0])

    for k in range(6):  # a 30 s save, open
        at(1000.0 + 5 * k, stall=5.0 * k + 1, since=5.0 * k, step=0.5)
    for k in range(6, 19):  # 60 s of evaluation: its bar moves the log, no step line
        at(1000.0 + 5 * k, stall=float(k % 2), since=5.0 * k, step=0.5)
    assert at(1095.0, stall=0.0, since=95.0, step=0.8) == 0.0  # the first steps, slow
    assert at(1200.0, stall=0.0, since=200.0, step=0.8) >= 1.0  # still slow long after


def _rank0_on_the_host(progress: list[tuple[float, float]]) -> dict:
    """Attribution of a 1-node job whose rank 0 trained, then idles (memory held) from 30 s on
    while ranks 1-3 spin, with the job's last-progress time as given."""
    start, n, onset = 1_735_689_600.0, 20, 6

    def s(name: str, gpu: int, before: float, after: float) -> Series:
        pts = [(start + 5.0 * i, before if i < onset else after) for i in range(n)]
        return Series(name, pts, node="node1", gpu=str(gpu), job_id="1001")

    series = [s("DCGM_FI_DEV_GPU_UTIL", 0, 100, 0), s("DCGM_FI_PROF_SM_ACTIVE", 0, 0.96, 0.0)]
    series.append(s("DCGM_FI_DEV_FB_USED", 0, 60_000, 60_000))
    for g in (1, 2, 3):
        series += [
            s("DCGM_FI_DEV_GPU_UTIL", g, 100, 100),
            s("DCGM_FI_PROF_SM_ACTIVE", g, 0.96, 0.008),
        ]
    pts = [(start + t, start + p) for t, p in progress]
    series.append(Series("goodput_job_last_progress_timestamp_seconds", pts, job_id="1001"))
    bundle = Bundle(
        series=series,
        lines=[],
        reports=[Report("prometheus", "ok"), Report("logs", "ok"), Report("slurm", "ok")],
    )
    ctx = Context(job_id="1001", nodes=["node1"], start=start, end=start + 5.0 * n)
    return attribution.attribute(bundle, ctx)


def test_a_rank_idle_while_the_job_logs_on_is_not_stuck() -> None:
    """pytorch/pytorch#36285: GPU0 at 0 % while the others show 100 % at low power, and
    "the training is good and speed is fast": rank 0 works on the host, it is not stuck."""
    live = [(5.0 * i, 5.0 * i) for i in range(20)]  # the log moves to the end
    doc = _rank0_on_the_host(live)
    assert not any(s["id"] == "gpu_stuck" for s in doc["symptoms"])
    assert doc["outcome"] != "workload_hang"


@pytest.mark.parametrize("last", [30.0, 45.0])
def test_the_same_idle_rank_when_the_log_stopped_is_stuck(last: float) -> None:
    stopped = [(5.0 * i, min(5.0 * i, last)) for i in range(20)]  # a line just after onset
    doc = _rank0_on_the_host(stopped)
    assert doc["outcome"] == "workload_hang" and doc["affected_nodes"] == ["node1"]

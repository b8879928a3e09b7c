"""Rank 0 evaluates (or logs, or generates samples) while the other ranks wait for it in a
collective: the waiting GPUs spin at 100 % util on low power, exactly like a collective hung on
rank 0, but the job's log moves (rank 0 printing its evaluation's bar) or rank 0's GPU works
(the main-process validation of accelerate and diffusers scripts: huggingface/accelerate#223,
#3861). A hung collective stops the log, and nobody works. Fails on the code before: the engine
alerted 15 s into each evaluation (physics spin, peer, deviation, level; bench:
healthy-rank0-evals, 25 false incidents in 24 GPU-hours, and 21 with no bar)."""

from __future__ import annotations

import numpy as np
import pytest

from detector import fields as F
from detector.frame import Frame
from detector.physics import Physics
from detector.progress import Progress
from detector.synthetic import healthy_frame
from recovery.evidence import Series
from tests.unit.rank0_jobs import COL, START, TRAIN, attribute, job_scores, progress_scorer, spin

RANK0 = {  # util, power, SM active
    "works": (97.0, 520.0, 0.85),  # evaluating: busy, less power than training
    "idle": (0.0, 124.0, 0.0),  # stopped (host work, or stuck)
    "spins": (100.0, 125.0, 0.008),  # stuck in a collective too (bghira/SimpleTuner#759)
}


def _evaluate(f: Frame, rows: np.ndarray, gpu: np.ndarray, rank0: str = "works") -> None:
    """Rank 0 as `rank0` says; the others spin in a collective."""
    v = f.values
    first, waiting = rows[gpu[rows] == 0], rows[gpu[rows] > 0]
    for name, x in zip(
        ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_PROF_SM_ACTIVE"),
        RANK0[rank0],
        strict=True,
    ):
        v[first, COL[name]] = x
    spin(f, waiting)


def _run(wait_s: int, live: bool, tmp_path, rank0: str = "works") -> list[float]:
    """The job's combined score at each sample of a `wait_s` rank-0 phase after 500 s of
    training; `live`: the log moves (a bar every few seconds), else it stopped at the onset."""
    f = healthy_frame(jobs=1, nodes=1, gpus=8, steps=TRAIN + wait_s // 5, seed=7)
    rows = f.instants()
    f.values[:, COL[F.SINCE_PAUSE]] = 1000.0 + f.time  # the log announces pauses (none open)
    for k, r in enumerate(rows[TRAIN:]):
        _evaluate(f, r, f.gpu, rank0)
        f.values[r, COL[F.STALL_SECONDS]] = float(k % 2) * 4.0 if live else 5.0 * (k + 1)
    return job_scores(f, tmp_path)


@pytest.mark.parametrize("rank0", ["works", "idle"])
def test_ranks_waiting_while_the_log_moves_are_not_a_hang(tmp_path, rank0: str) -> None:
    assert max(_run(120, live=True, tmp_path=tmp_path, rank0=rank0)) < 1.0


def test_ranks_waiting_silently_for_a_rank_that_works_are_not_a_hang(tmp_path) -> None:
    """Rank 0 evaluating with no bar (diffusers' validation disables its pipeline's bar;
    Megatron-LM prints only the result): its GPU works, which no hung collective shows. The
    job's silence is still judged by the progress detector (180 s before a baseline says
    otherwise), and physics lifts the wait at the priors' pause_allowance_s (600 s)."""
    assert max(_run(150, live=False, tmp_path=tmp_path)) < 1.0
    assert max(_run(300, live=False, tmp_path=tmp_path)) >= 1.25


@pytest.mark.parametrize("rank0", ["idle", "spins"])
def test_the_same_wait_with_nobody_working_and_the_log_still_is_a_hang_at_once(
    tmp_path, rank0: str
) -> None:
    scores = _run(60, live=False, tmp_path=tmp_path, rank0=rank0)
    assert next(i for i, s in enumerate(scores) if s >= 1.25) * 5 <= 15  # the 15 s window


def _spin(stall: float, step: float, since_pause: float = np.nan, rank0: str = "idle") -> float:
    f = healthy_frame(jobs=1, nodes=1, gpus=2, steps=1, seed=3)
    _evaluate(f, np.array([0, 1]), f.gpu, rank0)
    f.values[:, COL[F.STALL_SECONDS]] = stall
    f.values[:, COL[F.SINCE_PAUSE]] = since_pause
    f.values[:, COL[F.ITER_SECONDS]] = step
    return float(Physics().score(f)[1])


def test_physics_scores_a_spin_with_a_live_log_as_a_wait_that_keeps_its_window() -> None:
    assert 0.0 < _spin(stall=3.0, step=0.5) < 1.0  # > 0: the persistence window holds
    assert _spin(stall=0.0, step=0.5) > 0.0
    assert _spin(stall=12.0, step=0.5) == 2.0  # the log stopped: counted at once
    assert _spin(stall=300.0, step=0.5, rank0="works") == pytest.approx(300.0 / 600.0)
    assert _spin(stall=610.0, step=0.5, rank0="works") == 2.0
    # before the job's first step a spin is the first collective hung, whatever the log says
    assert _spin(stall=3.0, step=np.nan) == 2.0
    assert _spin(stall=30.0, step=np.nan, rank0="works") == 2.0


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
    at = progress_scorer(Progress().fit(healthy_frame(jobs=1, nodes=1, gpus=1, steps=120, seed=4)))
    for k in range(6):  # a 30 s save, open
        at(1000.0 + 5 * k, stall=5.0 * k + 1, since=5.0 * k, step=0.5)
    for k in range(6, 19):  # 60 s of evaluation: its bar moves the log, no step line
        at(1000.0 + 5 * k, stall=float(k % 2), since=5.0 * k, step=0.5)
    assert at(1095.0, stall=0.0, since=95.0, step=0.8) == 0.0  # the first steps, slow
    assert at(1200.0, stall=0.0, since=200.0, step=0.8) >= 1.0  # still slow long after


def _rank0_on_the_host(progress: list[tuple[float, float]]) -> dict:
    """Rank 0 trained, then idles from 30 s on while ranks 1-3 spin, for 70 s, with the job's
    last-progress time as given."""
    pts = [(START + t, START + p) for t, p in progress]
    last = Series("goodput_job_last_progress_timestamp_seconds", pts, job_id="1001")
    return attribute(last, [], n=20)


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


def test_one_gpu_at_a_spins_power_among_working_peers_is_not_a_wait() -> None:
    """Most of a job waiting for the rest is a wait; one GPU alone busy at a spin's power while
    its seven peers train, the log moving, is not (a power-braked straggler looks so where dcgm
    reports no SM activity): it stays flagged."""
    f = healthy_frame(jobs=1, nodes=1, gpus=8, steps=1, seed=3)
    f.values[3, COL["DCGM_FI_DEV_GPU_UTIL"]] = 100.0
    f.values[3, COL["DCGM_FI_DEV_POWER_USAGE"]] = 125.0
    f.values[:, COL["DCGM_FI_PROF_SM_ACTIVE"]] = np.nan  # dcgm's default counters
    f.values[:, COL[F.STALL_SECONDS]] = 2.0
    f.values[:, COL[F.ITER_SECONDS]] = 0.5
    f = Frame(f.time, f.job, f.node, f.gpu, f.values, model=np.full(len(f), "NVIDIA H200"))
    det = Physics()
    assert det.score(f)[3] == 2.0 and not det.live_wait(f).any()

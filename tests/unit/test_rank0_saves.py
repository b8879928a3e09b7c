"""A rank that saves while the others wait for it in a barrier: the waiting GPUs spin at 100 %
util on low power, the saving one idles, exactly like a collective hung on that rank
(cupy/cupy#3557: peers blocked in a collective show 100 % util at low temperature). Inside a
checkpoint save the job's log announced it is a pause, judged by the pause's allowance. Fails
on the code before: the engine alerted 15 s into the save (physics spin, peer, deviation) and
the receiver requeued, then stopped, healthy jobs (bench: healthy-rank0-saves)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml

import catalogue.priors as P
from detector import fields as F
from detector.frame import Frame
from detector.physics import Physics
from detector.progress import Progress
from detector.synthetic import healthy_frame
from detector.thresholds import level
from recovery.attribution.metrics import _last_advance, _prior
from recovery.evidence import LogLine, Series
from tests.unit.rank0_jobs import (
    COL,
    ONSET,
    START,
    TRAIN,
    attribute,
    job_scores,
    progress_scorer,
    spin,
)


def _save(f: Frame, rows: np.ndarray, gpu: np.ndarray) -> None:
    """Rank 0 writes (idle, memory held); the others wait for it in a barrier (spin)."""
    v = f.values
    writer = rows[gpu[rows] == 0]
    spin(f, rows[gpu[rows] > 0])
    v[writer, COL["DCGM_FI_DEV_GPU_UTIL"]] = 0.0
    v[writer, COL["DCGM_FI_DEV_POWER_USAGE"]] = 135.0
    for name in (
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
    ):
        v[writer, COL[name]] = 0.0


def _run(pause_s: int, announced: bool, tmp_path, detector: str = "combined") -> list[float]:
    """A job score of each sample of a `pause_s` save after 500 s of training."""
    f = healthy_frame(jobs=1, nodes=1, gpus=8, steps=TRAIN + pause_s // 5, seed=7)
    rows = f.instants()
    f.values[:, COL[F.SINCE_PAUSE]] = 1000.0 + f.time  # the log announces pauses (none yet)
    for k, r in enumerate(rows[TRAIN:]):
        _save(f, r, f.gpu)
        f.values[r, COL[F.STALL_SECONDS]] = 5.0 * (k + 1)
        if announced:  # `saving checkpoint ...` right after the last progress line
            f.values[r, COL[F.SINCE_PAUSE]] = 5.0 * k
    return job_scores(f, tmp_path, detector)


def test_an_announced_save_with_waiting_peers_is_a_pause(tmp_path) -> None:
    assert max(_run(120, announced=True, tmp_path=tmp_path)) < 1.25


def test_the_same_signature_unannounced_is_a_hang(tmp_path) -> None:
    scores = _run(60, announced=False, tmp_path=tmp_path)
    assert next(i for i, s in enumerate(scores) if s >= 1.25) * 5 <= 30


def test_a_first_save_that_hangs_is_caught_once_the_pause_allowance_is_spent(tmp_path) -> None:
    """The job's first save may take as long as the model's pause allowance (a 13B model's
    first save took 5 minutes, epfLLM/Megatron-LLM#69); progress alerts when it is spent.
    Before: at 1.25 x its 180 s stall allowance, a false alert on every long first save."""
    scores = _run(700, announced=True, tmp_path=tmp_path, detector="progress")
    first = next(i for i, s in enumerate(scores) if s >= level("progress")) * 5
    assert 595 <= first <= 610


def test_a_later_save_that_hangs_is_caught_by_the_jobs_own_save_length() -> None:
    """Once the job showed what its saves take (20 s), a save stuck for minutes is caught by
    progress at its stall allowance (max(180 s, 3 x 20 s)), long before the model's 600 s."""
    det = Progress().fit(healthy_frame(jobs=1, nodes=1, gpus=1, steps=120, seed=4))
    at = progress_scorer(det)
    for k in range(5):  # a 20 s save, seen open every 5 s, then progress
        at(1000.0 + 5 * k, stall=5.0 * k + 1, since=5.0 * k)
    at(1025.0, stall=0.0, since=25.0)
    assert at(2000.0 + 130, stall=131.0, since=130.0) < level("progress")
    assert at(2000.0 + 140, stall=141.0, since=140.0) >= level("progress")


def test_the_caps_lift_when_the_pause_outlives_its_allowance(tmp_path) -> None:
    peer = _run(640, announced=True, tmp_path=tmp_path, detector="peer")
    assert max(peer[:115]) < 1.0 and max(peer[121:]) >= 1.0  # the priors' 600 s


def _one(spin: bool, stall: float, since_pause: float, step: float) -> float:
    f = healthy_frame(jobs=1, nodes=1, gpus=1, steps=1, seed=3)
    if spin:
        _save(f, np.array([0]), np.array([1]))  # one waiting rank
    f.values[0, COL[F.STALL_SECONDS]] = stall
    f.values[0, COL[F.SINCE_PAUSE]] = since_pause
    f.values[0, COL[F.ITER_SECONDS]] = step
    return float(Physics().score(f)[0])


def test_physics_gives_a_spin_inside_a_save_the_pause_allowance() -> None:
    assert _one(True, stall=65.0, since_pause=60.0, step=0.5) == pytest.approx(60.0 / 600.0)
    assert _one(True, stall=65.0, since_pause=400.0, step=0.5) == 2.0  # no pause open
    # before the first iteration a spin is the first collective hung: no allowance
    assert _one(True, stall=np.nan, since_pause=30.0, step=np.nan) == 2.0


def test_attribution_takes_no_symptom_from_a_wait_the_job_progressed_after() -> None:
    t = [float(x) for x in range(0, 200, 5)]
    spin = [(x, 100.0) for x in t]
    sm = [(x, 0.008 if 40 <= x < 120 else 0.96) for x in t]  # waited 80 s, then trained
    progress = [(x, float(x if x < 40 or x >= 120 else 35)) for x in t]
    series = [
        Series("DCGM_FI_DEV_GPU_UTIL", spin, node="node1", gpu="1"),
        Series("DCGM_FI_PROF_SM_ACTIVE", sm, node="node1", gpu="1"),
        Series("goodput_job_last_progress_timestamp_seconds", progress),
    ]
    rule = {"id": "spin_wait", "kind": "prior", "rule": "spin_wait", "min_s": 30}
    assert _prior(series, rule, _last_advance(series)) == []
    hung = [(x, float(min(x, 35))) for x in t]  # no progress after the wait: a hang
    series[2] = Series("goodput_job_last_progress_timestamp_seconds", hung)
    assert [s.id for s in _prior(series, rule, _last_advance(series))] == ["spin_wait"]


def test_the_slow_first_steps_after_a_long_pause_settle_from_its_end() -> None:
    """A save twice the usual length (back to back with an evaluation, say): its first steps
    run slow after it ended, not 1.5 x the usual pause after it began."""
    det = Progress().fit(healthy_frame(jobs=1, nodes=1, gpus=1, steps=120, seed=4))
    at = progress_scorer(det)
    for k in range(21):  # a 100 s save, seen open every 5 s
        at(1000.0 + 5 * k, stall=5.0 * k + 1, since=5.0 * k, step=0.5)
    assert at(1105.0, stall=0.0, since=105.0, step=0.8) == 0.0  # settling: 100 s + 15 s
    assert at(1120.0, stall=0.0, since=120.0, step=0.8) >= 1.0  # still slow after it
    unseen = progress_scorer(
        Progress().fit(healthy_frame(jobs=1, nodes=1, gpus=1, steps=120, seed=4))
    )
    assert unseen(1105.0, stall=0.0, since=105.0, step=0.8) >= 1.0  # never seen: 1.5 x 30 + 15 s


def _writer_and_waiters(lines: list[LogLine]) -> dict:
    """Rank 0 idle, ranks 1-3 spinning from 30 s on, for 50 s; no iteration since."""
    it = [(START + 5.0 * i, float(min(i, ONSET))) for i in range(16)]
    return attribute(Series("goodput_job_iteration", it, job_id="1001"), lines)


MEGATRON = (
    " iteration      100/  500000 | consumed samples:       61440 | elapsed time per "
    "iteration (ms): 512.3 | learning rate: 3.000E-04 | lm loss: 2.345678E+00 |"
)
T0 = START + 30.0


def test_the_rank_that_writes_an_announced_save_is_not_a_stuck_rank() -> None:
    """An unrelated alert that opens an incident during a save (or a save that outlasts the
    stall allowance) must not requeue the job on the writer's idle GPU."""
    saving = [
        LogLine("job.log", 1, MEGATRON, time=T0 - 2),
        LogLine("job.log", 2, "saving checkpoint at iteration     100 to /ckpt", time=T0 - 1),
    ]
    doc = _writer_and_waiters(saving)
    assert not any(s["id"] == "gpu_stuck" for s in doc["symptoms"])
    assert doc["outcome"] != "workload_hang"


def test_the_same_idle_rank_with_no_save_open_is_stuck() -> None:
    doc = _writer_and_waiters([LogLine("job.log", 1, MEGATRON, time=T0 - 2)])
    assert doc["outcome"] == "workload_hang" and doc["affected_nodes"] == ["node1"]
    start_up = [LogLine("job.log", 1, "> building GPT model ...", time=T0 - 1)]
    assert _writer_and_waiters(start_up)["outcome"] == "workload_hang"  # not a save: no progress


def test_progress_learns_the_jobs_pauses_from_its_log_and_allows_a_multiple() -> None:
    """The reservoir never holds a save's rows (its idle GPUs alarm the other detectors), so
    the longest pause is learned from the log's announcements as they are seen."""
    det = Progress().fit(healthy_frame(jobs=1, nodes=1, gpus=1, steps=120, seed=4))
    at = progress_scorer(det)
    assert at(1000.0 + 250, stall=251.0, since=250.0) < 0.75  # a first save: the model's 600 s
    for k in range(25):  # a second save, 120 s, seen open every 5 s, then progress
        at(2000.0 + 5 * k, stall=5.0 * k + 1, since=5.0 * k)
    at(2125.0, stall=0.0, since=125.0)
    assert det._known_pause("100") == pytest.approx(250.0)  # the longest seen
    assert at(3000.0 + 550, stall=551.0, since=550.0) < 0.75  # 3 x 250 s: not hung yet
    assert at(3000.0 + 800, stall=801.0, since=800.0) >= 1.0
    assert at(3000.0 + 800, stall=801.0, since=900.0) >= 1.0  # no pause open: 180 s
    # a refit while that pause is open keeps only the pauses that ended: an open one would
    # stretch its own allowance at every refit (before: 3 x 800 s, a hung save never caught)
    det.fit(healthy_frame(jobs=1, nodes=1, gpus=1, steps=120, seed=6, start=4000.0))
    assert float(det.pause_[0]) == pytest.approx(250.0)
    assert at(3000.0 + 820, stall=821.0, since=820.0) >= 1.0
    at(3000.0 + 830, stall=1.0, since=830.0, step=0.6)  # training resumed: that pause ended
    refit = det.fit(healthy_frame(jobs=1, nodes=1, gpus=1, steps=120, seed=6, start=4000.0))
    assert float(refit.pause_[0]) == pytest.approx(820.0)  # the longest seen, kept in its fit


def test_the_raw_no_progress_condition_holds_off_a_save_as_long_as_the_engine() -> None:
    doc = yaml.safe_load((Path(__file__).parents[2] / "alertmanager/alerts.yaml").read_text())
    hung = next(a for a in doc["alerts"] if a["name"] == "GoodputJobHung")
    expr = next(c["expr"] for c in hung["conditions"] if c.get("signal") == "no_progress")
    # the detector's own allowance for the job, else (the detector down) the model's
    assert "< on (job_id) (" in expr and "goodput_job_pause_allowance_seconds" in expr
    (held,) = re.findall(r"goodput_job_last_pause_timestamp_seconds\)\s*\+\s*(\d+)", expr)
    assert float(held) == P.load().params(P.GENERIC)["pause_allowance_s"]


def test_a_job_already_slow_when_a_save_began_stays_flagged_through_it() -> None:
    """A straggler's slow score does not settle across a save (its alert would clear, and a
    new incident open after every checkpoint)."""
    det = Progress().fit(healthy_frame(jobs=1, nodes=1, gpus=1, steps=120, seed=4))
    at = progress_scorer(det)
    assert at(995.0, stall=1.0, since=900.0, step=0.8) >= 1.0  # slow before the save
    for k in range(5):  # a 20 s save
        at(1000.0 + 5 * k, stall=5.0 * k + 1, since=5.0 * k, step=0.8)
    assert at(1025.0, stall=0.0, since=25.0, step=0.8) >= 1.0  # still slow: no settling
    for k in range(5):  # a healthy job's next save: its first slow steps settle
        at(2000.0 + 5 * k, stall=5.0 * k + 1, since=5.0 * k, step=0.5)
    assert at(2025.0, stall=0.0, since=25.0, step=0.6) == 0.0

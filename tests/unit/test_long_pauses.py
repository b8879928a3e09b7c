"""Pauses longer than the GPU model's allowance (600 s): checkpoint loads of 15 and 30 minutes
(Nerogar/OneTrainer#631, modelscope/ms-swift#7058), saves of 10 to 15 minutes
(epfLLM/Megatron-LLM#69). The first such pause is flagged (nothing yet says how long the
job's pauses take); its later pauses, in the same run or in its restart after a requeue, are
allowed `pause_factor` x the longest it was seen to take, by the progress and physics
detectors, the engine's caps and the raw alert condition alike (one value, exported per job).
Fails on the code before: the restart's load was flagged at the same 600 s and the receiver
stopped the job on the same root cause (bench: healthy-long-pauses)."""

from __future__ import annotations

import numpy as np
import pytest

from detector import fields as F
from detector.baselines import BaselineStore
from detector.exposition import render
from detector.frame import Frame
from detector.pipeline import Config, Engine, Result
from detector.progress import Progress
from detector.synthetic import healthy_frame
from detector.thresholds import level
from tests.unit.test_physics import _never

COL = {n: i for i, n in enumerate(F.ALL_FIELDS)}
JOB = "100"


def _loading(t: float, since: float, stall: float) -> Frame:
    """The one-GPU job at `t`: idle with memory held, no step time yet, inside a checkpoint
    load its log announced `since` s ago (`stall`: s since its last progress line)."""
    f = healthy_frame(jobs=1, nodes=1, gpus=1, steps=1, seed=3, start=t)
    _never(f, since, stall)
    f.values[:, COL["DCGM_FI_PROF_SM_ACTIVE"]] = 0.0
    return f


def _load(eng: Engine, t0: float, seconds: float, stall0: float) -> list[Result]:
    """A load of `seconds` seen every 5 s from `t0`; the engine's result at each sample."""
    return [
        eng.step(_loading(t0 + s, s, stall0 + s), t0 + s, {JOB: "trainer"})
        for s in np.arange(0.0, seconds + 1.0, 5.0)
    ]


def _score(res: Result, detector: str) -> float:
    return float(res.jobs.query("detector == @detector").score.iloc[0])


def test_a_restart_may_load_three_times_as_long_as_the_load_its_requeue_cut(tmp_path) -> None:
    eng = Engine(Config(interval_s=5.0), BaselineStore(tmp_path))
    first = _load(eng, 0.0, 780.0, stall0=300.0)
    assert float(first[0].pause_cols["value"][0]) == 600.0  # the model's, nothing seen yet
    assert _score(first[-1], "physics") >= 1.25  # flagged: the receiver requeues it
    eng.end_jobs(set())  # requeued: the job leaves Slurm's running set, then restarts
    again = _load(eng, 2000.0, 900.0, stall0=5.0)  # its log's progress dates from the restart
    allowed = float(again[-1].pause_cols["value"][0])
    assert allowed == pytest.approx(3 * 780.0)  # 3 x the load the requeue cut
    assert max(_score(r, "physics") for r in again) < 0.5
    assert max(_score(r, "progress") for r in again) < level("progress")
    assert max(_score(r, "combined") for r in again) < 1.0
    text = render(again[-1], gpu_level=1.25).decode()
    assert f'goodput_job_pause_allowance_seconds{{job_id="{JOB}"}} 2340.0' in text
    # still caught when it hangs: past that allowance physics flags it
    late = eng.step(_loading(4400.0, 2400.0, 2405.0), 4400.0, {JOB: "trainer"})
    assert _score(late, "physics") >= 1.0


def test_without_the_pause_learner_physics_keeps_the_models_allowance() -> None:
    from detector.physics import Physics

    f = _loading(0.0, 700.0, 1000.0)
    assert float(Physics().pause_allowance(f)[0]) == 600.0
    assert float(Physics().score(f)[0]) == pytest.approx(700.0 / 600.0)


def _seen(det: Progress, t: float, stall: float, since: float, step: float = np.nan) -> None:
    """One cycle of the one-GPU job at `t` with these progress fields, scored by `det`."""
    f = _loading(t, since, stall)
    f.values[:, COL[F.ITER_SECONDS]] = step
    det.score(f)


def test_a_pause_a_requeue_cut_counts_for_that_job_id_only_not_by_name() -> None:
    """The load the requeue cut may have been a real hang: it stretches its own restart's
    allowance, but is not stored in the job's baseline by name, where every later job of
    that name would inherit it."""
    det = Progress()
    for s in np.arange(0.0, 781.0, 5.0):
        _seen(det, s, stall=np.nan, since=s)
    det.drop_jobs({JOB})
    assert np.isnan(det._known_pause(JOB))  # what a fit would store by name
    restart = _loading(2000.0, 10.0, np.nan)
    assert float(det.pause_allowance(restart)[0]) == pytest.approx(3 * 780.0)
    fresh = Progress()  # the same name's next job, from its stored baseline: nothing
    assert float(fresh.pause_allowance(restart)[0]) == 600.0


def test_a_step_time_the_log_rounds_alike_does_not_stretch_a_save_for_hours() -> None:
    """A save that a bar closed runs on until the step time moves; a log that prints the same
    rounded step time after the save (tqdm's `1.20s/it`) left it `ran` growing through hours
    of training (the next save then had 3x that). At most the model's allowance now."""
    det = Progress().fit(healthy_frame(jobs=1, nodes=1, gpus=1, steps=120, seed=4))
    for k in range(5):  # a 20 s save after a step of 0.5 s
        _seen(det, 1000.0 + 5 * k, stall=5.0 * k + 1, since=5.0 * k, step=0.5)
    for k in range(1, 720):  # two hours of training, the same 0.5 s printed
        _seen(det, 1020.0 + 10 * k, stall=1.0, since=20.0 + 10 * k, step=0.5)
    assert det._pauses[JOB].ran <= 600.0
    save = _loading(9000.0, 10.0, 11.0)
    assert float(det.pause_allowance(save)[0]) <= 3 * 600.0

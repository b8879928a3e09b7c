"""Physics priors (catalogue/priors.yaml) and the detector that scores them from the first
sample: no baseline, no peer, one GPU. Fails on the code before the physics detector: a one-GPU
job spinning from its start scored 0 until a baseline was fitted (300 s)."""

from __future__ import annotations

import doctest
import json

import numpy as np
import pytest
import yaml

import catalogue.priors as P
import detector.perjob
import detector.physics
from detector import fields as F
from detector.baselines import BaselineStore
from detector.frame import Frame
from detector.physics import Physics
from detector.pipeline import Config, Engine
from detector.synthetic import healthy_frame

COL = {n: i for i, n in enumerate(F.ALL_FIELDS)}
H200 = "NVIDIA H200"


def _one_gpu(steps: int, model: str = H200, start: float = 0.0) -> Frame:
    f = healthy_frame(jobs=1, nodes=1, gpus=1, steps=steps, seed=3, start=start)
    return Frame(f.time, f.job, f.node, f.gpu, f.values, model=np.full(len(f), model, object))


def _spin(f: Frame, rows: np.ndarray, sm: bool = True) -> None:
    """Hung in a collective: spinning, the job's log still for a minute (with the log moving
    it would be a wait for a live rank: tests/unit/test_rank0_evals.py)."""
    f.values[rows, COL["DCGM_FI_DEV_GPU_UTIL"]] = 100.0
    f.values[rows, COL["DCGM_FI_DEV_POWER_USAGE"]] = 125.0
    f.values[rows, COL["DCGM_FI_PROF_SM_ACTIVE"]] = 0.008 if sm else np.nan
    f.values[np.isin(f.job, f.job[rows]), COL[F.STALL_SECONDS]] = 60.0


def test_docstring_examples() -> None:
    for mod in (P, detector.physics):
        assert doctest.testmod(mod).failed == 0


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["models"].pop("generic"), "generic"),
        (lambda d: d["rules"][0]["when"].append(["X", "~", 1]), "rules.0.when.2"),
        (lambda d: d["rules"][0]["when"].append(["X", ">=", "no_such"]), "no_such"),
        (lambda d: d["models"]["generic"].update(busy_util="high"), "busy_util"),
        (lambda d: d["rules"][1].update(score=0), "rules.1.score"),
        (lambda d: d["rules"][1].update(wait="yes"), "rules.1.wait"),
        (lambda d: d["working"].append([]), "working.2"),
        (lambda d: d["working"][0].append(["X", ">=", "no_such"]), "no_such"),
        (lambda d: d["models"]["NVIDIA H200"].update(also="H200"), "models.NVIDIA H200.also"),
        (lambda d: d["models"]["NVIDIA H200"].update(also=["NVIDIA H100 80GB HBM3"]), "already"),
    ],
)
def test_bad_priors_are_rejected_with_the_entry(tmp_path, edit, message) -> None:
    doc = yaml.safe_load((P.HERE / "priors.yaml").read_text())
    edit(doc)
    (tmp_path / "priors.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(P.PriorsError, match=message):
        P.load(tmp_path / "priors.yaml")


def test_healthy_scores_zero_and_round_trips() -> None:
    train = healthy_frame(jobs=2, nodes=2, steps=40, seed=11)
    det = Physics()
    assert det.fit(train) is det
    test = healthy_frame(jobs=2, nodes=2, steps=3, seed=12, start=1000.0)
    assert (det.score(test) == 0).all()
    again = Physics()
    for job in det.jobs():
        if (state := det.job_state(job)) is not None:
            again.set_job_state(job, json.loads(json.dumps(state)))
    np.testing.assert_array_equal(again.score(test), det.score(test))
    assert det.score(test.take(np.array([], dtype=int))).shape == (0,)


def test_power_rule_needs_the_model_sm_rule_does_not() -> None:
    """dcgm's defaults have no SM activity: the wattage of a spin is known per model only."""
    for model, want in ((H200, 2.0), ("an unlisted GPU", 0.0)):
        f = _one_gpu(2, model)
        _spin(f, np.array([0]), sm=False)
        assert Physics().score(f)[0] == want
    f = _one_gpu(2, "an unlisted GPU")
    _spin(f, np.array([0]))
    assert Physics().score(f)[0] == 2.0


def test_hw_slowdown_bit_and_power_cap_bit() -> None:
    f = _one_gpu(2)
    f.values[0, COL[F.THROTTLE]] = 0x40  # HW thermal slowdown
    f.values[1, COL[F.THROTTLE]] = 0x04  # SW power cap: healthy training at the limit
    s = Physics().score(f)
    assert s[0] == 1.5 and s[1] == 0.0


def _idle(f: Frame, rows: np.ndarray, stall: float, since_pause: float) -> None:
    f.values[rows, COL["DCGM_FI_DEV_GPU_UTIL"]] = 0.0
    f.values[rows, COL["DCGM_FI_DEV_POWER_USAGE"]] = 124.0
    f.values[rows, COL[F.STALL_SECONDS]] = stall
    f.values[rows, COL[F.SINCE_PAUSE]] = since_pause


def test_idle_hang_holds_off_only_inside_an_announced_pause() -> None:
    f = _one_gpu(1)
    det = Physics()
    _idle(f, np.array([0]), stall=30.0, since_pause=400.0)  # last pause long closed
    assert det.score(f)[0] == pytest.approx(30.0 / 15.0)  # floor 15 s before a fit
    _idle(f, np.array([0]), stall=30.0, since_pause=20.0)  # a save began after the last line
    assert det.score(f)[0] < 0.1
    _idle(f, np.array([0]), stall=30.0, since_pause=np.nan)  # the log never announces pauses
    assert det.score(f)[0] == 0.0  # left to the progress detector's long allowance
    f.values[0, COL["DCGM_FI_DEV_FB_USED"]] = 615.0  # memory released: the process is gone
    _idle(f, np.array([0]), stall=30.0, since_pause=400.0)
    assert det.score(f)[0] == 0.0


def test_idle_allowance_follows_the_jobs_own_progress_gaps() -> None:
    train = _one_gpu(60)
    train.values[:, COL[F.STALL_SECONDS]] = np.linspace(0, 40, 60)  # logs every ~40 s
    det = Physics().fit(train)
    f = _one_gpu(1)
    _idle(f, np.array([0]), stall=30.0, since_pause=400.0)
    assert det.score(f)[0] < 0.5  # 30 s is normal for this job (2 x p99 gap = 79 s)


def test_a_wait_is_live_for_the_jobs_own_log_cadence() -> None:
    """A healthy job whose ranks spin in slow collectives (full util on low power while
    progress crawls: baichuan-inc/Baichuan2#354) and that logs every ~40 s waits for a live
    job while its log is silent for under 2 x its p99 progress gap (or 2 x its iteration time
    before a fit), not for the fixed live_log_s (10 s), and for at most live_log_max_s (60 s: a
    p99 gap a silent evaluation stretched hides no hang for long); a longer silence is a hang."""
    train = _one_gpu(60)
    train.values[:, COL[F.STALL_SECONDS]] = np.linspace(0, 25, 60)  # logs every ~25 s
    fitted, fresh = Physics().fit(train), Physics()
    train.values[:, COL[F.STALL_SECONDS]] = np.linspace(0, 300, 60)  # a silent evaluation
    stretched = Physics().fit(train)
    f = _one_gpu(1)
    _spin(f, np.array([0]), sm=False)  # dcgm's defaults: the spin seen through power
    at = lambda det, stall: (  # noqa: E731
        f.values.__setitem__((0, COL[F.STALL_SECONDS]), stall) or float(det.score(f)[0])
    )
    assert at(fresh, 30.0) == 2.0  # no cadence known (0.5 s iterations): past 10 s, a hang
    assert at(fitted, 30.0) < 0.7  # 30 s of silence is this job's normal (~50 s allowance)
    assert at(fitted, 55.0) == 2.0
    assert at(stretched, 50.0) < 1.0 and at(stretched, 61.0) == 2.0  # capped at 60 s
    f.values[0, COL[F.ITER_SECONDS]] = 14.0  # before a fit: slow iterations, one line each
    assert at(fresh, 20.0) < 1.0 and at(fresh, 30.0) == 2.0  # 2 x 14 s


def _start_up(nodes: int = 1, gpus: int = 8) -> Frame:
    """A job before its first step, every GPU spinning in a barrier (the log still)."""
    f = healthy_frame(jobs=1, nodes=nodes, gpus=gpus, steps=1, seed=2)
    f = Frame(f.time, f.job, f.node, f.gpu, f.values, model=np.full(len(f), H200, object))
    f.values[:, COL[F.ITER_SECONDS]] = np.nan  # no step yet
    _spin(f, np.arange(len(f)))
    return f


def _host_work(f: Frame, rows: np.ndarray) -> None:
    """These ranks work on the host (idle GPU, memory held) while the others wait."""
    f.values[rows, COL["DCGM_FI_DEV_GPU_UTIL"]] = 0.0
    f.values[rows, COL["DCGM_FI_DEV_POWER_USAGE"]] = 124.0
    f.values[rows, COL["DCGM_FI_PROF_SM_ACTIVE"]] = 0.0


def _log(f: Frame, stall: float, since_pause: float) -> np.ndarray:
    """The scores with the job's latest progress-dating line `stall` s ago and its latest
    start-up (`pause`) line `since_pause` s ago (the milestone when the two are equal)."""
    f.values[:, COL[F.STALL_SECONDS]] = stall
    f.values[:, COL[F.SINCE_PAUSE]] = since_pause
    return Physics().score(f)


def test_before_the_first_step_ranks_wait_for_one_whose_start_up_log_moves() -> None:
    """Rank 5 works on the host printing a bar while the other ranks wait in a barrier, their
    GPUs spinning: a wait for a live rank while a start-up (`pause`) line is under
    live_log_max_s old; a hang once the bar stops, or where every rank spins, or on one GPU."""
    f = _start_up()
    _host_work(f, np.array([5]))
    others = np.arange(8) != 5
    assert _log(f, 90.0, 1.0).max() < 1.0  # the bar updated a second ago
    assert _log(f, 90.0, 30.0).max() < 1.0  # (an update per batch: seconds to tens of seconds)
    assert (_log(f, 90.0, 70.0)[others] == 2.0).all()  # the bar stopped a minute ago: stuck
    assert (_log(f, 30.0, 30.0)[others] == 2.0).all()  # a milestone is the latest line
    _spin(f, np.array([5]))
    assert (_log(f, 90.0, 1.0) == 2.0).all()  # every rank spins: nobody they could wait for
    one = _one_gpu(1)
    _spin(one, np.array([0]))
    one.values[0, COL[F.ITER_SECONDS]] = np.nan
    assert _log(one, np.nan, 1.0)[0] == 2.0


def test_before_the_first_step_ranks_wait_for_main_processes_for_the_start_up_allowance() -> None:
    """Rank 0 prepares alone before the first step, silently or past its last bar update
    (`if rank == 0: download(); barrier()`; transformers' main_process_first; saving the
    tokenised set), while the others spin in a barrier: a wait for the start-up's
    never_started allowance (600 s from open start-up work, 120 s + 20 s per doubling of the
    GPUs from a milestone, 600 s with no log), then a hang. Before, the spinning ranks were a
    hang 15 s in: healthy jobs were requeued, then stopped (healthy-rank0-silent-prep)."""
    f = _start_up()
    _host_work(f, np.array([0]))
    others = np.arange(8) > 0
    assert _log(f, 590.0, 70.0).max() < 1.0  # start-up work open: 600 s from its line
    assert (_log(f, 700.0, 610.0)[others] == 2.0).all()
    assert _log(f, 170.0, 170.0).max() < 1.0  # after the milestone: 120 + 20 x log2(8) s
    assert (_log(f, 190.0, 190.0)[others] == 2.0).all()
    f.values[:, COL[F.JOB_AGE]] = 590.0  # no log yet: the job's age / 600 s
    assert _log(f, np.nan, np.nan).max() < 1.0
    f.values[:, COL[F.JOB_AGE]] = 610.0
    assert (_log(f, np.nan, np.nan)[others] == 2.0).all()
    _host_work(f, np.array([3]))  # rank 3 idle too: not a main process, a stuck rank
    assert (_log(f, 170.0, 170.0)[~np.isin(np.arange(8), [0, 3])] == 2.0).all()
    two = _start_up(nodes=2, gpus=4)  # local rank 0 of each node (main_process_first(local))
    _host_work(two, np.flatnonzero(two.gpu == 0))
    assert _log(two, 170.0, 170.0).max() < 1.0
    rest = np.flatnonzero(two.gpu > 0)
    shifted = Frame(two.time, two.job, two.node, two.gpu + 4, two.values, model=two.model)
    assert _log(shifted, 170.0, 170.0).max() < 1.0  # its lowest GPU (4), not GPU 0
    assert (_log(shifted, 190.0, 190.0)[rest] == 2.0).all()


def test_one_gpu_spin_from_its_first_sample_alerts_without_baseline(tmp_path) -> None:
    """The engine: a one-GPU job spinning from its start reaches the alert level after the
    persistence window (15 s), with no baseline; a single spinning sample does not."""
    eng = Engine(Config(interval_s=5.0), BaselineStore(tmp_path))
    f = _one_gpu(12)
    rows = f.instants()
    _spin(f, rows[2])  # one sample only: a blip
    _spin(f, np.concatenate(rows[6:]))
    combined = []
    for r in rows:
        res = eng.step(f.take(r), float(f.time[r[0]]), {"100": "solo"})
        combined.append(float(res.jobs.query("detector == 'combined'").score.iloc[0]))
    assert max(combined[:6]) < 1.0
    first = next(i for i, c in enumerate(combined) if c >= 1.25)
    assert (first - 6) * 5.0 <= 10.0  # three samples: onset + 10 s


def _never(f: Frame, since_pause: float, stall: float = np.nan) -> None:
    """Idle with memory held, no step time yet, `since_pause` s since a start-up line."""
    f.values[:, COL["DCGM_FI_DEV_GPU_UTIL"]] = 0.0
    f.values[:, COL["DCGM_FI_DEV_POWER_USAGE"]] = 124.0
    f.values[:, COL[F.ITER_SECONDS]] = np.nan
    f.values[:, COL[F.STALL_SECONDS]] = stall
    f.values[:, COL[F.SINCE_PAUSE]] = since_pause


def test_never_started_is_short_after_a_milestone_and_long_while_start_up_works() -> None:
    """Before the first iteration: the log's latest start-up line a milestone (`training ...`
    dates progress and pause alike: stall == since_pause) -> the short allowance (120 s for a
    first batch or a silent compile, + 20 s per doubling of the job's GPUs for the first
    collective's communicator init); start-up work open (a checkpoint
    load after the milestone, or start-up lines with no milestone yet) -> the long one. Fails on
    the code before: one allowance (30 s + 15 s per doubling) whatever the log said, so a
    checkpoint load of over 30 s scored over 1.0 and a quiet job waited 30-75 s."""
    det = Physics()
    one = _one_gpu(1)
    _never(one, since_pause=240.0, stall=240.0)  # 'training ...' 240 s ago, nothing since
    assert det.score(one)[0] == pytest.approx(2.0)
    f = healthy_frame(jobs=1, nodes=1, gpus=8, steps=1, seed=3)
    eight = Frame(f.time, f.job, f.node, f.gpu, f.values, model=np.full(len(f), H200, object))
    _never(eight, since_pause=120.0, stall=120.0)  # first batch + NCCL init: 120 / (120 + 60)
    # (a fresh detector: this one saw the job wait 240 s, then a later milestone: a restart)
    assert Physics().score(eight) == pytest.approx(np.full(8, 120.0 / 180.0))
    _never(one, since_pause=120.0, stall=130.0)  # 'loading checkpoint' 10 s after the milestone
    assert det.score(one)[0] == pytest.approx(120.0 / 600.0)
    _never(one, since_pause=120.0)  # start-up lines ('> building model'), no milestone yet
    assert det.score(one)[0] == pytest.approx(120.0 / 600.0)
    other = _one_gpu(1, model="some new GPU")  # an unknown model: the generic 120 s as well
    _never(other, since_pause=60.0, stall=60.0)
    assert Physics().score(other)[0] == pytest.approx(0.5)  # (a new job: no earlier waits)


def test_a_real_start_up_log_reads_as_its_measured_milestone() -> None:
    """The real H200 run's start-up lines ('> building model ...' then '> initialized
    distributed ...', one read) through the log parser: a milestone, so the short allowance;
    a checkpoint load read after it keeps the start-up open (the long one)."""
    from exporters.logmetrics.parser import LogState

    first = [
        "> building model: hidden=16384 dim=4096 micro-batch=8192 mode=healthy_ckpt",
        "> initialized distributed with backend nccl, world size 1, rank 0",
    ]
    logs = LogState()
    logs.feed_job("5", first, 1000.0)
    js = logs.jobs["5"]
    f = _one_gpu(1, start=1030.0)
    _never(f, since_pause=1030.0 - js.last_pause, stall=1030.0 - max(js.last_progress.values()))
    assert Physics().score(f)[0] == pytest.approx(30.0 / 120.0)
    logs.feed_job("5", [" loading checkpoint from /nas/megatron_gpt/ at iteration 100"], 1005.0)
    _never(f, since_pause=1030.0 - js.last_pause, stall=1030.0 - max(js.last_progress.values()))
    assert Physics().score(f)[0] == pytest.approx(25.0 / 600.0)


def test_start_up_work_read_with_the_milestone_before_it_keeps_the_long_allowance() -> None:
    """A milestone and a checkpoint load after it in one read (a poll that caught both, or a
    backlog read at start) share the read's time; the load must still open the start-up work.
    Failed before: the two dated alike read as 'milestone last', so 30 s into the load scored
    3.0 (H200 10 s) and a healthy resume was a never-started hang."""
    from exporters.logmetrics.parser import LogState

    logs = LogState()
    logs.feed_job(
        "5",
        [
            "> initialized distributed with backend nccl, world size 1, rank 0",
            " loading checkpoint from /nas/megatron_gpt/ at iteration 100",
        ],
        1000.0,
    )
    js = logs.jobs["5"]
    f = _one_gpu(1, start=1030.0)
    _never(f, since_pause=1030.0 - js.last_pause, stall=1030.0 - max(js.last_progress.values()))
    assert Physics().score(f)[0] == pytest.approx(30.0 / 600.0, rel=1e-3)
    logs.feed_job("5", ["training ..."], 1200.0)  # the load done: the milestone is the latest
    _never(f, since_pause=1230.0 - js.last_pause, stall=1230.0 - max(js.last_progress.values()))
    assert Physics().score(f)[0] == pytest.approx(30.0 / 120.0)


def test_a_save_read_with_a_progress_line_without_step_time_is_no_start_up() -> None:
    """A progress line that reports no step time and the checkpoint save after it, in one read:
    the save is a pause after progress, not a start-up milestone. Failed before (contracts.md
    called it a known limit): 20 s into the save scored 2.0 (H200: 10 s)."""
    from exporters.logmetrics.parser import LogState

    logs = LogState()
    logs.feed_job("5", ["training ..."], 900.0)
    read = ["Epoch 1 | Step 120 | Loss: 2.3456", "saving checkpoint at iteration 120 to /x"]
    logs.feed_job("5", read, 1000.0)
    js = logs.jobs["5"]
    assert js.iteration_seconds is None
    f = _one_gpu(1, start=1020.0)
    _never(f, since_pause=1020.0 - js.last_pause, stall=1020.0 - max(js.last_progress.values()))
    assert Physics().score(f)[0] == pytest.approx(20.0 / 600.0, rel=1e-3)


def test_a_pause_after_iterating_keeps_the_long_allowance() -> None:
    f = _one_gpu(1)
    _never(f, since_pause=60.0, stall=61.0)  # a checkpoint save after the job iterated ...
    f.values[:, COL[F.ITER_SECONDS]] = 0.5
    assert Physics().score(f)[0] == pytest.approx(60.0 / 600.0)
    _never(f, since_pause=np.nan)  # no log at all: the job's age, the long allowance
    f.values[:, COL[F.JOB_AGE]] = 300.0
    assert Physics().score(f)[0] == pytest.approx(0.5)


def test_a_job_once_busy_has_started_whatever_its_log_says() -> None:
    """A log whose progress lines the catalogue does not know (no step time ever) after its
    milestone, or a log that says nothing: once its GPUs were busy, an idle moment (a save, an
    evaluation's data loading) is no never-started hang. Failed before: an hour in, a 20 s idle
    scored 30 (the milestone an hour old / 120 s) and 6.0 with no log (age / 600 s). A job that
    never got busy is still caught, and a pause after iterating keeps its long allowance."""
    det = Physics()
    f = _one_gpu(1)
    f.values[:, COL[F.JOB_AGE]] = 30.0  # the job trains: busy at age 30 s
    f.values[:, COL[F.ITER_SECONDS]] = np.nan
    assert det.score(f)[0] == 0.0
    for since_pause, stall in ((3600.0, 3600.0), (np.nan, np.nan)):
        _never(f, since_pause=since_pause, stall=stall)
        f.values[:, COL[F.JOB_AGE]] = 3600.0
        assert det.score(f)[0] == 0.0
    fresh = Physics()  # the same idle frame, never seen busy: a never-started hang
    _never(f, since_pause=3600.0, stall=3600.0)
    assert fresh.score(f)[0] == pytest.approx(30.0)
    _never(f, since_pause=60.0, stall=61.0)  # a save after iterating: long allowance, busy or not
    f.values[:, COL[F.ITER_SECONDS]] = 0.5
    assert det.score(f)[0] == pytest.approx(60.0 / 600.0)


def test_busy_later_in_one_frame_does_not_start_the_job_earlier() -> None:
    """A whole recording scored at once: rows before the job's first busy sample are judged as
    not started; rows after it as started."""
    f = _one_gpu(3)
    _never(f, since_pause=40.0, stall=40.0)
    f.values[:, COL[F.JOB_AGE]] = [40.0, 50.0, 60.0]
    f.values[1, COL["DCGM_FI_DEV_GPU_UTIL"]] = 100.0
    s = Physics().score(f)
    assert s[0] == pytest.approx(40.0 / 120.0) and s[2] == 0.0


def test_a_frame_of_two_models_scores_each_row_by_its_own_model() -> None:
    """Each row takes its own model's priors: a frame of two models (one job on each) scores
    as the two one-model frames do (a frame of one model takes its priors as numbers)."""
    f = healthy_frame(jobs=2, nodes=1, gpus=8, steps=1, seed=5, start=400.0)
    on_a = f.job == f.job[0]
    _spin(f, np.arange(len(f)), sm=False)  # every GPU of each job spins, seen through power
    # only: the H200's spin_power_max_w says so, the generic priors have none
    f.values[:, COL[F.JOB_AGE]] = 400.0
    model = np.where(on_a, H200, "some new GPU").astype(object)
    mixed = Frame(f.time, f.job, f.node, f.gpu, f.values, model=model)
    whole = Physics()._rules(mixed)[0]
    for part in (np.flatnonzero(on_a), np.flatnonzero(~on_a)):
        alone = Physics()._rules(mixed.take(part))[0]
        np.testing.assert_array_equal(whole[part], alone)
    assert whole[on_a].max() == 2.0 and whole[~on_a].max() < 1.0


def _run(det: Physics, t: float, *, age: float, step: float, stall: float, since: float) -> float:
    """Score one sample of the one-GPU job at `t`: idle with memory held when it has no step
    time (`step` NaN), else training; the log's progress fields as given."""
    f = _one_gpu(1, start=t)
    if np.isnan(step):
        _never(f, since_pause=since, stall=stall)
    f.values[:, COL[F.ITER_SECONDS]] = step
    f.values[:, COL[F.STALL_SECONDS]] = stall
    f.values[:, COL[F.SINCE_PAUSE]] = since
    f.values[:, COL[F.JOB_AGE]] = age
    return float(det.score(f)[0])


def _started_in(det: Physics, startup: float, t: float = 0.0) -> None:
    """The job seen before its (next run's) start-up line at `t`, then training: `startup` s
    from its milestone to the latest step the next sample reads."""
    _run(det, t, age=t, step=np.nan, stall=np.nan, since=np.nan)
    _run(det, t + 5.0 + startup, age=t + 5.0 + startup, step=0.5, stall=1.0, since=startup + 1.0)


def test_a_restart_is_judged_by_the_start_up_it_was_seen_to_take() -> None:
    """A job seen starting (no step, then a step after a start-up line it watched being
    logged) keeps that start-up; its next run, hanging after the milestone, is scored against
    max(20 s, 3 x it) instead of the model's 120 s: 30 s after `training ...` scores 1.5, not
    0.25. A known slow starter (100 s: a silent compile) is left 300 s, not flagged at 120 s,
    even after a quick run (its cache warm): the longest start-up seen is kept. Fails on the
    code before: every run after a milestone had the model's 120 s."""
    quick, slow, unseen = Physics(), Physics(), Physics()
    _started_in(quick, 4.0)
    _started_in(slow, 100.0)
    _started_in(slow, 5.0, t=400.0)
    kw = {"step": np.nan}
    assert _run(quick, 900.0, age=900.0, stall=30.0, since=30.0, **kw) == pytest.approx(1.5)
    assert _run(slow, 900.0, age=900.0, stall=240.0, since=240.0, **kw) == pytest.approx(0.8)
    assert _run(unseen, 900.0, age=900.0, stall=30.0, since=30.0, **kw) == pytest.approx(0.25)


def test_a_start_up_logged_before_the_engine_watched_is_not_measured() -> None:
    """A detector started while the job was already up (its first sample has a step, or the
    start-up line is older than the engine's sight of the job) learns no start-up from it."""
    seen_running, came_late = Physics(), Physics()
    _run(seen_running, 0.0, age=0.0, step=0.5, stall=1.0, since=3600.0)
    _run(came_late, 0.0, age=0.0, step=np.nan, stall=np.nan, since=np.nan)
    _run(came_late, 5.0, age=5.0, step=0.5, stall=1.0, since=3600.0)
    for det in (seen_running, came_late):
        assert _run(det, 900.0, age=900.0, step=np.nan, stall=30.0, since=30.0) == pytest.approx(
            0.25
        )


def test_the_start_up_is_stored_by_name_and_old_baselines_still_load(tmp_path) -> None:
    """The measured start-up goes into the job's stored baseline (with its fitted progress
    gaps) and a restart under a new job id with the same name is judged by it; a baseline
    stored before the start-up was kept loads as it did (no start-up known)."""
    cfg = Config(interval_s=5.0, warmup_s=0.0, fit_rows=3, fit_cycles=3, learn_below=99.0)
    store = BaselineStore(tmp_path)
    eng = Engine(cfg, store)
    job = str(_one_gpu(1).job[0])
    for k, t in enumerate(np.arange(0.0, 300.0, 5.0)):
        f = _one_gpu(1, start=t)  # first seen before its log; then 'training ...' at 2 s
        f.values[:, COL[F.ITER_SECONDS]] = np.nan if k == 0 else 0.5
        f.values[:, COL[F.STALL_SECONDS]] = np.nan if k == 0 else 1.0 + (k % 3)
        f.values[:, COL[F.SINCE_PAUSE]] = np.nan if k == 0 else t - 2.0
        eng.step(f, t, {job: "llm"})
    store.flush()
    saved = store.load("llm", {"physics"} | set(eng.det))
    assert saved is not None and saved["physics"]["startup_"] == pytest.approx(1.0)  # 3 s - 2 s
    restarted, old = Physics(), Physics()
    restarted.set_job_state(job, saved["physics"])
    old.set_job_state(job, {"gap_": saved["physics"]["gap_"]})
    assert old.job_state(job) == {"gap_": saved["physics"]["gap_"], "startup_": None}
    kw = {"age": 900.0, "step": np.nan, "stall": 30.0, "since": 30.0}
    assert _run(restarted, 900.0, **kw) == pytest.approx(1.5)  # max(20 s, 3 x 1 s)
    assert _run(old, 900.0, **kw) == pytest.approx(0.25)  # the model's 120 s


def test_a_first_step_with_no_start_up_line_measures_nothing() -> None:
    """A job whose log dated no start-up before its first step (no milestone, only progress)
    has no start-up to learn, and a pause logged later (a save) is not taken for one. Failed
    before: the first row after the first save measured the save-to-step time as start-up."""
    det = Physics()
    _run(det, 0.0, age=0.0, step=np.nan, stall=np.nan, since=np.nan)
    _run(det, 5.0, age=5.0, step=0.5, stall=1.0, since=np.nan)  # iterating, no start-up line
    _run(det, 300.0, age=300.0, step=0.5, stall=1.0, since=4.0)  # a save began 4 s ago
    assert _run(det, 900.0, age=900.0, step=np.nan, stall=30.0, since=30.0) == pytest.approx(0.25)


def test_a_requeued_job_keeps_its_start_up_while_it_waits_to_restart() -> None:
    """A requeue keeps the job's id, and the job leaves Slurm's running set (so the engine
    drops it) until it restarts: the start-up seen in its run before still sets the allowance
    of its restart. Failed before: the drop forgot it (the model's 120 s again). Only the
    latest KEEP_ENDED jobs are kept."""
    det = Physics()
    _started_in(det, 4.0)
    job = str(_one_gpu(1).job[0])
    det.drop_jobs({job})
    kw = {"age": 900.0, "step": np.nan, "stall": 30.0, "since": 30.0}
    assert _run(det, 900.0, **kw) == pytest.approx(1.5)
    det._startup.update({f"old{i}": 1.0 for i in range(detector.perjob.KEEP_ENDED)})
    _started_in(det, 4.0, t=1000.0)
    assert len(det._startup) == detector.perjob.KEEP_ENDED and job in det._startup


def test_a_run_requeued_unstarted_leaves_its_restart_three_times_its_wait() -> None:
    """A healthy job whose first step compiles silently for longer than the model's allowance
    (120 s on one GPU after `training ...`; public first steps idle 51 s to ~300 s) is taken
    for a start-up hang and requeued; its restart compiles as long. The run that ended waiting
    200 s unstarted leaves the restart startup_factor x 200 s: it runs, where it was flagged
    at the same 120 s again (and the same verdict twice stops a job: stranded). The run ends
    when the job leaves the running set or when its restart logs a new milestone with no step
    between. A run that ended sooner (a crash 30 s after the milestone) shortens nothing."""
    job = str(_one_gpu(1).job[0])
    kw = {"step": np.nan, "stall": 200.0, "since": 200.0}
    det = Physics()
    assert _run(det, 0.0, age=0.0, step=np.nan, stall=np.nan, since=np.nan) == 0.0
    assert _run(det, 100.0, age=100.0, step=np.nan, stall=100.0, since=100.0) < 1.0
    assert _run(det, 200.0, age=200.0, **kw) > 1.0  # flagged: requeued, the job leaves
    det.drop_jobs({job})
    assert _run(det, 500.0, age=200.0, **kw) == pytest.approx(200.0 / 600.0)
    assert _run(det, 900.0, age=600.0, step=np.nan, stall=590.0, since=590.0) < 1.0
    assert _run(det, 920.0, age=620.0, step=np.nan, stall=610.0, since=610.0) > 1.0
    again = Physics()  # requeued and restarted between two samples: the new run's milestone
    _run(again, 0.0, age=0.0, step=np.nan, stall=np.nan, since=np.nan)
    assert _run(again, 200.0, age=200.0, **kw) > 1.0
    assert _run(again, 260.0, age=260.0, step=np.nan, stall=20.0, since=20.0) < 0.1
    assert _run(again, 800.0, age=800.0, step=np.nan, stall=560.0, since=560.0) < 1.0
    assert _run(again, 860.0, age=860.0, step=np.nan, stall=620.0, since=620.0) > 1.0
    early = Physics()  # ended 30 s after its milestone: the model's allowance still holds
    _run(early, 0.0, age=0.0, step=np.nan, stall=np.nan, since=np.nan)
    _run(early, 30.0, age=30.0, step=np.nan, stall=30.0, since=30.0)
    early.drop_jobs({job})
    assert _run(early, 500.0, age=100.0, step=np.nan, stall=100.0, since=100.0) < 1.0
    assert _run(early, 530.0, age=130.0, step=np.nan, stall=130.0, since=130.0) > 1.0
    started = Physics()  # a run that reached its first step leaves nothing of the kind
    _started_in(started, 4.0)
    started.drop_jobs({job})
    assert not started._at_least


def test_a_start_up_wait_ends_at_a_new_milestone_not_at_a_gap_and_stays_bounded() -> None:
    """A job missing from one cycle (a lost scrape, its label late) is the same run: its wait
    goes on, not tripled (failed when a drop ended it). A restart that then starts quickly
    forgets the long wait: its next hang after a milestone is caught by the measured start-up
    (max(20 s, 3 x 4 s)). Repeated start-up hangs stretch the allowance to pause_allowance_s
    (600 s) at most."""
    job = str(_one_gpu(1).job[0])
    gap = Physics()
    _run(gap, 0.0, age=0.0, step=np.nan, stall=np.nan, since=np.nan)
    _run(gap, 100.0, age=100.0, step=np.nan, stall=100.0, since=100.0)
    gap.drop_jobs({job})
    assert _run(gap, 130.0, age=0.0, step=np.nan, stall=130.0, since=130.0) > 1.0
    quick = Physics()
    _run(quick, 0.0, age=0.0, step=np.nan, stall=np.nan, since=np.nan)
    assert _run(quick, 200.0, age=200.0, step=np.nan, stall=200.0, since=200.0) > 1.0
    _started_in(quick, 4.0, t=300.0)  # the restart: a new milestone, its first step 4 s on
    quick.drop_jobs({job})
    assert _run(quick, 900.0, age=60.0, step=np.nan, stall=60.0, since=60.0) > 1.0
    hangs = Physics()
    for k in range(4):  # the same start-up hang, requeued again and again
        t = 1000.0 * k
        _run(hangs, t, age=0.0, step=np.nan, stall=0.0, since=0.0)
        _run(hangs, t + 900.0, age=900.0, step=np.nan, stall=900.0, since=900.0)
    assert _run(hangs, 4000.0, age=0.0, step=np.nan, stall=0.0, since=0.0) == 0.0
    assert _run(hangs, 4610.0, age=610.0, step=np.nan, stall=610.0, since=610.0) > 1.0

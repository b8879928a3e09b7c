"""A job's baseline follows the job: a run's start-up is never learned as its normal, and a
job-wide shift its progress calls healthy, held for `relearn_s`, becomes the new normal.

Seen on the quickstart's own stack: a job hung as its warm-up ended, was requeued, and its first
fit learned the restart's start-up (every rank spinning at idle power in its first collective,
no step yet); back at work, every GPU sat at deviation 0.99 (capped by the phase rule, its
progress calm) for good, and the baseline stored by its name carried that on."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from detector import fields as F
from detector.learning import settling
from detector.pipeline import Config, Engine
from detector.synthetic import healthy_frame

COL = {n: i for i, n in enumerate(F.ALL_FIELDS)}
SPIN = {  # ranks in their first collective: busy at idle power (failures.md, H200)
    "DCGM_FI_DEV_GPU_UTIL": 100.0,
    "DCGM_FI_DEV_POWER_USAGE": 125.0,
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.99,
    "DCGM_FI_PROF_SM_ACTIVE": 0.01,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.0,
    "DCGM_FI_PROF_DRAM_ACTIVE": 0.0,
}


def _run(frame, **cfg):
    eng = Engine(Config(warmup_s=60.0, **cfg))
    out = []
    for rows in frame.instants():
        t = float(frame.time[rows[0]])
        res = eng.step(frame.take(rows), t, None)
        jobs = res.jobs
        dev = jobs[jobs.detector == "deviation"].score
        out.append((t, float(dev.max()) if len(dev) else 0.0))
    return eng, out


IDLE = {  # a restart's start-up as on the quickstart: GPUs idle, the model's memory held
    "DCGM_FI_DEV_GPU_UTIL": 0.0,
    "DCGM_FI_DEV_POWER_USAGE": 123.0,
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.0,
    "DCGM_FI_PROF_SM_ACTIVE": 0.0,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.0,
    "DCGM_FI_PROF_DRAM_ACTIVE": 0.0,
}


def _starting_up(frame, mask, since, look=IDLE):
    """Rows of a restarted run before its first step: the start-up pause open (the log's
    milestone dates both progress and pause), no step time."""
    v = frame.values
    for name, value in look.items():
        v[mask, COL[name]] = value
    v[mask, COL[F.ITER_SECONDS]] = np.nan
    v[mask, COL[F.STALL_SECONDS]] = frame.time[mask] - since
    v[mask, COL[F.SINCE_PAUSE]] = frame.time[mask] - since


def _reservoir(eng, job="100"):
    info = eng.base.jobs[job]
    return info.rows[: min(info.seen, len(info.rows))] if info.rows is not None else None


def test_settling_marks_a_runs_start_up_and_first_steps():
    f = healthy_frame(jobs=1, nodes=1, gpus=1, steps=30, seed=2)
    _starting_up(f, (f.time >= 10) & (f.time < 15), since=10.0)
    back = f.time >= 15  # stepping from 15 s at 0.5 s: settled 40 steps (20 s) after the line
    f.values[back, COL[F.SINCE_PAUSE]] = f.time[back] - 10.0
    f.values[back, COL[F.STALL_SECONDS]] = 1.0
    assert settling(f).tolist() == [t >= 10 and t < 30 for t in f.time]
    f.values[back, COL[F.ITER_SECONDS]] = 2.0  # slow steps: 40 of them take 80 s
    assert settling(f).tolist() == [t >= 10 and t < 90 for t in f.time]
    f.values[:, COL[F.SINCE_PAUSE]] = np.nan  # no pause line: nothing known of a start-up
    assert not settling(f).any()


def test_a_restarts_slow_first_steps_are_not_its_step_time():
    """The quickstart's restart stepped 2.2 s, 1.7 s, then 1.2 s; the first fit, made of those
    first steps alone, took 2.2 s for the job's step time (a slowdown to 1.8x would not have
    been seen). Its first 40 steps' worth of time after the start-up line are not learned."""
    f = healthy_frame(jobs=1, nodes=1, steps=120, seed=8, step_s=1.2)
    hang = (f.time >= 65) & (f.time < 100)  # as there: a hang as warm-up ended, then requeued
    for name, value in SPIN.items():
        f.values[hang, COL[name]] = value
    f.values[hang, COL[F.STALL_SECONDS]] = f.time[hang] - 65
    since = f.time - 100.0
    run = f.time >= 100
    f.values[run, COL[F.SINCE_PAUSE]] = since[run]
    f.values[run & (f.time < 120), COL[F.ITER_SECONDS]] = np.nan  # start-up: no step yet
    f.values[run & (f.time < 120), COL[F.STALL_SECONDS]] = since[run & (f.time < 120)]
    slow = run & (f.time >= 120) & (f.time < 160)
    f.values[slow, COL[F.ITER_SECONDS]] = np.where(f.time[slow] < 140, 2.2, 1.7)
    eng = Engine(Config(warmup_s=60.0))
    learned = {}
    for rows in f.instants():
        t = float(f.time[rows[0]])
        eng.step(f.take(rows), t, None)
        learned[t] = eng.det["progress"].typical_steps(f.take(rows))["value"].tolist()
    fitted = [v for v in learned.values() if v]
    assert fitted and all(v == [pytest.approx(1.2, rel=0.05)] for v in fitted), fitted


def test_a_restarts_start_up_is_never_learned():
    """Trained past warm-up, restarted, 120 s of start-up (idle, calm: nothing alarms on it),
    then training: the reservoir holds training alone. The quickstart's first fit counted such
    rows, and fitted early on a handful of busy ones."""
    f = healthy_frame(jobs=1, nodes=1, steps=120, seed=3)
    _starting_up(f, (f.time >= 75) & (f.time < 195), since=75.0)
    eng, dev = _run(f)
    rows = _reservoir(eng)
    assert rows is not None and len(rows) >= 24
    assert (rows[:, COL["DCGM_FI_DEV_GPU_UTIL"]] > 90).all()
    assert max(s for t, s in dev if t >= 300) < 0.5


def test_the_start_up_gate_leaves_jobs_without_a_log_alone():
    """No progress input at all: every calm row past warm-up is learned, as before."""
    f = healthy_frame(jobs=1, nodes=1, steps=60, seed=4)
    f.values[:, COL[F.ITER_SECONDS]] = np.nan
    f.values[:, COL[F.STALL_SECONDS]] = np.nan
    eng, _ = _run(f)
    assert eng.base.jobs["100"].fitted_at is not None


POWER = F.GAUGE_NAMES.index("DCGM_FI_DEV_POWER_USAGE")


def _shifted(slower: float = 1.0, steps: int = 400):
    """Power and clocks move job-wide for good from 600 s (a new stage of training), the job
    stepping `slower` times its pace."""
    f = healthy_frame(jobs=1, nodes=1, steps=steps, seed=5)
    shift = f.time >= 600
    f.values[shift, COL["DCGM_FI_DEV_POWER_USAGE"]] -= 170.0  # ~690 W -> ~520 W
    f.values[shift, COL["DCGM_FI_DEV_SM_CLOCK"]] -= 200.0
    f.values[shift, COL[F.ITER_SECONDS]] *= slower
    return f


@pytest.mark.parametrize("slower", [1.0, 1.15])
def test_a_lasting_healthy_shift_becomes_the_new_normal(slower):
    """At its pace, or 15 % slower (pace 0.7-0.9, under its alert level: the relearning once
    waited for it to fall under 0.5 and, its reservoir emptied, learned nothing for good): capped
    as a phase at first, learned after `relearn_s`, then calm again."""
    eng, dev = _run(_shifted(slower), relearn_s=300.0)
    during = [s for t, s in dev if 640 <= t < 900]
    assert during and all(0.95 <= s < 1.0 for s in during), during  # a phase: capped
    late = [s for t, s in dev if t >= 1200]
    assert max(late) < 0.5, late
    assert abs(eng.det["deviation"].busy_med_[0, POWER] - 520.0) < 20


def test_a_phase_shorter_than_relearn_s_leaves_the_baseline():
    """The default `relearn_s` (30 min) outlasts a long evaluation pass: the same shift held 20
    minutes is still a phase, the training baseline kept."""
    eng, dev = _run(_shifted(steps=360))
    assert all(0.95 <= s < 1.0 for t, s in dev if 640 <= t)
    assert abs(eng.det["deviation"].busy_med_[0, POWER] - 690.0) < 20


def test_a_slowdown_is_never_learned_as_normal():
    """The same shift with the job stepping 60 % slower is no phase: it alerts (progress' pace)
    and is never relearned, however long it lasts: the baseline stays the training's."""
    eng, dev = _run(_shifted(1.6), relearn_s=300.0)
    late = [s for t, s in dev if t >= 1200]
    assert min(late) >= 1.0, late
    assert abs(eng.det["deviation"].busy_med_[0, POWER] - 690.0) < 20


def test_a_job_back_under_its_id_does_not_learn_its_last_entrys_rows():
    """A job that left the frame (a missed scrape, a requeue keeping its id) and came back is a
    new entry: rows its last entry took, still waiting out `learn_delay_s`, are dropped (they
    were learned at once, the onset of a hang among them), and it is not kept 'hot'."""
    f = healthy_frame(jobs=1, nodes=1, steps=40, seed=7)
    hang = f.time >= 150
    for name, value in SPIN.items():
        f.values[hang, COL[name]] = value
    eng = Engine(Config(warmup_s=60.0))

    def cycle(rows, t):  # as the service runs it: the jobs not in the frame end
        eng.step(f.take(rows), t, None)
        eng.end_jobs(set(f.job[rows].tolist()))

    for rows in f.instants():
        t = float(f.time[rows[0]])
        cycle(rows[:0] if 160 <= t < 170 else rows, t)  # gone for two cycles at 160 s
    assert eng.base.jobs["100"].first_seen == 170.0  # back as a new entry
    rows = _reservoir(eng)
    assert rows is None or (rows[:, COL["DCGM_FI_DEV_POWER_USAGE"]] > 600).all()
    cycle(f.instants()[0][:0], 1000.0)  # the job ends
    assert "100" not in eng.base._hot


def test_a_faults_first_samples_are_never_learned():
    """A spin hang 5 s after warm-up, for a minute, then training again: the hang's first
    samples score calm until the persistence window fills, and were learned (two of the three
    rows the quickstart's first fit had were such an onset, util 100 % at 125 W). Rows wait
    `learn_delay_s` for the job to stay calm: the reservoir fills with training alone."""
    f = healthy_frame(jobs=1, nodes=1, steps=100, seed=6)
    hang = (f.time >= 65) & (f.time < 125)
    for name, value in SPIN.items():
        f.values[hang, COL[name]] = value
    f.values[hang, COL[F.STALL_SECONDS]] = f.time[hang] - 65
    eng, _ = _run(f)
    info = eng.base.jobs["100"]
    assert info.seen > 0 and info.rows is not None
    power = info.rows[: min(info.seen, len(info.rows)), COL["DCGM_FI_DEV_POWER_USAGE"]]
    assert (power > 600).all(), power


def test_a_restarts_start_up_pause_stays_open_in_replay():
    """A recording's iteration counter moved in the sample after the exporter stamped the
    restart (its start-up line dates progress and pause alike, 2.4 s before the sample): the
    stamp is the time, so the start-up pause stays open. Read as progress at the sample's
    time, it closed the pause, and the restart's idle start-up scored as an idle hang."""
    from detector.frame import join_progress

    gpu = pd.DataFrame({"time": [1000.0, 1005.0, 1010.0], "job_id": ["7"] * 3})
    jobs = pd.DataFrame(
        {
            "time": [1000.0, 1005.0, 1010.0],
            "job_id": ["7"] * 3,
            F.ITERATION: [10.0, 20.0, 20.0],
            F.LAST_PROGRESS: [990.0, 1002.6, 1002.6],
            F.LAST_PAUSE: [900.0, 1002.6, 1002.6],
        }
    )
    out = join_progress(gpu, jobs)
    assert out[F.LAST_PROGRESS].tolist() == [990.0, 1002.6, 1002.6]
    stale = jobs.assign(**{F.LAST_PROGRESS: [990.0, 990.0, 990.0]})
    assert join_progress(gpu, stale)[F.LAST_PROGRESS].tolist() == [990.0, 1005.0, 1005.0]

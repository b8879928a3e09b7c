"""A job slowed after its first steps and before its first fit (issue 15): its rows are never
calm, so the fit never learns the slow pace, and before this the pace detector, comparing only
with a fit, never scored it (the cold-start row host-straggler-2node-early: 0 of 3 detected).
Now it compares with the fastest step the run logged so far, as the log reports step times: a
line every 10 s, the first ones slow (the simulator's and a real restart's first steps)."""

from __future__ import annotations

import numpy as np

from detector import fields as F
from detector.frame import Frame
from detector.pipeline import Config, Engine, Result
from detector.synthetic import healthy_frame
from detector.thresholds import level

COL = {n: i for i, n in enumerate(F.ALL_FIELDS)}
JOB = "100"
LINE_S = 10.0  # the log prints a step line this often
UP_S = 20.0  # the start-up milestone (`training ...`), then the first step lines


def _sample(t: float, step: float, pause_at: float = 0.0) -> Frame:
    """The one-GPU job at `t`, training, its latest step line (`step` s a step) logged on the
    last multiple of LINE_S, its latest pause (start-up) opened at `pause_at`."""
    f = healthy_frame(jobs=1, nodes=1, gpus=1, steps=1, seed=int(t), start=t)
    f.values[:, COL[F.ITER_SECONDS]] = step
    f.values[:, COL[F.STALL_SECONDS]] = t % LINE_S
    f.values[:, COL[F.SINCE_PAUSE]] = t - pause_at
    return f


def _run(eng: Engine, steps: list[float], t0: float = 0.0) -> list[Result]:
    """A run: each entry the step time of one log line (from UP_S after `t0`), sampled at 5 s."""
    out = []
    for k, step in enumerate(steps):
        for dt in (0.0, 5.0):
            t = t0 + UP_S + LINE_S * k + dt
            out.append(eng.step(_sample(t, step, pause_at=t0), t, {JOB: "trainer"}))
    return out


def _pace(res: Result) -> float:
    return float(res.jobs.query("detector == 'pace'").score.iloc[0])


WARM_UP = [2.1, 1.6, 1.2, 1.21, 1.19, 1.2, 1.22, 1.2]  # slow first steps, then its pace


def test_slower_than_its_fastest_steps_before_the_first_fit_is_slow() -> None:
    """Healthy for 60 s after its warm-up, then 1.6 x slower (a host straggler): over the alert
    level from the second slow line on, while the engine has fitted nothing."""
    eng = Engine(Config(interval_s=5.0))
    res = _run(eng, [*WARM_UP, *[1.92] * 6])
    assert JOB not in eng.det["progress"].jobs_  # no fit: the run's own steps
    scores = [_pace(r) for r in res]
    onset = 2 * len(WARM_UP)
    assert max(scores[:onset]) < 0.05
    assert max(scores[: onset + 2]) < level("pace")  # one slow line is not yet a slowdown
    assert min(scores[onset + 2 :]) >= level("pace")


def test_a_healthy_start_with_slow_first_steps_and_noise_is_not_slow() -> None:
    """Slow first steps then its pace with a few per cent of noise, for 5 minutes: never near
    the alert level."""
    rng = np.random.default_rng(7)
    eng = Engine(Config(interval_s=5.0))
    steps = [*WARM_UP, *(1.2 * (1 + 0.04 * rng.standard_normal(30)))]
    assert max(_pace(r) for r in _run(eng, steps)) < 0.5 * level("pace")


def test_a_restart_under_the_same_id_is_compared_with_its_earlier_run() -> None:
    """The job leaves (requeued) and comes back under its id: its restart's slow first steps
    settle as a fresh start's do; a restart slower than the run before once they settled (on
    a slow node) is slow, as a fitted job's restart is against its stored baseline."""
    eng = Engine(Config(interval_s=5.0))
    _run(eng, WARM_UP)
    eng.end_jobs(set())
    again = _run(eng, [2.6, 2.6, 2.0, *WARM_UP[2:]], t0=1000.0)
    assert max(_pace(r) for r in again) < 0.05
    eng.end_jobs(set())
    slow = _run(eng, [2.6, 2.6, *[1.9] * 10], t0=2000.0)
    assert _pace(slow[-1]) >= level("pace")


def test_a_job_settling_a_little_slower_than_its_first_steps_is_still_learned() -> None:
    """Its first steps at 1.0 s, then 1.18 x slower for good (clocks falling from their boost,
    a longer sequence phase): under the alert level the early comparison says nothing, so the
    rows stay calm and the job gets its first fit (before, the score sat at ~0.5, over the
    reservoir's learning gate, and the job was never fitted)."""
    eng = Engine(Config(interval_s=5.0))
    res = _run(eng, [1.6, 1.0, 1.0, 1.01, 0.99, *[1.18] * 40])
    assert max(_pace(r) for r in res) < level("pace")
    assert JOB in eng.det["progress"].jobs_


def _at(t: float, step: float, line: float, pause_at: float) -> Frame:
    f = _sample(t, step, pause_at)
    f.values[:, COL[F.STALL_SECONDS]] = t - line
    return f


def test_a_save_does_not_clear_a_slowdown_seen_before_it() -> None:
    """Slowed before its first fit, then a 20 s checkpoint save: the job was slow when the
    save began, so its steps after it do not settle (its alert would clear at every save)."""
    eng = Engine(Config(interval_s=5.0))
    res = _run(eng, [*WARM_UP, *[1.92] * 4])
    assert _pace(res[-1]) >= level("pace")
    last = UP_S + LINE_S * (len(WARM_UP) + 3)  # its latest step line
    save = last + 7.0
    t = last + 10.0
    after = []
    while t <= save + 60.0:
        line = last if t < save + 20.0 else save + 20.0 + LINE_S * ((t - save - 20.0) // LINE_S)
        after.append(_pace(eng.step(_at(t, 1.92, line, save), t, {JOB: "trainer"})))
        t += 5.0
    assert min(after) >= level("pace")


def test_more_unfitted_jobs_than_the_ended_bound_are_all_scored() -> None:
    """5,000 one-GPU jobs, none fitted, one of them slowed: running jobs are never evicted
    (only those that left are bounded), so it is still scored."""
    from detector.progress import Progress

    det = Progress()
    n = 5_000
    for k, step in enumerate([*WARM_UP, 1.92, 1.92]):
        for dt in (0.0, 5.0):
            t = UP_S + LINE_S * k + dt
            f = healthy_frame(jobs=n, nodes=1, gpus=1, steps=1, seed=k, start=t)
            f.values[:, COL[F.ITER_SECONDS]] = 1.2
            f.values[-1, COL[F.ITER_SECONDS]] = step
            f.values[:, COL[F.STALL_SECONDS]] = dt
            f.values[:, COL[F.SINCE_PAUSE]] = t
            slow = det.parts(f)[1]
    assert slow[-1] >= level("pace") and slow[:-1].max() == 0.0

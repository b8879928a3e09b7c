"""A restarted job (Goodput's requeue or Slurm's: same job id, one log file) has no step time
of its own until its new run's first step. Fails on the code before: the earlier run's step
time survived the new run's start-up milestone, so the physics `never_started` rule read the
job as "iterated" and gave a hang right after the restart the long 600 s allowance instead of
the short one (120 s on one GPU): caught ~10 minutes late."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from detector import fields as F
from detector.frame import Frame
from detector.physics import Physics
from detector.synthetic import healthy_frame
from exporters.logmetrics.exporter import LogMetrics
from exporters.logmetrics.parser import LogState

COL = {n: i for i, n in enumerate(F.ALL_FIELDS)}
STEP = (  # Megatron's progress line (the catalogue's example)
    " iteration {it:>8}/  500000 | consumed samples: {s:>11} | elapsed time per iteration"
    " (ms): {ms} | learning rate: 3.000E-04 | global batch size: 512 | lm loss: 2.345678E+00 |"
    " number of skipped iterations: 0 | number of nan iterations: 0 |"
)
REQUEUE = (
    "slurmstepd: error: *** JOB 42 ON node1 CANCELLED AT 2026-12-01T10:05:00 DUE TO JOB REQUEUE ***"
)
RESTART = [  # the new run's start-up, in the same log (Slurm appends): resume, then start
    "> building GPT model ...",
    " loading checkpoint from /checkpoints/gpt at iteration 2000",
    "[after dataloaders are built] datetime: 2026-12-01 10:07:00",
    "training ...",
]


def _restarted(logs: LogState) -> None:
    """Job 42 iterates at 512.3 ms, is requeued at 1300, restarts; its milestone at 1420."""
    logs.feed_job("42", [STEP.format(it=i, s=i * 512, ms=512.3) for i in (1990, 2000)], 1200.0)
    logs.feed_job("42", [REQUEUE], 1300.0)
    logs.feed_job("42", RESTART[:2], 1360.0)
    logs.feed_job("42", RESTART[2:], 1420.0)


def test_the_new_runs_milestone_drops_the_earlier_runs_step_time(tmp_path: Path) -> None:
    logs = LogState()
    logs.feed_job("42", [STEP.format(it=2000, s=1024000, ms=512.3)], 1200.0)
    js = logs.jobs["42"]
    assert js.iteration_seconds == pytest.approx(0.5123) and js.throughput is not None
    _restarted(logs)
    assert js.iteration_seconds is None and js.throughput is None  # not this run's rate
    assert js.iteration == 2000.0  # the counter is the job's: it resumes from there
    assert js.last_progress == {"": 1420.0} and js.last_pause == 1420.0
    m = LogMetrics(tmp_path)
    m.state = logs
    names = {s.name for fam in m.collect() for s in fam.samples if s.labels.get("job_id") == "42"}
    assert "goodput_job_iteration_seconds" not in names  # absent on the wire, not stale
    assert "goodput_job_last_progress_timestamp_seconds" in names
    logs.feed_job("42", [STEP.format(it=2001, s=1024512, ms=610.0)], 1421.0)  # its first step
    assert js.iteration_seconds == pytest.approx(0.61)


def test_a_hang_right_after_a_restart_scores_on_the_short_allowance() -> None:
    """GPU idle with memory held 240 s after the restart's milestone, no step yet: 240 / 120 s
    (one GPU) = 2.0. Before: 240 / 600 s = 0.4, no alert for another six minutes."""
    logs = LogState()
    _restarted(logs)
    js = logs.jobs["42"]
    now = 1660.0
    f = healthy_frame(jobs=1, nodes=1, gpus=1, steps=1, seed=3, start=now)
    f = Frame(f.time, f.job, f.node, f.gpu, f.values, model=np.full(len(f), "NVIDIA H200", object))
    step = np.nan if js.iteration_seconds is None else js.iteration_seconds
    f.values[:, COL["DCGM_FI_DEV_GPU_UTIL"]] = 0.0
    f.values[:, COL["DCGM_FI_DEV_POWER_USAGE"]] = 124.0
    f.values[:, COL[F.ITER_SECONDS]] = step
    f.values[:, COL[F.STALL_SECONDS]] = now - max(js.last_progress.values())
    f.values[:, COL[F.SINCE_PAUSE]] = now - (np.nan if js.last_pause is None else js.last_pause)
    f.values[:, COL[F.JOB_AGE]] = now - 1330.0  # the engine first saw the new run then
    assert Physics().score(f)[0] == pytest.approx(240.0 / 120.0)
    # the engine kept the job through a quick requeue: it saw the earlier run busy at 1200 s
    det = Physics()
    busy = healthy_frame(jobs=1, nodes=1, gpus=1, steps=1, seed=3, start=1200.0)
    busy = Frame(busy.time, busy.job, busy.node, busy.gpu, busy.values, model=f.model)
    busy.values[:, COL[F.JOB_AGE]] = 100.0
    assert det.score(busy)[0] == 0.0
    f.values[:, COL[F.JOB_AGE]] = 560.0
    assert det.score(f)[0] == pytest.approx(240.0 / 120.0)  # this run has not started
    f.values[:, COL[F.SINCE_PAUSE]] = f.values[:, COL[F.STALL_SECONDS]] = np.nan  # no log:
    assert Physics().score(f)[0] == pytest.approx(560.0 / 600.0)  # never busy: its age
    assert det.score(f)[0] == 0.0  # once busy, started


@pytest.mark.parametrize("load_s", [0.0, 90.0, 240.0, 300.0])
def test_a_healthy_restart_raises_nothing(tmp_path: Path, load_s: float) -> None:
    """The simulator's job trains, is requeued (Goodput's action, Slurm's verb), starts again
    on the same log (launcher lines, start-up, a checkpoint load of `load_s`, `training ...`),
    and trains on: no detector scores its job at alert level at any time (the engine counts
    a score of 1.0 as an alert), and no incident opens. Fails on the code before for the
    240 s and 300 s loads: progress kept the earlier run's 180 s stall allowance through the
    announced start-up (1.53), and deviation, not capped for a job-wide phase while progress
    alarmed, read the idle GPUs against the earlier run's baseline (5.9)."""
    from bench.inproc import Harness
    from exporters.sim import parse_scenario

    job = {"name": "again", "nodes": 1, "gpus_per_node": 2, "duration_s": 3600}
    job |= {"step_time_s": 1.2, "init_s": 40.0, "load_s": load_s, "checkpoint_every_s": 120}
    sc = parse_scenario({"name": "restart", "duration_s": 900 + load_s, "nodes": 2, "jobs": [job]})
    h = Harness(sc, 7, tmp_path)
    peak: dict[str, float] = {}
    step = h.engine.step

    def record(frame, now, names=None):  # type: ignore[no-untyped-def]
        res = step(frame, now, names)
        for det, score in zip(res.job_cols["detector"], res.job_cols["score"], strict=True):
            peak[det] = max(peak.get(det, 0.0), float(score))
        return res

    h.engine.step = record  # type: ignore[method-assign]
    try:
        h.run_until(sc.start + 360)
        (j,) = h.sim.cluster.jobs.values()
        assert j.state == "RUNNING" and j.iteration > 100
        h.sim.cluster.requeue(j.job_id)
        peak.clear()  # the restart and the new run from here
        h.run_until(sc.start + 840 + load_s)
        assert j.restarts == 1 and j.state == "RUNNING" and j.last_progress_t > j.start_t
        js = h.logs.jobs[j.job_id]
        assert js.iteration_seconds == pytest.approx(1.2, rel=0.3)  # the new run's own
        assert peak and max(peak.values()) < 1.0, peak
        assert not h.incidents
    finally:
        h.close()


def test_slurms_job_end_line_opens_the_next_runs_start_up_a_step_end_does_not() -> None:
    """From the requeue's `*** JOB ... CANCELLED` line the job is between runs: progress dated
    then (the earlier run's last step must not read as a stall through the restart's init),
    start-up work open 1 ms after it (the long allowance, no idle_hang), no step time. A
    `*** STEP 42.0 ...` line ends one step of the run, not the run."""
    logs = LogState()
    logs.feed_job("42", [STEP.format(it=2000, s=1024000, ms=512.3)], 1200.0)
    js = logs.jobs["42"]
    logs.feed_job("42", [REQUEUE.replace("JOB 42", "STEP 42.0")], 1250.0)
    assert js.iteration_seconds == pytest.approx(0.5123) and js.last_progress == {"": 1200.0}
    logs.feed_job("42", [REQUEUE], 1300.0)
    assert js.iteration_seconds is None and js.last_progress == {"": 1300.0}
    assert js.last_pause == pytest.approx(1300.001)


def test_a_hang_right_after_a_restart_is_caught_on_the_short_allowance(tmp_path: Path) -> None:
    """The simulator's job trains, is requeued, and its new run hangs host-side from its start
    (the dataloader stall: GPUs idle, memory held, no step): the physics detector scores the
    job at alert level 3 x the start-up it saw in the first run after the new run's milestone
    (25 s here: the first progress line comes 10 warm-up iterations after the first step),
    sooner than the model's 120 s + 20 s x log2(2 GPUs). Before: the engine kept the job
    through the quick requeue, its earlier run's busy GPUs read as this run's start, and
    nothing scored (the earlier run's step time, when the job was dropped, gave the 600 s
    allowance); before the job's own start-up was kept, it scored at 140 s."""
    from bench.inproc import Harness
    from exporters.sim import parse_scenario

    job = {"name": "again", "nodes": 1, "gpus_per_node": 2, "duration_s": 3600}
    job |= {"step_time_s": 1.2, "init_s": 40.0, "checkpoint_every_s": 120}
    sc = parse_scenario({"name": "restart", "duration_s": 900, "nodes": 2, "jobs": [job]})
    h = Harness(sc, 7, tmp_path)
    first: list[float] = []
    step = h.engine.step

    def record(frame, now, names=None):  # type: ignore[no-untyped-def]
        res = step(frame, now, names)
        c = res.job_cols
        if any(d == "physics" and s >= 1.0 for d, s in zip(c["detector"], c["score"], strict=True)):
            first.append(now)
        return res

    h.engine.step = record  # type: ignore[method-assign]
    try:
        h.run_until(sc.start + 360)
        (j,) = h.sim.cluster.jobs.values()
        h.sim.cluster.requeue(j.job_id)
        h.step()
        assert j.state == "RUNNING" and j.restarts == 1
        j.stall = "host"  # the new run never reaches its first step
        first.clear()
        h.run_until(sc.start + 700)
        milestone = h.logs.jobs[j.job_id].last_pause
        assert milestone is not None and milestone > sc.start + 360
        assert first, "never scored"
        (seen,) = h.engine.det["physics"]._startup.values()
        assert 15.0 <= seen <= 30.0
        assert 3 * seen <= first[0] - milestone <= 3 * seen + 10.0 < 140.0
        assert h.logs.jobs[j.job_id].iteration_seconds is None
    finally:
        h.close()

"""slurmctld SIGKILLed right after Goodput acted, on the local stack's real Slurm (22.05).

slurmctld saves its state at most every 5 s, so it comes back without its last seconds of
changes: the action Goodput executed and verified is gone from Slurm. The reconcile pass after
the restart sees the controller's new start, finds the effect gone and applies it again."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from sqlalchemy import select

from recovery import actions, audit, failpoints, outbox, reconciler
from recovery.store import make_engine
from tests.chaos.harness import restore_stack
from tests.conftest import wait_until
from tests.helpers import SlurmJobs, diagnosis


def _kill_slurmctld_at_executed(stack: dict[str, str], monkeypatch) -> None:
    """SIGKILL slurmctld at the `executed` failpoint: every scheduler step is done and
    verified, nothing is recorded yet."""
    pid = int(Path(stack["GOODPUT_STACK_DIR"], "run", "slurmctld.pid").read_text())
    real = failpoints.hit

    def hit(point: str) -> None:
        if point == "executed":
            os.kill(pid, signal.SIGKILL)
        real(point)

    monkeypatch.setattr(failpoints, "hit", hit)


def _effects_lost(engine, action_id: str) -> list[dict]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(audit.audit.c.payload).where(
                audit.audit.c.action_id == action_id, audit.audit.c.type == "effect_lost"
            )
        ).all()
    return [json.loads(r.payload) for r in rows]


def _act_then_lose_it(local_stack, tmp_path, monkeypatch, jobs, job, outcome, node):
    """Execute the policy's action for `outcome` on `job`, SIGKILL slurmctld as it is
    recorded, start slurmctld again. Returns (engine, settings, action)."""
    settings = jobs.settings("act")
    engine = make_engine(f"sqlite:///{tmp_path / 'actions.db'}")
    reconciler.reconcile(engine, settings)  # the store learns this controller's start
    time.sleep(6)  # past Slurm's 5 s between saves: the action's first change is saved at once
    _kill_slurmctld_at_executed(local_stack, monkeypatch)
    inc, d = diagnosis(jobs.tag, job, node, outcome, "xid79" if node else "cuda_oom", 0.95)
    try:
        a = actions.on_diagnosis(engine, settings, inc, d)
        assert a["state"] == "executed", a
    finally:
        monkeypatch.undo()
        monkeypatch.setenv("GOODPUT_ACTIONS_THREAD", "0")
        time.sleep(1)  # the controller start time has whole seconds
        restore_stack({**os.environ, **local_stack})
    return engine, settings, a


def _running(jobs: SlurmJobs) -> tuple[str, str]:
    """A new test job once it runs: (job id, its node)."""
    job = jobs.submit()
    s = wait_until(lambda: (s := jobs.sched.job_state(job)) and s.state == "RUNNING" and s, 30)
    return job, s.nodes[0]


def test_a_requeue_slurmctld_forgot_is_applied_again(local_stack, tmp_path, monkeypatch):
    monkeypatch.setenv("GOODPUT_ACTIONS_THREAD", "0")
    jobs = SlurmJobs("gprestart")
    try:
        job, node = _running(jobs)
        engine, settings, a = _act_then_lose_it(
            local_stack, tmp_path, monkeypatch, jobs, job, "gpu_hardware_fault", node
        )
        after = jobs.sched.job_state(job)
        print(f"after the restart: {after}, {jobs.sched.node_state(node)}")
        assert after.restarts == 0 or after.held, f"Slurm kept the requeue: {after}"

        reconciler.reconcile(engine, settings)
        lost = _effects_lost(engine, a["id"])
        assert len(lost) == 1 and lost[0]["lost"], lost
        done = outbox.get_action(engine, a["id"])
        assert done["state"] == "executed", done
        s = jobs.sched.job_state(job)
        assert node in s.excluded and not s.held and node not in s.nodes, s
        assert jobs.sched.node_state(node).drained
        reconciler.reconcile(engine, settings)  # the same start again: nothing more
        assert len(_effects_lost(engine, a["id"])) == 1
        assert audit.verify(engine).ok
    finally:
        jobs.close()


def test_a_stop_slurmctld_forgot_is_applied_again(local_stack, tmp_path, monkeypatch):
    monkeypatch.setenv("GOODPUT_ACTIONS_THREAD", "0")
    jobs = SlurmJobs("gpstop")
    try:
        job, _ = _running(jobs)
        engine, settings, a = _act_then_lose_it(
            local_stack, tmp_path, monkeypatch, jobs, job, "workload_oom", None
        )
        after = jobs.sched.job_state(job)
        print(f"after the restart: {after}")
        assert after.restarts == 0 and not after.held, f"Slurm kept the stop: {after}"

        reconciler.reconcile(engine, settings)
        assert _effects_lost(engine, a["id"]), "the lost hold was not seen"
        wait_until(lambda: jobs.sched.job_state(job).held, 30, what="held again")
        assert outbox.get_action(engine, a["id"])["state"] == "executed"
    finally:
        jobs.close()

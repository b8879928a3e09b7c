"""A slurmctld restart on the local stack's real Slurm (22.05): an action that met the outage
runs at the first reconcile pass after `scontrol ping` answers again, not when its retry delay
(doubled through the outage: minutes) runs out."""

from __future__ import annotations

import os
import time
from pathlib import Path

from recovery import actions, approvals, outbox, reconciler
from recovery.store import make_engine
from tests.chaos.harness import restore_stack
from tests.conftest import wait_until
from tests.helpers import SlurmJobs, diagnosis, stop_daemon


def test_an_action_that_met_the_outage_runs_when_slurmctld_answers(
    local_stack, tmp_path, monkeypatch
):
    monkeypatch.setenv("GOODPUT_ACTIONS_THREAD", "0")
    monkeypatch.delenv("GOODPUT_TEST_CRASH_AT", raising=False)
    jobs = SlurmJobs("gpwake")
    try:
        job = jobs.submit()
        wait_until(lambda: (s := jobs.sched.job_state(job)) and s.state == "RUNNING", 30)
        settings = jobs.settings("approve")
        settings.action_retry_s = 300.0  # the first retry 10 minutes out: past any restart
        engine = make_engine(f"sqlite:///{tmp_path / 'actions.db'}")
        time.sleep(1.1)  # the onset after the job's start (whole seconds)
        inc, d = diagnosis(jobs.tag, job, None, "workload_crash", "illegal_address", 0.9)
        a = actions.on_diagnosis(engine, settings, inc, d)
        assert a["state"] == "pending_approval", a
        stop_daemon(Path(local_stack["GOODPUT_STACK_DIR"], "run", "slurmctld.pid"))
        try:
            wait_until(lambda: not jobs.sched.reachable(), 30, what="slurmctld down")
            r = approvals.approve(engine, settings, a["id"], "gina")
            assert r["state"] == "approved" and r["last_error"], r
            due = r["next_attempt_at"]
            assert due > time.time() + 300
            for _ in range(2):  # down: each pass's `scontrol ping` fails, the row waits
                reconciler.reconcile(engine, settings)
            assert outbox.get_action(engine, a["id"])["state"] == "approved"
        finally:
            restore_stack({**os.environ, **local_stack})
        reconciler.reconcile(engine, settings)
        done = outbox.get_action(engine, a["id"])
        assert done["state"] == "executed", done
        assert time.time() < due  # not the retry delay: the answer woke it
        assert jobs.sched.job_state(job).restarts == 1
    finally:
        jobs.close()

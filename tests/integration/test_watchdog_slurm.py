"""Fail-open on the real stack: slurmctld stops, the watchdog stops acting and tells on-call
through the real Alertmanager; slurmctld comes back, it acts again and the held action runs."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
from prometheus_client import CollectorRegistry

from recovery import actions, approvals, audit, outbox, reconciler, watchdog
from recovery.store import make_engine
from tests.chaos.harness import restore_stack
from tests.conftest import wait_until
from tests.helpers import SlurmJobs
from tests.integration.test_actions_slurm import diag

pytestmark = pytest.mark.timeout(300)


def active_notice(am: str) -> list[dict]:
    r = requests.get(
        f"{am}/api/v2/alerts",
        params={"filter": 'alertname="GoodputReceiverNotActing"', "active": "true"},
        timeout=5,
    )
    r.raise_for_status()
    return [a for a in r.json() if a["status"]["state"] == "active"]


def test_slurmctld_down_stops_actions_and_its_return_resumes_them(local_stack, tmp_path):
    env = {**os.environ, **local_stack}
    am = local_stack["GOODPUT_ALERTMANAGER_URL"].rstrip("/")
    jobs = SlurmJobs("gpwd")
    sched = jobs.sched
    settings = jobs.settings("approve", watchdog={"required": ["scheduler"]})
    settings.alertmanager_url, settings.loki_url, settings.log_dir = am, None, None
    engine = make_engine(f"sqlite:///{tmp_path / 'w.db'}")
    dog = watchdog.Watchdog(engine, settings, lambda: settings.policy.watchdog)
    registry = CollectorRegistry()
    registry.register(watchdog.ActingCollector(engine))
    cluster = SimpleNamespace(tag=jobs.tag)
    job = jobs.submit()
    pid = Path(local_stack["GOODPUT_STACK_DIR"], "run", "slurmctld.pid")
    try:
        s = wait_until(
            lambda: (j := sched.job_state(job)) and j.state == "RUNNING" and j,
            timeout=20,
            what="job running",
        )
        time.sleep(1.1)
        pending = actions.on_diagnosis(engine, settings, *diag(cluster, job, s.nodes[0]))
        assert pending["state"] == "pending_approval", pending
        assert dog.tick().acting and watchdog.current(engine) == "ok"

        os.kill(int(pid.read_text()), signal.SIGTERM)
        try:
            dog.tick()
            dog.tick()
            assert watchdog.current(engine) == "scheduler_unreachable"
            assert (
                registry.get_sample_value(
                    "goodput_receiver_acting", {"reason": "scheduler_unreachable"}
                )
                == 0.0
            )
            [stopped] = audit.query(engine, type_="watchdog_stopped")[0]
            assert stopped["payload"]["reason"] == "scheduler_unreachable"
            [told] = audit.query(engine, type_="notified")[0][-1:]
            assert told["payload"] == {
                "alertname": "GoodputReceiverNotActing", "ok": True, "detail": "HTTP 200"
            }  # fmt: skip
            wait_until(lambda: active_notice(am), timeout=10, what="on-call notice active")
            held = approvals.approve(engine, settings, pending["id"], "alice")
            assert held["state"] == "approved"
            events = [e["type"] for e in audit.query(engine, action_id=pending["id"])[0]]
            assert "executing" not in events and "retry_scheduled" not in events, events
        finally:
            restore_stack(env)

        wait_until(lambda: dog.tick().acting, timeout=60, what="watchdog acting again")
        assert registry.get_sample_value("goodput_receiver_acting", {"reason": "ok"}) == 1.0
        assert len(audit.query(engine, type_="watchdog_resumed")[0]) == 1
        wait_until(lambda: not active_notice(am), timeout=10, what="on-call notice ended")
        reconciler.reconcile(engine, settings)  # or the receiver's own retry loop gets there first
        done = wait_until(
            lambda: (a := outbox.get_action(engine, pending["id"]))["state"] == "executed" and a,
            timeout=30,
            what="the held action executed once the watchdog acts again",
        )
        events = [e["type"] for e in audit.query(engine, action_id=pending["id"])[0]]
        assert events.count("executed") == 1, (done, events)
        again = wait_until(
            lambda: (j := sched.job_state(job)) and j.restarts == 1 and j,
            timeout=30,
            what="job requeued after the watchdog resumed",
        )
        assert s.nodes[0] in again.excluded
    finally:
        jobs.close()

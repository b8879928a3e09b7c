"""No action lost or repeated when the receiver dies between any two steps.

Each test runs the real worker and actions on one SQLite file with the fake simulator behind the
scheduler port, makes the "process" die at one step boundary (a failpoint, or the scheduler
raising `Crash` in the middle of a call: a BaseException, so nothing after it runs, as after a
kill -9), then "restarts" (a new owner id; the start-up reconcile and the worker on the same
file) and checks: one plan for the incident, executed once, the job requeued once excluding the
node, the audit chain intact."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import requests
from sqlalchemy import select

from recovery import (
    action_config,
    actions,
    approvals,
    audit,
    failpoints,
    incidents,
    leases,
    outbox,
    reconciler,
    worker,
)
from recovery.failpoints import Crash
from recovery.policy import parse_policy
from recovery.scheduler.simulated import SimulatedScheduler
from recovery.store import make_engine
from tests.unit.actions_fakes import make_fake_sim

DOC = {
    "schema_version": "1",
    "outcome": "gpu_hardware_fault",
    "root_cause": "xid79",
    "affected_nodes": ["node2"],
    "confidence": 0.95,
    "connector_reports": [],
}


class Dying(SimulatedScheduler):
    """The adapter, dying (raising Crash) at the Nth call of one of its methods."""

    die_at: tuple[str, int] | None = None

    def _maybe_die(self, name):
        if self.die_at and self.die_at[0] == name:
            n = self.die_at[1] - 1
            self.die_at = (name, n) if n else None
            if not n:
                raise Crash(name)

    def job_state(self, job_id):
        self._maybe_die("job_state")
        return super().job_state(job_id)

    def node_states(self):
        self._maybe_die("node_states")
        return super().node_states()

    def _requeue(self, *a, **k):
        self._maybe_die("_requeue")
        super()._requeue(*a, **k)
        self._maybe_die("_requeued")  # Slurm requeued it; the process died before it saw


class Down:
    def get(self, *a, **k):
        raise requests.ConnectionError("down")

    post = get


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.setenv("GOODPUT_ACTIONS_THREAD", "0")
    monkeypatch.delenv("GOODPUT_TEST_CRASH_AT", raising=False)
    failpoints.disarm()
    yield
    failpoints.disarm()


@pytest.fixture
def world(tmp_path, monkeypatch):
    client, st, submit = make_fake_sim()
    engine = make_engine(f"sqlite:///{tmp_path / 'd.db'}")
    sched = Dying("http://testserver", session=client)
    submit("42", node="node2")
    monkeypatch.setattr(worker, "diagnose", lambda s, inc: {**DOC, "incident_id": inc["id"]})

    def settings(mode="act"):
        return SimpleNamespace(
            policy=parse_policy({"mode": mode}, env={}),
            scheduler_adapter=sched,
            alertmanager_url=None,
            prometheus_url=None,
            action_retry_s=0.0,
            recheck_s=0.0,
            recheck_max=0,
            slurm_enabled=False,
            settle_s=0.0,
            restart_grace_s=120.0,
            lookback_s=900.0,
        )

    def restart(mode="act"):
        """A new process on the same database: new owner id, start-up reconcile, worker."""
        monkeypatch.setattr(leases, "OWNER", f"restarted-{time.monotonic_ns()}")
        reconciler._running.discard(engine)
        s = settings(mode)
        reconciler.start(engine, s, thread=False)
        worker.run_once(engine, s)
        reconciler.reconcile(engine, s)

    def alert():
        doc = {
            "status": "firing",
            "labels": {"alertname": "GoodputGPUFatalXid", "job_id": "42", "node": "node2"},
            "annotations": {},
            "startsAt": "2026-01-01T00:00:10Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "fingerprint": "f1",
        }
        return incidents.ingest(engine, settings(), [doc]).incident_ids[0]

    return SimpleNamespace(
        engine=engine, st=st, sched=sched, settings=settings, restart=restart, alert=alert
    )


def _check_once(w, inc):
    with w.engine.connect() as conn:
        rows = conn.execute(
            select(outbox.actions_table).where(outbox.actions_table.c.incident_id == str(inc))
        ).all()
    assert [(r.id, r.state) for r in rows] == [(f"inc-{inc}", "executed")]
    job = w.st["jobs"]["42"]
    assert job["restarts"] == 1 and job["excluded"] == ["node2"] and job["state"] == "RUNNING"
    assert w.st["nodes"]["node2"]["state"].startswith("DRAIN")
    assert [c for c in w.st["calls"] if c[0] == "requeue"] == [("requeue", "42")]
    types = [e["type"] for e in audit.query(w.engine, incident_id=str(inc), limit=1000)[0]]
    assert types.count("executed") == 1 and types.count("planned") == 1
    assert types.count("diagnosis") == 1
    assert audit.verify(w.engine).ok


@pytest.mark.parametrize("point", ["diagnosed", "planned", "claimed", "drained", "executed"])
def test_death_at_a_failpoint_is_finished_once_on_restart(world, point):
    inc = world.alert()
    failpoints.arm(point)
    with pytest.raises(Crash):
        worker.run_once(world.engine, world.settings())
    world.restart()
    _check_once(world, inc)


@pytest.mark.parametrize(
    "die_at",
    [
        ("job_state", 1),  # planning: after the diagnosis was committed, before any plan
        ("node_states", 1),  # planning, second read
        ("node_states", 2),  # execution: the blast radius read before the claim
        ("_requeue", 1),  # execution: drained, the requeue dies in Slurm's hands
    ],
)
def test_death_inside_a_scheduler_call_is_finished_once_on_restart(world, die_at):
    inc = world.alert()
    world.sched.die_at = die_at
    with pytest.raises(Crash):
        worker.run_once(world.engine, world.settings())
    world.restart()
    _check_once(world, inc)


def test_a_final_diagnosis_and_its_outbox_row_commit_together(world):
    """The step the old code lost: the diagnosis stored, no action row yet."""
    inc = world.alert()
    world.sched.die_at = ("job_state", 1)
    with pytest.raises(Crash):
        worker.run_once(world.engine, world.settings())
    assert incidents.incident(world.engine, inc)["diagnosis_state"] == "done"
    row = outbox.incident_action(world.engine, str(inc))
    assert row is not None and row["state"] == "planning"
    assert row["body"]["diagnosis"]["affected_nodes"] == ["node2"]


def test_replanning_a_waiting_row_keeps_it_until_the_new_plan_commits(world):
    inc = world.alert()
    good = world.sched.session
    world.sched.session = Down()
    worker.run_once(world.engine, world.settings())
    assert outbox.incident_action(world.engine, str(inc))["state"] == "waiting_scheduler"
    world.sched.session = good
    world.sched.die_at = ("node_states", 1)  # the re-plan dies half-way
    with pytest.raises(Crash):
        reconciler.reconcile(world.engine, world.settings())
    assert outbox.incident_action(world.engine, str(inc))["state"] == "waiting_scheduler"
    world.restart()
    _check_once(world, inc)


def test_approve_mode_death_after_approval_executes_once(world):
    inc = world.alert()
    worker.run_once(world.engine, world.settings("approve"))
    a = outbox.incident_action(world.engine, str(inc))
    assert a["state"] == "pending_approval"
    failpoints.arm("approved")
    with pytest.raises(Crash):
        approvals.approve(world.engine, world.settings("approve"), a["id"], "ana")
    world.restart("approve")
    _check_once(world, inc)


def test_redelivered_diagnosis_after_restart_plans_nothing_new(world):
    inc = world.alert()
    failpoints.arm("finished")
    with pytest.raises(Crash):
        worker.run_once(world.engine, world.settings())
    world.restart()
    current = incidents.incident(world.engine, inc)
    again = actions.on_diagnosis(world.engine, world.settings(), current, {**DOC})
    assert again["id"] == f"inc-{inc}"
    _check_once(world, inc)


@pytest.mark.parametrize(
    "die_at",
    [None, ("_requeue", 1), ("_requeued", 1)],  # None: the `drained` failpoint
)
def test_pausing_after_a_death_mid_action_still_finishes_it(world, die_at):
    """Paused after the process died mid-action (node drained; the job not requeued yet, or
    requeued unseen): the restart finishes it, not `skipped` with the node drained for nothing."""
    inc = world.alert()
    if die_at is None:
        failpoints.arm("drained")
    world.sched.die_at = die_at
    with pytest.raises(Crash):
        worker.run_once(world.engine, world.settings())
    action_config.set_paused(world.engine, True, "oncall", "investigating")
    world.restart()
    _check_once(world, inc)
    assert not audit.query(world.engine, type_="skipped")[0]


def test_pausing_skips_an_action_that_has_not_begun(world):
    """A `ready` row (its planner died) is skipped while paused: nothing touches Slurm."""
    inc = world.alert()
    failpoints.arm("planned")
    with pytest.raises(Crash):
        worker.run_once(world.engine, world.settings())
    action_config.set_paused(world.engine, True, "oncall", "investigating")
    world.restart()
    assert outbox.incident_action(world.engine, str(inc))["state"] == "skipped"
    assert not [c for c in world.st["calls"] if c[0] in ("drain", "requeue")]


def test_an_action_left_executing_by_an_error_of_this_process_is_finished(world, monkeypatch):
    """A store error escaping after the requeue (here the `executed` audit write) left the row
    `executing`, owned by the live process: its heartbeat renewed the lease for good and the
    reconciler skipped its own rows, so the action never finished while the receiver lived.
    Now a row this process owns but no longer holds is an orphan: the next pass finishes it,
    without a second requeue."""
    from sqlalchemy.exc import OperationalError

    inc = world.alert()
    real = audit.append
    failed: list[str] = []

    def flaky(conn, type_, payload, **kw):
        if type_ == "executed" and not failed:
            failed.append(type_)
            raise OperationalError("INSERT", {}, Exception("database is locked"))
        return real(conn, type_, payload, **kw)

    monkeypatch.setattr(audit, "append", flaky)
    worker.run_once(world.engine, world.settings())  # the worker logs the error
    monkeypatch.setattr(audit, "append", real)
    row = outbox.raw(world.engine, f"inc-{inc}")
    assert (row.state, row.owner) == ("executing", leases.OWNER)
    leases.renew(world.engine, 30)  # the heartbeat goes on
    reconciler.reconcile(world.engine, world.settings())
    assert outbox.raw(world.engine, f"inc-{inc}").state == "executed"
    assert len([c for c in world.st["calls"] if c[0] == "requeue"]) == 1

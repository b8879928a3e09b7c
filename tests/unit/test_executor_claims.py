"""Two receivers on one action: a claim takes an `executing` row over only while its owner's
lease has expired, checked in the claim itself (the reconciler's read can be old), and a late
owner records nothing over the winner's outcome. SQLite stands in for PostgreSQL here
(`executor.ONE_RECEIVER` emptied: peers, not a dead predecessor)."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import update

from recovery import audit, executor, failpoints, leases, outbox, reconciler, worker
from recovery.failpoints import Crash
from recovery.scheduler import SchedulerUnavailable
from tests.unit.test_actions_durable import _check_once, _clean, world  # noqa: F401 - fixtures


@pytest.fixture(autouse=True)
def _peers(monkeypatch):
    monkeypatch.setattr(executor, "ONE_RECEIVER", (), raising=False)
    monkeypatch.setattr(leases, "OWNER", "receiver-a")


def _expire(engine):
    """Move the executing rows' leases 31 s into the past: their owner stopped renewing."""
    t = outbox.actions_table
    with engine.begin() as conn:
        q = update(t).where(t.c.state == "executing").values(lease_until=t.c.lease_until - 31)
        conn.execute(q)


def _types(w, inc):
    return [e["type"] for e in audit.query(w.engine, incident_id=str(inc), limit=1000)[0]]


def test_an_owner_that_renewed_after_the_read_keeps_its_action(
    world,  # noqa: F811
    monkeypatch,
):
    """B's reconciler reads A's lease expired; A renews before B claims: B leaves the row."""
    inc = world.alert()
    failpoints.arm("drained")
    with pytest.raises(Crash):
        worker.run_once(world.engine, world.settings())  # A: drained; alive, only slow
    read = reconciler.orphaned

    def orphaned(row, now, startup, single):
        found = read(row, now, startup, single)
        if found:  # after B's read, before its claim: A's heartbeat
            leases.renew(world.engine, 30, owner=row.owner)
        return found

    _expire(world.engine)
    monkeypatch.setattr(reconciler, "orphaned", orphaned)
    monkeypatch.setattr(leases, "OWNER", "receiver-b")
    reconciler.reconcile(world.engine, world.settings())
    row = outbox.raw(world.engine, f"inc-{inc}")
    assert (row.state, row.owner, row.attempts) == ("executing", "receiver-a", 1)
    assert not [c for c in world.st["calls"] if c[0] == "requeue"]
    assert "reconciled" not in _types(world, inc)  # no record of a takeover that was refused
    monkeypatch.setattr(reconciler, "orphaned", read)
    _expire(world.engine)  # A stops renewing: B takes it over and finishes it
    reconciler.reconcile(world.engine, world.settings())
    _check_once(world, inc)
    assert _types(world, inc).count("reconciled") == 1


def test_a_late_owner_records_nothing_over_the_winners_outcome(
    world,  # noqa: F811
    monkeypatch,
    caplog,
):
    """A is stuck in the requeue past its lease; B takes the row over and finishes it; A's
    requeue then fails: neither its retry nor a second audit event lands on B's `executed`."""
    real = world.sched._requeue

    def stuck(*a, **k):
        monkeypatch.setattr(world.sched, "_requeue", real)
        _expire(world.engine)
        with monkeypatch.context() as m:
            m.setattr(leases, "OWNER", "receiver-b")
            reconciler.reconcile(world.engine, world.settings())  # B: requeues, `executed`
        raise SchedulerUnavailable("slurmctld: Socket timed out")

    monkeypatch.setattr(world.sched, "_requeue", stuck)
    inc = world.alert()
    with caplog.at_level(logging.WARNING, logger="goodput.actions"):
        worker.run_once(world.engine, world.settings())  # A
    _check_once(world, inc)
    assert outbox.raw(world.engine, f"inc-{inc}").owner == "receiver-b"
    assert "retry_scheduled" not in _types(world, inc)
    assert "not recorded" in caplog.text

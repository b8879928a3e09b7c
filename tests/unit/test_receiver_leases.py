"""Receivers in HA share a store: a due diagnosis is claimed by one receiver (a lease), taken
over when the holder's lease expires, and a holder that lost its claim stores nothing; an
executing action left by a dead receiver is finished by a live one once the lease expires
(not at once: its owner may be alive). The real two-process proof on PostgreSQL is
tests/integration/test_receiver_ha.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from sqlalchemy import func, select, update

from recovery import executor, failpoints, incidents, leases, outbox, reconciler
from recovery.failpoints import Crash
from recovery.settings import Settings
from recovery.store import diagnoses, make_engine
from tests.unit.test_actions_durable import _check_once, _clean, world  # noqa: F401 - fixtures

DOC = {"outcome": "crash", "root_cause": "cuda", "confidence": 0.9, "connector_reports": []}


def _alert(fp, job="77"):
    return {
        "status": "firing",
        "labels": {"alertname": "GoodputJobLogFault", "job_id": job},
        "annotations": {},
        "startsAt": "2026-01-01T00:00:10Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": fp,
    }


@pytest.fixture
def store(tmp_path):
    s = Settings(db_url=f"sqlite:///{tmp_path}/l.db", require_auth=False, settle_s=0.0)
    s = s.with_(slurm_enabled=False)
    return s, make_engine(s.db_url)


def _diagnoses(engine, inc):
    with engine.connect() as conn:
        q = select(func.count()).select_from(diagnoses).where(diagnoses.c.incident_id == inc)
        return conn.execute(q).scalar_one()


def test_one_receiver_claims_a_diagnosis_the_other_takes_it_over_after_the_lease(store):
    s, engine = store
    (inc,) = incidents.ingest(engine, s, [_alert("a1")]).incident_ids
    t = 1e10
    assert incidents.claim_diagnoses(engine, "rx-a", 30, now=t) == [(inc, 1)]
    assert incidents.claim_diagnoses(engine, "rx-b", 30, now=t + 29) == []  # A holds it
    assert incidents.claim_diagnoses(engine, "rx-b", 30, now=t + 31) == [(inc, 1)]  # A is gone
    # A (slow, not dead) comes back with its verdict: the claim is B's, nothing is stored
    assert incidents.store_diagnosis(engine, inc, 1, DOC, owner="rx-a") == "superseded"
    assert _diagnoses(engine, inc) == 0
    assert incidents.store_diagnosis(engine, inc, 1, DOC, owner="rx-b") == "done"
    assert _diagnoses(engine, inc) == 1
    # the same verdict stored again (a duplicate delivery of the work) settles nothing twice
    assert incidents.store_diagnosis(engine, inc, 1, DOC) == "superseded"
    assert incidents.claim_diagnoses(engine, "rx-a", 30, now=t + 100) == []


def test_heartbeat_keeps_the_claim_and_a_new_alert_ends_it(store):
    s, engine = store
    (inc,) = incidents.ingest(engine, s, [_alert("b1")]).incident_ids
    t = 1e10
    assert incidents.claim_diagnoses(engine, "rx-a", 30, now=t) == [(inc, 1)]
    assert leases.renew(engine, 30, owner="rx-a", now=t + 20) == 1
    assert incidents.claim_diagnoses(engine, "rx-b", 30, now=t + 40) == []  # renewed to t+50
    incidents.ingest(engine, s, [_alert("b2")], now=t + 41)  # gen 2: A's diagnosis is stale
    assert incidents.claim_diagnoses(engine, "rx-b", 30, now=t + 41) == [(inc, 2)]
    assert incidents.store_diagnosis(engine, inc, 1, DOC, owner="rx-a") == "superseded"
    assert incidents.store_diagnosis(engine, inc, 2, DOC, owner="rx-b") == "done"
    assert _diagnoses(engine, inc) == 1


def test_a_restarted_single_receiver_takes_its_dead_claims_back_at_once(store):
    s, engine = store
    (inc,) = incidents.ingest(engine, s, [_alert("c1")]).incident_ids
    assert incidents.claim_diagnoses(engine, "dead", 30) == [(inc, 1)]
    assert incidents.release_claims(engine, leases.OWNER) == 1
    assert incidents.claim_diagnoses(engine, leases.OWNER, 30) == [(inc, 1)]


def _row(state, owner, lease_until):
    return SimpleNamespace(id="a1", state=state, owner=owner, lease_until=lease_until)


def test_orphaned_rows():
    me, now = leases.OWNER, 1000.0
    with executor._holding("a1"):  # ours, in hand
        assert not reconciler.orphaned(_row("executing", me, 0.0), now, True, True)
    # ours, but no longer in hand (an error escaped mid-way): finished like a dead one's
    assert reconciler.orphaned(_row("executing", me, 9999.0), now, False, False)
    assert not reconciler.orphaned(_row("ready", "x", 0.0), now, True, True)
    assert reconciler.orphaned(_row("executing", "x", 999.0), now, False, False)  # expired
    assert not reconciler.orphaned(_row("executing", "x", 1001.0), now, False, False)
    # at start-up: a peer's live lease is kept on PostgreSQL, taken on SQLite (one receiver)
    assert not reconciler.orphaned(_row("executing", "x", 1001.0), now, True, False)
    assert reconciler.orphaned(_row("executing", "x", 1001.0), now, True, True)
    assert reconciler.orphaned(_row("executing", "x", None), now, True, False)  # before leases


def test_a_live_receiver_finishes_an_action_whose_owner_died_once_its_lease_expires(
    world,  # noqa: F811
    monkeypatch,
):
    """Receiver A dies after draining, before the requeue; receiver B, running all along (no
    start-up), leaves the row while A's lease runs and finishes it once, after it expired."""
    inc = world.alert()
    failpoints.arm("drained")
    with pytest.raises(Crash):
        world.restart()  # A: diagnoses, plans, claims, drains, dies
    (row,) = outbox.list_actions(world.engine)
    assert row["state"] == "executing"
    monkeypatch.setattr(leases, "OWNER", "receiver-b")  # B: another process, running
    s = world.settings()
    reconciler.reconcile(world.engine, s)  # A's lease (30 s) runs: B leaves it
    assert outbox.get_action(world.engine, row["id"])["state"] == "executing"
    with world.engine.begin() as conn:  # 30 s later, with no heartbeat from A
        t = outbox.actions_table
        conn.execute(update(t).values(lease_until=t.c.lease_until - 31))
    reconciler.reconcile(world.engine, s)
    _check_once(world, inc)

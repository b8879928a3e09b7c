"""A failed diagnosis counts only against the claim it was made under: a stale failure (a new
alert ended the claim, another receiver diagnosed the new generation) changes nothing."""

from __future__ import annotations

import pytest
from sqlalchemy import insert, select, update

from recovery import diagnosis_queue as dq
from recovery.store import incidents, make_engine


@pytest.fixture
def engine(tmp_path):
    return make_engine(f"sqlite:///{tmp_path / 'c.db'}")


def _incident(engine) -> int:
    with engine.begin() as conn:
        return conn.execute(
            insert(incidents).values(
                job_id="42", state="open", opened_at=0, updated_at=0, diagnosis_state="pending",
                diagnosis_due=0, diagnosis_gen=1, diagnosis_attempts=0,
            )
        ).inserted_primary_key[0]  # fmt: skip


def _new_alert(engine, iid: int, due: float) -> None:
    """What linking an alert does (`ingest_rows._LINK`): a new generation, the claim ended."""
    c = incidents.c
    with engine.begin() as conn:
        conn.execute(
            update(incidents)
            .where(c.id == iid)
            .values(diagnosis_state="pending", diagnosis_gen=c.diagnosis_gen + 1,
                    diagnosis_due=due, diagnosis_owner=None, diagnosis_lease=None)
        )  # fmt: skip


def _row(engine, iid: int):
    c = incidents.c
    cols = (c.diagnosis_state, c.diagnosis_gen, c.diagnosis_attempts, c.diagnosis_owner)
    with engine.connect() as conn:
        return tuple(conn.execute(select(*cols).where(c.id == iid)).one())


def test_a_stale_failure_leaves_the_diagnosis_another_receiver_stored(engine):
    # A's diagnosis of generation 1 raised after B had stored generation 2 and queued its
    # action: the failure set the incident back to pending, and it was diagnosed again
    iid = _incident(engine)
    assert dq.claim_diagnoses(engine, "A", 30, now=1) == [(iid, 1)]
    _new_alert(engine, iid, due=5)
    assert dq.claim_diagnoses(engine, "B", 30, now=6) == [(iid, 2)]
    assert dq.store_diagnosis(engine, iid, 2, {"outcome": "workload_crash"}, now=7, owner="B")
    assert dq.record_failure(engine, iid, now=8, owner="A", gen=1) is False
    assert _row(engine, iid) == ("done", 2, 0, None)
    assert dq.due_diagnoses(engine, now=100) == []


def test_a_stale_failure_leaves_another_receivers_claim(engine):
    iid = _incident(engine)
    dq.claim_diagnoses(engine, "A", 30, now=1)
    _new_alert(engine, iid, due=5)
    dq.claim_diagnoses(engine, "B", 30, now=6)
    assert dq.record_failure(engine, iid, now=8, owner="A", gen=1) is False
    assert _row(engine, iid) == ("pending", 2, 0, "B")
    doc = {"outcome": "workload_crash"}
    assert dq.store_diagnosis(engine, iid, 2, doc, now=9, owner="B") == "done"  # B's stands


def test_a_failure_of_an_older_generation_of_ones_own_claim_counts_nothing(engine):
    iid = _incident(engine)
    dq.claim_diagnoses(engine, "A", 30, now=1)
    _new_alert(engine, iid, due=5)
    assert dq.claim_diagnoses(engine, "A", 30, now=6) == [(iid, 2)]
    assert dq.record_failure(engine, iid, now=8, owner="A", gen=1) is False
    assert _row(engine, iid) == ("pending", 2, 0, "A")


def test_a_failure_under_the_claim_is_retried_then_given_up(engine):
    iid = _incident(engine)
    for k in range(3):
        now = 100.0 * k
        assert dq.claim_diagnoses(engine, "A", 30, now=now) == [(iid, 1)]
        assert dq.record_failure(engine, iid, max_attempts=3, retry_s=10, now=now, owner="A", gen=1)
        assert dq.claim_diagnoses(engine, "A", 30, now=now + 5) == []  # not before retry_s
    assert _row(engine, iid) == ("failed", 1, 3, None)
    assert dq.claim_diagnoses(engine, "A", 30, now=1000) == []

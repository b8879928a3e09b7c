"""The audit log: hash chain, tamper detection, queries with cursor paging."""

from __future__ import annotations

import pytest
from sqlalchemy import delete, update

from recovery import audit
from recovery.store import make_engine


@pytest.fixture
def engine(tmp_path):
    e = make_engine(f"sqlite:///{tmp_path / 'audit.db'}")
    for i in range(25):
        audit.record(
            e,
            "planned" if i % 2 else "diagnosis",
            {"i": i, "text": "é ✓"},
            job_id=str(100 + i % 3),
            incident_id=str(i // 5),
            ts=1000.0 + i,
        )
    return e


def test_chain_verifies(engine):
    v = audit.verify(engine)
    assert v.ok and v.rows == 25


@pytest.mark.parametrize(
    "column, value",
    [
        ("payload", '{"i":3,"text":"x"}'),
        ("actor", "mallory"),
        ("ts", 5.0),
        ("type", "executed"),
        ("job_id", "999"),
    ],
)
def test_an_edited_row_is_detected(engine, column, value):
    with engine.begin() as conn:
        conn.execute(update(audit.audit).where(audit.audit.c.seq == 4).values({column: value}))
    v = audit.verify(engine)
    assert not v.ok and v.first_bad_seq == 4


def test_rehashing_an_edit_breaks_the_next_link(engine):
    with engine.connect() as conn:
        row = dict(conn.execute(audit.audit.select().where(audit.audit.c.seq == 7)).one()._mapping)
    row["payload"] = '{"i":7,"text":"forged"}'
    forged = audit._hash(row["prev_hash"], row)
    with engine.begin() as conn:
        conn.execute(
            update(audit.audit)
            .where(audit.audit.c.seq == 7)
            .values(payload=row["payload"], hash=forged)
        )
    v = audit.verify(engine)
    assert not v.ok and v.first_bad_seq == 8


def test_a_deleted_row_is_detected(engine):
    with engine.begin() as conn:
        conn.execute(delete(audit.audit).where(audit.audit.c.seq == 10))
    v = audit.verify(engine)
    assert not v.ok and v.first_bad_seq == 11 and "gap" in v.problem


def test_query_filters_and_cursor_paging(engine):
    seen, cursor = [], 0
    while True:
        page, nxt = audit.query(engine, job_id="100", cursor=cursor, limit=3)
        seen += [e["seq"] for e in page]
        if nxt is None:
            break
        cursor = nxt
    assert seen == [s for s in range(1, 26) if (s - 1) % 3 == 0]
    assert all(e["type"] == "planned" for e in audit.query(engine, type_="planned")[0])
    assert [e["seq"] for e in audit.query(engine, incident_id="1")[0]] == [6, 7, 8, 9, 10]
    assert [e["seq"] for e in audit.query(engine, since=1003.0, until=1005.0)[0]] == [4, 5]
    assert audit.query(engine, job_id="100")[0][0]["payload"] == {"i": 0, "text": "é ✓"}


def test_unknown_type_is_refused(engine):
    with pytest.raises(ValueError, match="unknown audit event type"):
        audit.record(engine, "whatever", {})


def test_the_contract_lists_every_audit_event_type():
    """docs/contracts.md names the event types a reader of the audit log will meet: all of
    `audit.TYPES`, no other."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "contracts.md").read_text()
    para = re.split(r"Table\s+`goodput_audit`", text.split("- **Audit event types**:", 1)[1])[0]
    named = set(re.findall(r"`([a-z_]+)`", para)) - {"reason", "was", "detail"}
    assert named == set(audit.TYPES)


def test_exports_pruning_and_retention_read_the_receivers_clock(tmp_path):
    """The export's time, the prune cut and retention read the store's clock (a simulated
    one in the benchmark), as every other audit event does, not the wall clock."""
    import io

    from recovery import retention
    from recovery.clock import ManualClock
    from recovery.policy import Retention

    t = 1_600_000_000.0
    e = make_engine(f"sqlite:///{tmp_path / 'c.db'}", clock=ManualClock(t))
    for i in range(3):
        audit.record(e, "diagnosis", {"i": i}, ts=t - 40 * 86400 + i)
    audit.record(e, "diagnosis", {"i": 3}, ts=t - 1)
    summary = audit.export(e, io.StringIO())
    assert audit.record_export(e, summary, "file:x")["ts"] == t
    pruned = retention.apply(e, Retention(payload_days=30, audit_days=30))
    assert pruned["audit"] == 3  # 40 days old by the store's clock (the wall clock: years)

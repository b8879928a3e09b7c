"""The audit log: append-only, hash-chained, durable (a table on the receiver's engine).

Each row's `hash` is sha256 over the previous row's hash and the row's canonical content, so
editing, deleting or reordering any row breaks `verify()` from that row on. `seq` is unique and
contiguous; concurrent writers that race for the same `seq` retry.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    select,
)
from sqlalchemy.exc import IntegrityError

metadata = MetaData()
audit = Table(
    "goodput_audit",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("ts", Float, nullable=False),
    Column("type", String(40), nullable=False),
    Column("job_id", String(32), nullable=True),
    Column("incident_id", String(64), nullable=True),
    Column("action_id", String(64), nullable=True),
    Column("actor", String(128), nullable=False),
    Column("payload", Text, nullable=False),
    Column("prev_hash", String(64), nullable=False),
    Column("hash", String(64), nullable=False),
)
Index("ix_audit_job", audit.c.job_id, audit.c.seq)
Index("ix_audit_incident", audit.c.incident_id, audit.c.seq)
Index("ix_audit_type", audit.c.type, audit.c.seq)

GENESIS = "0" * 64
TYPES = (
    "diagnosis",
    "directive_invalid",
    "planned",
    "skipped",
    "pending_approval",
    "approved",
    "rejected",
    "expired",
    "executing",
    "executed",
    "failed",
    "retry_scheduled",
    "reconciled",
    "paused",
    "resumed",
    "notified",
    "recovered",
    "check_planned",
    "check_started",
    "check_passed",
    "check_failed",
    "check_rma",
)


@dataclass(frozen=True)
class Verification:
    ok: bool
    rows: int
    first_bad_seq: int | None = None
    problem: str = ""


def ensure(engine: Engine) -> None:
    metadata.create_all(engine)


def _canonical(row: dict[str, Any]) -> str:
    keys = ("seq", "ts", "type", "job_id", "incident_id", "action_id", "actor", "payload")
    return json.dumps({k: row[k] for k in keys}, sort_keys=True, separators=(",", ":"))


def _hash(prev: str, row: dict[str, Any]) -> str:
    return hashlib.sha256((prev + "\n" + _canonical(row)).encode()).hexdigest()


def append(
    conn: Connection,
    type_: str,
    payload: dict[str, Any],
    *,
    job_id: str | None = None,
    incident_id: str | None = None,
    action_id: str | None = None,
    actor: str = "goodput",
    ts: float | None = None,
) -> int:
    """Append one event inside the caller's transaction; returns its seq."""
    if type_ not in TYPES:
        raise ValueError(f"unknown audit event type {type_!r}")
    last = conn.execute(
        select(audit.c.seq, audit.c.hash).order_by(audit.c.seq.desc()).limit(1)
    ).first()
    seq = int(last.seq) + 1 if last else 1
    row: dict[str, Any] = {
        "seq": seq,
        "ts": round(ts if ts is not None else time.time(), 6),
        "type": type_,
        "job_id": job_id,
        "incident_id": None if incident_id is None else str(incident_id),
        "action_id": action_id,
        "actor": actor[:128],
        "payload": json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str),
    }
    prev = last.hash if last else GENESIS
    conn.execute(audit.insert().values(**row, prev_hash=prev, hash=_hash(prev, row)))
    return seq


def record(engine: Engine, type_: str, payload: dict[str, Any], **kw: Any) -> int:
    """Append one event in its own transaction (retrying a lost race for the next seq)."""
    for attempt in range(20):
        try:
            with engine.begin() as conn:
                return append(conn, type_, payload, **kw)
        except IntegrityError:
            time.sleep(0.01 * (attempt + 1))
    raise RuntimeError("could not append to the audit log: persistent seq conflicts")


def _decode(r: Any) -> dict[str, Any]:
    d = dict(r._mapping)
    d["payload"] = json.loads(d["payload"])
    return d


def query(
    engine: Engine,
    *,
    job_id: str | None = None,
    incident_id: str | None = None,
    type_: str | None = None,
    action_id: str | None = None,
    since: float | None = None,
    until: float | None = None,
    cursor: int = 0,
    limit: int = 100,
) -> tuple[list[dict[str, Any]], int | None]:
    """Events after `cursor` (a seq), oldest first; returns (events, next cursor or None)."""
    limit = max(1, min(int(limit), 1000))
    q = select(audit).where(audit.c.seq > cursor).order_by(audit.c.seq).limit(limit + 1)
    if job_id is not None:
        q = q.where(audit.c.job_id == job_id)
    if incident_id is not None:
        q = q.where(audit.c.incident_id == str(incident_id))
    if type_ is not None:
        q = q.where(audit.c.type == type_)
    if action_id is not None:
        q = q.where(audit.c.action_id == action_id)
    if since is not None:
        q = q.where(audit.c.ts >= since)
    if until is not None:
        q = q.where(audit.c.ts < until)
    with engine.connect() as conn:
        rows = conn.execute(q).all()
    more = len(rows) > limit
    events = [_decode(r) for r in rows[:limit]]
    return events, (events[-1]["seq"] if more else None)


def iter_all(engine: Engine, batch: int = 500) -> Iterator[dict[str, Any]]:
    """Every event in order (raw payload text kept for export)."""
    cursor = 0
    while True:
        with engine.connect() as conn:
            rows = conn.execute(
                select(audit).where(audit.c.seq > cursor).order_by(audit.c.seq).limit(batch)
            ).all()
        if not rows:
            return
        for r in rows:
            yield dict(r._mapping)
        cursor = rows[-1].seq


def verify(engine: Engine) -> Verification:
    """Recompute the chain; the first row that does not fit is reported."""
    prev, expected, n = GENESIS, 1, 0
    for row in iter_all(engine):
        n += 1
        if row["seq"] != expected:
            return Verification(False, n, row["seq"], f"seq gap: expected {expected}")
        if row["prev_hash"] != prev:
            return Verification(False, n, row["seq"], "prev_hash does not match previous row")
        if _hash(prev, row) != row["hash"]:
            return Verification(False, n, row["seq"], "content does not match its hash")
        prev, expected = row["hash"], expected + 1
    return Verification(True, n)

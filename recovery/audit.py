"""The audit log: append-only, hash-chained, durable (a table on the receiver's engine).

Each row's `hash` is sha256 over the previous row's hash and the row's canonical content, so
editing, deleting or reordering any row breaks `verify()` from that row on. `seq` is unique and
contiguous; concurrent writers that race for the same `seq` retry.

Rows leave the table only after an export: `export()` writes the chain as JSON lines and,
once the copy is durable, `record_export()` records it (table `goodput_audit_exports` and an
`exported` event); `prune()` deletes the
oldest rows up to the last export (never the newest row) and keeps the last deleted row's
(seq, hash) as the chain's anchor, so `verify()` starts there; the export file verifies alone
(`verify_lines`) and its last hash is the anchor's or a later row's prev_hash.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TextIO

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Float,
    Index,
    Integer,
    String,
    Table,
    Text,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from recovery import clock, store, validate
from recovery.schema import metadata

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
Index("ix_audit_ts", audit.c.ts)
exports = Table(
    "goodput_audit_exports",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("ts", Float, nullable=False),
    Column("first_seq", Integer, nullable=False),
    Column("last_seq", Integer, nullable=False),
    Column("last_hash", String(64), nullable=False),
    Column("rows", Integer, nullable=False),
    Column("sha256", String(64), nullable=False),  # of the file's bytes
    Column("destination", Text, nullable=False),
    Column("actor", String(128), nullable=False),
)
anchor = Table(  # one row (id 1) once anything was pruned: the last deleted row
    "goodput_audit_anchor",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("seq", Integer, nullable=False),
    Column("hash", String(64), nullable=False),
    Column("ts", Float, nullable=False),
)

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
    "effect_lost",
    "paused",
    "resumed",
    "notified",
    "recovered",
    "check_planned",
    "check_started",
    "check_passed",
    "check_failed",
    "check_rma",
    "check_held",
    "hold_released",
    "diagnostics_captured",
    "exported",
    "pruned",
    "watchdog_stopped",
    "watchdog_resumed",
)


@dataclass(frozen=True)
class Verification:
    ok: bool
    rows: int
    first_bad_seq: int | None = None
    problem: str = ""


_FIELDS = ("seq", "ts", "type", "job_id", "incident_id", "action_id", "actor", "payload")


def _canonical(row: dict[str, Any]) -> str:
    return json.dumps({k: row[k] for k in _FIELDS}, sort_keys=True, separators=(",", ":"))


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
        "ts": round(ts if ts is not None else clock.now(conn), 6),
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
    d["payload"] = store.loads(d["payload"])
    return validate.scrub(d)


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


def check_chain(
    rows: Iterable[dict[str, Any]], prev: str = GENESIS, expected: int = 1
) -> Verification:
    """The chain check itself: contiguous seqs from `expected`, each hash over `prev`."""
    n = 0
    for row in rows:
        n += 1
        if row["seq"] != expected:
            return Verification(False, n, row["seq"], f"seq gap: expected {expected}")
        if row["prev_hash"] != prev:
            return Verification(False, n, row["seq"], "prev_hash does not match previous row")
        if _hash(prev, row) != row["hash"]:
            return Verification(False, n, row["seq"], "content does not match its hash")
        prev, expected = row["hash"], expected + 1
    return Verification(True, n)


def verify(engine: Engine) -> Verification:
    """Recompute the chain from genesis, or from the anchor left by `prune`."""
    with engine.connect() as conn:
        a = conn.execute(select(anchor.c.seq, anchor.c.hash)).first()
        exported = conn.execute(select(func.max(exports.c.last_seq))).scalar()
    if a is None:
        return check_chain(iter_all(engine))
    if exported is None or a.seq > exported:
        return Verification(False, 0, a.seq, "rows were pruned past the last export")
    return check_chain(iter_all(engine), a.hash, a.seq + 1)


def _line(row: dict[str, Any]) -> str:
    return json.dumps({**row, "payload": json.loads(row["payload"])}, sort_keys=True) + "\n"


def verify_lines(lines: Iterable[str]) -> Verification:
    """Check an export file's chain on its own (from its first row's seq and prev_hash);
    ValueError naming the line when one is not an exported event."""
    rows = []
    for n, text in enumerate(lines, 1):
        if text.strip():
            try:
                row = json.loads(text)
                row["payload"] = json.dumps(row["payload"], sort_keys=True, separators=(",", ":"))
                missing = {*_FIELDS, "prev_hash", "hash"} - set(row)
            except (ValueError, TypeError, KeyError) as exc:
                raise ValueError(f"line {n} is not an exported audit event ({exc})") from None
            if missing:
                raise ValueError(f"line {n} is not an exported audit event (no {sorted(missing)})")
            rows.append(row)
    if not rows:
        return Verification(True, 0)
    return check_chain(rows, rows[0]["prev_hash"], rows[0]["seq"])


def export(engine: Engine, out: TextIO) -> dict[str, Any] | None:
    """Write every stored event to `out` (JSON lines, oldest first); its summary, or None
    when the log is empty. Make `out` durable, then `record_export` the summary."""
    digest, first, last, n = hashlib.sha256(), None, None, 0
    for row in iter_all(engine):
        line = _line(row)
        out.write(line)
        digest.update(line.encode())
        first = row["seq"] if first is None else first
        last, n = row, n + 1
    out.flush()
    if last is None or first is None:
        return None
    return {
        "first_seq": first,
        "last_seq": last["seq"],
        "last_hash": last["hash"],
        "rows": n,
        "sha256": digest.hexdigest(),
    }


def record_export(
    engine: Engine, summary: dict[str, Any], destination: str, actor: str = "goodput"
) -> dict[str, Any]:
    """Record a durable export (table and `exported` event): its events may now be pruned."""
    rec = {**summary, "ts": round(clock.now(engine), 6), "destination": destination[:1000]}
    for attempt in range(20):
        try:
            with engine.begin() as conn:
                conn.execute(insert(exports).values(**rec, actor=actor[:128]))
                append(conn, "exported", rec, actor=actor)
            return rec
        except IntegrityError:
            time.sleep(0.01 * (attempt + 1))
    raise RuntimeError("could not record the export: persistent seq conflicts")


def prune(engine: Engine, older_than_days: float, now: float | None = None) -> int:
    """Delete events older than `older_than_days` that an export holds; returns how many.

    Only a prefix goes (every row up to the cut is older and exported) and never the newest
    row, so the next `append` still chains on; the anchor keeps the last deleted (seq, hash).
    """
    now = clock.now(engine) if now is None else now
    cutoff = now - older_than_days * 86400.0
    for attempt in range(20):
        try:
            with engine.begin() as conn:
                return _prune(conn, cutoff, now)
        except IntegrityError:
            time.sleep(0.01 * (attempt + 1))
    raise RuntimeError("could not prune the audit log: persistent seq conflicts")


def _prune(conn: Connection, cutoff: float, now: float) -> int:
    exported = conn.execute(select(func.max(exports.c.last_seq))).scalar()
    newest = conn.execute(select(func.max(audit.c.seq))).scalar()
    if exported is None or newest is None:
        return 0
    young = conn.execute(select(func.min(audit.c.seq)).where(audit.c.ts >= cutoff)).scalar()
    upto = min(int(exported), int(newest) - 1, int(young) - 1 if young is not None else newest)
    row = conn.execute(select(audit.c.hash).where(audit.c.seq == upto)).first()
    if row is None:
        return 0  # nothing stored at or before the cut (already pruned)
    n = int(conn.execute(delete(audit).where(audit.c.seq <= upto)).rowcount or 0)
    values = {"seq": upto, "hash": row.hash, "ts": now}
    if conn.execute(update(anchor).where(anchor.c.id == 1).values(**values)).rowcount == 0:
        conn.execute(insert(anchor).values(id=1, **values))
    append(conn, "pruned", {"up_to_seq": upto, "rows": n, "anchor_hash": row.hash}, ts=now)
    return n

"""The receiver's durable store: SQLAlchemy Core tables on SQLite (WAL) or PostgreSQL.

`make_engine(url)` returns a ready engine, its database migrated to the newest schema
(`recovery.schema.upgrade`). The receiver's tables are here; other recovery modules define
theirs, all on the one `recovery.schema.metadata`. Times are stored as float unix
seconds (portable across both databases); JSON as text.

Webhook bodies are kept once per distinct body (`store_payloads`: a redelivery counts
`deliveries` and moves `last_seen`) and pruned after the policy's `retention.payload_days`
(`prune_payloads`).
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Column,
    Engine,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    delete,
    event,
    func,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, make_url

from recovery import clock as clocks
from recovery import validate
from recovery.schema import metadata, upgrade

# Every distinct accepted webhook body, verbatim (the durable record before the 200); a
# redelivery of the same bytes counts in `deliveries` and moves `last_seen`.
payloads = Table(
    "receiver_payloads",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("received_at", Float, nullable=False),
    Column("group_key", Text, nullable=False, default=""),
    Column("status", String(16), nullable=False),
    Column("body", Text, nullable=False),
    Column("digest", String(64), nullable=True),  # sha256 of the body; NULL on older rows
    Column("deliveries", Integer, nullable=True),
    Column("last_seen", Float, nullable=True),
)
Index("uq_payload_digest", payloads.c.digest, unique=True)
Index("ix_payload_seen", payloads.c.last_seen)

# One row per alert instance: (fingerprint, starts_at) is Alertmanager's identity.
alerts = Table(
    "receiver_alerts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("fingerprint", String(64), nullable=False),
    Column("starts_at", String(64), nullable=False),
    Column("starts_ts", Float, nullable=False),
    Column("ends_ts", Float, nullable=True),
    Column("status", String(16), nullable=False),
    Column("alertname", String(128), nullable=False),
    Column("severity", String(32), nullable=False, default=""),
    Column("job_id", String(32), nullable=True),
    Column("node", String(64), nullable=True),
    Column("gpu", String(8), nullable=True),
    Column("labels", Text, nullable=False),
    Column("annotations", Text, nullable=False),
    Column("received_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    UniqueConstraint("fingerprint", "starts_at", name="uq_alert_identity"),
)

incidents = Table(
    "receiver_incidents",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(32), nullable=True),
    Column("node", String(64), nullable=True),  # set for node-only incidents (no job there)
    Column("state", String(16), nullable=False),  # open | resolved
    Column("opened_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("resolved_at", Float, nullable=True),
    Column("first_alert_ts", Float, nullable=True),
    Column("outcome", String(32), nullable=True),
    Column("diagnosis_state", String(16), nullable=False, default="pending"),  # pending|done
    Column("diagnosis_due", Float, nullable=True),
    Column("diagnosis_gen", Integer, nullable=False, default=0),  # bumped by each new alert
    Column("diagnosis_attempts", Integer, nullable=False, default=0),
    # The receiver diagnosing it now, and until when (recovery.leases); NULL when nobody is.
    Column("diagnosis_owner", String(64), nullable=True),
    Column("diagnosis_lease", Float, nullable=True),
)
Index("ix_incident_job_state", incidents.c.job_id, incidents.c.state)
Index("ix_incident_diag", incidents.c.diagnosis_state, incidents.c.diagnosis_due)

incident_alerts = Table(
    "receiver_incident_alerts",
    metadata,
    Column("incident_id", Integer, ForeignKey("receiver_incidents.id"), nullable=False),
    Column("alert_id", Integer, ForeignKey("receiver_alerts.id"), nullable=False),
    UniqueConstraint("incident_id", "alert_id", name="uq_incident_alert"),
)
# an alert's incidents, looked up on each status change of it (`incidents._linked_incidents`)
Index("ix_incident_alerts_alert", incident_alerts.c.alert_id)

diagnoses = Table(
    "receiver_diagnoses",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("incident_id", Integer, ForeignKey("receiver_incidents.id"), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("outcome", String(32), nullable=False),
    Column("body", Text, nullable=False),
)
Index("ix_diag_incident", diagnoses.c.incident_id)


def normalize_url(url: str) -> str:
    """Map plain `postgresql://` URLs onto the installed psycopg 3 driver."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def make_engine(url: str, create: bool = True, clock: clocks.Clock | None = None) -> Engine:
    """An engine for `url` (SQLite in WAL mode, or PostgreSQL), its database migrated; with
    `clock`, bound to it first (`recovery.clock.bind`), so the migration's rows read it too."""
    url = normalize_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if create and db and db != ":memory:":
            Path(db).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, future=True
        )

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            if db and db != ":memory:":
                cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

    else:
        engine = create_engine(url, pool_pre_ping=True, future=True)
    if clock is not None:
        clocks.bind(engine, clock)
    if create:
        upgrade(engine)
    return engine


def store_payloads(conn: Connection, bodies: list[tuple[str, str, str]], now: float) -> None:
    """Keep each (body, group_key, status) once: a new body is inserted, a redelivered one
    counted (race-free upsert); one statement for the lot (the webhook's group commit)."""
    rows: dict[str, dict[str, Any]] = {}
    for body, group_key, status in bodies:
        digest = hashlib.sha256(body.encode()).hexdigest()
        if digest in rows:  # the same body twice in one batch: one row, both deliveries
            rows[digest]["deliveries"] += 1
            continue
        rows[digest] = {
            "received_at": now,
            "group_key": validate.column(group_key[:4096]),
            "status": status,
            "body": body,
            "digest": digest,
            "deliveries": 1,
            "last_seen": now,
        }
    if rows:
        conn.execute(_payload_upsert(conn.dialect.name), list(rows.values()))


@functools.cache
def _payload_upsert(dialect_name: str) -> Any:
    """The upsert, built once per dialect (the webhook runs it for every payload)."""
    stmt = (sqlite if dialect_name == "sqlite" else postgresql).insert(payloads)
    return stmt.on_conflict_do_update(
        index_elements=[payloads.c.digest],
        set_={
            "deliveries": payloads.c.deliveries + stmt.excluded.deliveries,
            "last_seen": stmt.excluded.last_seen,
        },
    )


def prune_payloads(engine: Engine, older_than_days: float, now: float) -> int:
    """Delete stored bodies last seen more than `older_than_days` ago; returns how many."""
    cutoff = now - older_than_days * 86400.0
    seen = func.coalesce(payloads.c.last_seen, payloads.c.received_at)
    with engine.begin() as conn:
        return int(conn.execute(delete(payloads).where(seen < cutoff)).rowcount or 0)


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def loads(text: str | None) -> Any:
    """A stored JSON body; None when empty or unreadable (a bad row never breaks a page or API).

    Lone surrogates (stored before the edge refused them) come back as U+FFFD.
    """
    try:
        return validate.scrub(json.loads(text)) if text else None
    except (ValueError, RecursionError):
        return None

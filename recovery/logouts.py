"""Console sessions ended by logging out.

A session cookie is signed and carries its own expiry, so deleting it in the browser does not
end it: a copy (another tab's, a proxy log's) would still work for up to 12 h. Logging out
records the session's id here until the cookie would have expired; a recorded session is no
session. Retention deletes rows whose cookie has expired (`prune`).
"""

from __future__ import annotations

from sqlalchemy import Column, Engine, Float, String, Table, delete, select
from sqlalchemy.exc import IntegrityError

from recovery.schema import metadata

logouts = Table(
    "goodput_console_logouts",
    metadata,
    Column("sid", String(64), primary_key=True),
    Column("expires_at", Float, nullable=False),
)


def record(engine: Engine, sid: str, expires_at: float) -> None:
    """End session `sid` (idempotent: a second logout of the same session changes nothing)."""
    try:
        with engine.begin() as conn:
            conn.execute(logouts.insert().values(sid=sid, expires_at=expires_at))
    except IntegrityError:
        pass  # already ended


def ended(engine: Engine, sid: str) -> bool:
    with engine.connect() as conn:
        return conn.execute(select(logouts.c.sid).where(logouts.c.sid == sid)).first() is not None


def prune(engine: Engine, now: float) -> int:
    """Forget ended sessions whose cookie has expired anyway; returns how many."""
    with engine.begin() as conn:
        return int(conn.execute(delete(logouts).where(logouts.c.expires_at < now)).rowcount or 0)

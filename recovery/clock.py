"""The receiver's clock: wall time in production, a simulated one in the benchmark.

`Settings.clock` names it; `create_app` binds it to the store engine it opens (`bind`, before
the schema is migrated: `store.make_engine(url, clock=)`), and code that holds the store (an
Engine or a Connection) reads the time with `now(db)`, so the incident, diagnosis, outbox, audit
and budget-lock rows of one receiver, and the settle, recheck, retry and blast-radius windows
computed from them, all run on one clock. An unbound store reads the wall clock.
"""

from __future__ import annotations

import time
import weakref
from typing import Protocol

from sqlalchemy import Connection, Engine


class Clock(Protocol):
    def now(self) -> float: ...


class WallClock:
    """Unix time."""

    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told (`t`): the benchmark's simulated time."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


WALL = WallClock()
_bound: weakref.WeakKeyDictionary[Engine, Clock] = weakref.WeakKeyDictionary()


def bind(engine: Engine, clock: Clock) -> None:
    """Make `clock` the time of everything that reads `engine`'s store."""
    _bound[engine] = clock


def now(db: Engine | Connection | None = None) -> float:
    """The time of `db`'s receiver (the wall clock when none is bound)."""
    engine = db.engine if isinstance(db, Connection) else db
    found = _bound.get(engine) if engine is not None else None
    return (found or WALL).now()

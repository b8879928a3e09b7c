"""The receiver's one schema: the `MetaData` every store table is defined on, its Alembic
migrations (`recovery/migrations/`), and the advisory locks that writers sharing a PostgreSQL
take.

The tables stay next to the code that reads them (`store`, `outbox`, `audit`, `accounting`,
`node_checks`, `logouts`), all on `metadata`. `upgrade(engine)` brings a database to the
newest revision, once per engine: a fresh one gets every table, one made before migrations
(by the old `ensure()` calls, no `alembic_version`) is completed by the baseline revision
and stamped.
It runs where an engine is made for the service (`store.make_engine`: the app, the CLI,
`goodput receiver db upgrade`), never lazily in a store call: a store call on a database never
migrated fails, naming the missing table.
A change to a table needs a revision (`tests/unit/test_schema_migrations.py` fails without).
"""

from __future__ import annotations

import threading
import weakref
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, MetaData, text

metadata = MetaData()

# Keys of PostgreSQL's transaction-level advisory locks (`serialize`).
INGEST_LOCK = 0x60_0D_0001
MIGRATE_LOCK = 0x60_0D_0002

_MIGRATIONS = Path(__file__).with_name("migrations")
_upgraded: weakref.WeakSet[Engine] = weakref.WeakSet()
_lock = threading.Lock()


def serialize(conn: Connection, key: int) -> None:
    """Hold the advisory lock `key` until `conn`'s transaction ends, so receivers sharing one
    PostgreSQL take turns (each waits for the other's commit). On SQLite, one receiver per
    store, its in-process lock and SQLite's writer lock do the same: nothing to take here."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})


def config(conn: Connection | None = None) -> Config:
    """Alembic's configuration, built in code (no alembic.ini); `conn` is what it migrates."""
    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    cfg.attributes["connection"] = conn
    return cfg


def head() -> str | None:
    """The newest revision."""
    return ScriptDirectory.from_config(config()).get_current_head()


def current(engine: Engine) -> str | None:
    """The revision `engine`'s database is at (None: not migrated yet)."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine) -> None:
    """Migrate `engine`'s database to the newest revision (once per engine; thread-safe).
    Receivers starting together on one PostgreSQL take turns: the first migrates, the others
    wait for its commit and find nothing to do."""
    if engine in _upgraded:
        return
    with _lock:
        if engine in _upgraded:
            return
        with engine.begin() as conn:
            serialize(conn, MIGRATE_LOCK)
            command.upgrade(config(conn), "head")
        _upgraded.add(engine)

"""The store's one schema and its Alembic migrations (`recovery.schema`)."""

from __future__ import annotations

import threading

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import (
    Column,
    Float,
    MetaData,
    String,
    Table,
    create_engine,
    event,
    inspect,
    select,
    text,
)
from sqlalchemy.pool import StaticPool

from recovery import accounting, audit, logouts, node_checks, outbox, schema, store  # noqa: F401
from recovery.store import make_engine

# What the receiver's ensure() code made before the columns added for HA and payload dedup
# (receiver_incidents without diagnosis_owner/diagnosis_lease, receiver_payloads without
# digest/deliveries/last_seen, goodput_actions without lease_until) and before the outbox's
# indexes; the other tables are missing altogether.
OLD = [
    """CREATE TABLE receiver_payloads (id INTEGER NOT NULL PRIMARY KEY, received_at FLOAT NOT
    NULL, group_key TEXT NOT NULL, status VARCHAR(16) NOT NULL, body TEXT NOT NULL)""",
    """CREATE TABLE receiver_incidents (id INTEGER NOT NULL PRIMARY KEY, job_id VARCHAR(32),
    node VARCHAR(64), state VARCHAR(16) NOT NULL, opened_at FLOAT NOT NULL, updated_at FLOAT
    NOT NULL, resolved_at FLOAT, first_alert_ts FLOAT, outcome VARCHAR(32), diagnosis_state
    VARCHAR(16) NOT NULL, diagnosis_due FLOAT, diagnosis_gen INTEGER NOT NULL,
    diagnosis_attempts INTEGER NOT NULL)""",
    """CREATE TABLE goodput_actions (id VARCHAR(80) NOT NULL PRIMARY KEY, incident_id
    VARCHAR(64), job_id VARCHAR(32), kind VARCHAR(32) NOT NULL, state VARCHAR(24) NOT NULL,
    mode VARCHAR(16) NOT NULL, body TEXT NOT NULL, restarts_before INTEGER, created_at FLOAT
    NOT NULL, updated_at FLOAT NOT NULL, expires_at FLOAT, next_attempt_at FLOAT, attempts
    INTEGER NOT NULL, owner VARCHAR(64), decided_by VARCHAR(128), last_error TEXT, result
    TEXT)""",
    "INSERT INTO receiver_payloads VALUES (1, 10.0, 'g', 'firing', '{}')",
    """INSERT INTO receiver_incidents VALUES (7, '42', NULL, 'open', 1.0, 2.0, NULL, NULL, NULL,
    'pending', 3.0, 1, 0)""",
    """INSERT INTO goodput_actions VALUES ('a1', '7', '42', 'requeue', 'executed', 'act', '{}',
    0, 1.0, 2.0, NULL, NULL, 1, NULL, NULL, NULL, NULL)""",
]


def _diffs(engine) -> list:
    with engine.connect() as conn:
        return compare_metadata(MigrationContext.configure(conn), schema.metadata)


def test_a_fresh_database_gets_every_table_and_the_head_revision():
    engine = make_engine("sqlite://")
    tables = set(inspect(engine).get_table_names())
    assert set(schema.metadata.tables) <= tables and len(schema.metadata.tables) == 13
    assert schema.current(engine) == schema.head() == "0004"
    with engine.connect() as conn:
        assert conn.execute(select(outbox.switches.c.value)).scalars().all() == ["lock"]
    assert _diffs(engine) == []


def test_a_database_made_before_migrations_is_completed_and_keeps_its_rows(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    old = create_engine(url)
    with old.begin() as conn:
        for sql in OLD:
            conn.execute(text(sql))
    old.dispose()
    engine = make_engine(url)
    assert schema.current(engine) == "0004"
    cols = {t: {c["name"] for c in inspect(engine).get_columns(t)} for t in schema.metadata.tables}
    assert {"diagnosis_owner", "diagnosis_lease"} <= cols["receiver_incidents"]
    assert {"digest", "deliveries", "last_seen"} <= cols["receiver_payloads"]
    assert "lease_until" in cols["goodput_actions"]
    with engine.connect() as conn:
        assert conn.execute(select(store.payloads.c.body)).scalars().all() == ["{}"]
        assert conn.execute(select(store.incidents.c.id)).scalars().all() == [7]
        assert conn.execute(select(outbox.actions_table.c.state)).scalars().all() == ["executed"]
    names = {ix["name"] for ix in inspect(engine).get_indexes("goodput_actions")}
    assert names == {ix.name for ix in outbox.actions_table.indexes}
    assert _diffs(engine) == []
    make_engine(url)  # a second start finds nothing to do
    assert schema.current(make_engine(url)) == "0004"


def test_a_database_made_by_create_all_is_stamped_without_change(tmp_path):
    url = f"sqlite:///{tmp_path / 'ensure.db'}"
    old = create_engine(url)
    later = {logouts.logouts.name}  # tables that revisions after the baseline add
    baseline = [t for t in schema.metadata.sorted_tables if t.name not in later]
    schema.metadata.create_all(old, tables=baseline)  # exactly what the ensure() calls made
    with old.begin() as conn:
        conn.execute(text("DROP INDEX ix_goodput_actions_state_updated"))  # revision 0003's
        conn.execute(text("DROP INDEX ix_incident_alerts_alert"))  # revision 0004's
        conn.execute(text("INSERT INTO goodput_audit_anchor VALUES (1, 5, 'h', 1.0)"))
    old.dispose()
    engine = make_engine(url)
    assert schema.current(engine) == "0004" and _diffs(engine) == []
    with engine.connect() as conn:
        assert conn.execute(select(audit.anchor.c.seq)).scalars().all() == [5]


def test_a_column_added_without_a_migration_is_caught():
    """The guard `_diffs(...) == []` above is not vacuous: a Table that gains a column on the
    metadata but not in a revision shows up as a difference."""
    engine = make_engine("sqlite://")
    meta = MetaData()
    for table in schema.metadata.sorted_tables:
        table.to_metadata(meta)
    Table("goodput_switches", meta, Column("note", String(64)), extend_existing=True)
    Table("gamma", meta, Column("x", Float))
    with engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn), meta)
    assert {d[0] for d in diffs} == {"add_column", "add_table"} and len(diffs) == 2


def test_an_in_memory_engine_on_a_static_pool_is_migrated_once_for_every_thread():
    engine = create_engine(
        "sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False}
    )
    schema.upgrade(engine)
    schema.upgrade(engine)  # once per engine
    seen: list[str | None] = []
    t = threading.Thread(target=lambda: seen.append(schema.current(engine)))
    t.start()
    t.join()
    assert seen == ["0004"]
    with engine.connect() as conn:
        assert conn.execute(select(accounting.incidents)).all() == []


def test_the_cli_reports_and_runs_the_migration(tmp_path):
    from typer.testing import CliRunner

    from goodput.cli import app as cli

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    runner = CliRunner()
    missing = runner.invoke(cli, ["receiver", "db", "current", "--db-url", url])
    assert missing.exit_code == 2 and "no database at" in missing.output
    assert not (tmp_path / "cli.db").exists()  # asking created nothing
    (tmp_path / "cli.db").touch()  # an empty database: there, not migrated
    before = runner.invoke(cli, ["receiver", "db", "current", "--db-url", url])
    assert before.exit_code == 1 and "not migrated" in before.output
    assert runner.invoke(cli, ["receiver", "db", "upgrade", "--db-url", url]).output == "at 0004\n"
    after = runner.invoke(cli, ["receiver", "db", "current", "--db-url", url])
    assert after.exit_code == 0 and after.output == "0004 (head 0004)\n"


def test_nothing_migrates_lazily_so_a_store_never_migrated_fails_naming_its_table(tmp_path):
    """The schema is migrated once, where an engine is made for the service (`make_engine`:
    the app, the CLI, `goodput receiver db upgrade`); store calls do not migrate, so one on an
    engine made without it fails at once, naming the missing table."""
    from sqlalchemy.exc import OperationalError

    from recovery import action_config

    engine = make_engine(f"sqlite:///{tmp_path}/bare.db", create=False)
    with pytest.raises(OperationalError, match="no such table: goodput_actions"):
        outbox.get_action(engine, "inc-1")
    with pytest.raises(OperationalError, match="no such table: goodput_switches"):
        action_config.is_paused(engine)
    assert schema.current(engine) is None


def test_an_alerts_incidents_are_found_by_index_not_by_a_scan_of_the_links():
    """Each status change of an alert looks up its incidents (`incidents._linked_incidents`);
    the link table is never pruned, so a scan grew with every alert ever linked."""
    from recovery.incidents import _linked_incidents

    engine = make_engine("sqlite://")
    with engine.connect() as conn:
        seen: list[str] = []
        event.listen(conn, "before_cursor_execute", lambda *a: seen.append(a[2]))
        _linked_incidents(conn, 7)
        plan = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + seen[-1], (7,)).all()
    detail = " ".join(str(row[-1]) for row in plan)
    assert "ix_incident_alerts_alert" in detail and "SCAN" not in detail, detail

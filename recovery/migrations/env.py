"""Alembic's environment: migrates the connection `recovery.schema.config` hands over."""

from alembic import context

from recovery import accounting, audit, logouts, node_checks, outbox, store  # noqa: F401
from recovery.schema import metadata

conn = context.config.attributes.get("connection")
if conn is None:
    raise RuntimeError("run migrations through recovery.schema (goodput receiver db upgrade)")
context.configure(connection=conn, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()

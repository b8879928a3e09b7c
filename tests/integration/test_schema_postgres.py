"""Migrations on the stack's real PostgreSQL: receivers that start together migrate once."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from sqlalchemy import text

from recovery import accounting, audit, node_checks, outbox, schema  # noqa: F401 (tables)
from recovery.store import make_engine
from tests.integration.test_receiver_postgres import pg_url  # noqa: F401 - the fixture

# One receiver's start, in its own process (threads would take turns on schema's own lock):
# wait for the common start time, migrate, print the tables it created.
START = """
import json, sys, time
from sqlalchemy import event
from recovery import schema
from recovery.store import make_engine
engine = make_engine(sys.argv[1], create=False)
made = []
@event.listens_for(engine, "before_cursor_execute")
def count(_c, _k, statement, *_a):
    if statement.lstrip().upper().startswith("CREATE TABLE"):
        made.append(statement.split("(")[0].split()[-1])
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
schema.upgrade(engine)
print(json.dumps(made))
"""


def test_two_receivers_upgrading_at_once_migrate_once(pg_url):  # noqa: F811
    at = str(time.time() + 4)
    procs = [
        subprocess.Popen([sys.executable, "-c", START, pg_url, at], stdout=subprocess.PIPE)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    made = sorted((sorted(json.loads(o)) for o in outs), key=len)
    # every table once, by one of them: the other waited for its commit and found it done
    assert made == [[], sorted([*schema.metadata.tables, "alembic_version"])]
    engine = make_engine(pg_url, create=False)
    assert schema.current(engine) == schema.head()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM alembic_version")).scalar() == 1
        assert conn.execute(text("SELECT count(*) FROM goodput_switches")).scalar() == 1
    engine.dispose()

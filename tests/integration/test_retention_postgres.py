"""Retention on the stack's real PostgreSQL: an old table gains its columns, 40 concurrent
redeliveries of one body leave one row counting 40, audit export + prune + verify."""

from __future__ import annotations

import io
import json
from concurrent.futures import ThreadPoolExecutor

from fastapi.testclient import TestClient
from sqlalchemy import select, text

from recovery import audit, schema
from recovery.app import create_app
from recovery.settings import Settings
from recovery.store import make_engine, payloads
from tests.integration.test_receiver_postgres import pg_url  # noqa: F401 - the fixture
from tests.unit.test_receiver_webhook import alert, payload


def test_redeliveries_upsert_and_audit_prune_on_postgres(pg_url):  # noqa: F811
    legacy = make_engine(pg_url, create=False)
    with legacy.begin() as conn:
        conn.execute(
            text(
                "CREATE TABLE receiver_payloads (id SERIAL PRIMARY KEY, received_at FLOAT NOT"
                " NULL, group_key TEXT NOT NULL, status VARCHAR(16) NOT NULL, body TEXT NOT NULL)"
            )
        )
    s = Settings(db_url=pg_url, require_auth=False, slurm_enabled=False, settle_s=3600)
    app = create_app(s, start_worker=False)
    client = TestClient(app)
    body = json.dumps(payload(alert(job_id="7")))

    def post(_i):
        return client.post(
            "/api/v1/alerts", content=body, headers={"Content-Type": "application/json"}
        ).status_code

    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(post, range(40))) == {200}
    engine = app.state.engine
    with engine.connect() as conn:
        rows = conn.execute(select(payloads.c.deliveries)).all()
    assert [r.deliveries for r in rows] == [40]

    schema.upgrade(engine)
    for i in range(4):
        audit.record(engine, "notified", {"i": i}, ts=1000.0 + i)
    buf = io.StringIO()
    summary = audit.export(engine, buf)
    assert summary is not None
    audit.record_export(engine, summary, "memory")
    assert audit.prune(engine, 1, now=2_000_000.0) == 4
    assert audit.verify(engine).ok and audit.verify_lines(buf.getvalue().splitlines()).ok

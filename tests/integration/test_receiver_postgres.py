"""The receiver's store on the stack's real PostgreSQL."""

from __future__ import annotations

import threading
import time

import pytest
from fastapi.testclient import TestClient

from recovery import incidents, worker
from recovery.app import create_app
from recovery.settings import Settings
from tests.chaos.harness import pg_schema

# the receiver's own loops (the action reconciler and lease heartbeat, which the app starts
# once per engine unless GOODPUT_ACTIONS_THREAD=0; its worker, watchdog, node checks and
# pruner); left running they write the schema's tables and deadlock its DROP (CI, stop 37).
# The group-commit writer is not one: it ends once its queue stays empty.
LOOPS = ("goodput-actions", "goodput-leases", "goodput-diagnosis", "goodput-watchdog",
         "goodput-node-checks", "goodput-retention")  # fmt: skip


@pytest.fixture
def pg_url(local_stack, monkeypatch):
    """A private schema (concurrent users stay apart), the test driving every pass itself: a
    receiver loop the test leaves running fails it, and its schema is left, not dropped under
    the loop."""
    url = local_stack.get("GOODPUT_TEST_POSTGRES_URL")
    if not url:
        pytest.fail("GOODPUT_TEST_POSTGRES_URL missing from the stack env")
    monkeypatch.setenv("GOODPUT_ACTIONS_THREAD", "0")
    before = set(threading.enumerate())
    schema_url, drop = pg_schema(url)
    yield schema_url
    left = [t.name for t in threading.enumerate() if t.name in LOOPS and t not in before]
    assert not left, f"receiver loops left running on the test's schema ({schema_url}): {left}"
    drop()


def test_webhook_incidents_and_diagnosis_on_postgres(pg_url, tmp_path):
    s = Settings(
        db_url=pg_url,
        require_auth=False,
        slurm_enabled=False,
        settle_s=0,
        log_dir=str(tmp_path),
        prometheus_url=None,
    )
    app = create_app(s, start_worker=False)
    body = {
        "version": "4",
        "status": "firing",
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": "GoodputJobHung", "job_id": "31337"},
                "annotations": {},
                "startsAt": "2026-01-01T00:00:00Z",
                "fingerprint": "beef",
            }
        ],
    }
    with TestClient(app) as c:
        for _ in range(5):
            assert c.post("/api/v1/alerts", json=body).status_code == 200
        page = c.get("/api/v1/incidents").json()
        assert page["total"] == 1
        inc = page["items"][0]["id"]
        t0 = time.time()
        assert worker.run_once(app.state.engine, s, now=t0) == [inc]
        detail = c.get(f"/api/v1/incidents/{inc}").json()
    engine = app.state.engine
    assert detail["diagnosis"]["schema_version"] == "1"
    assert engine.dialect.name == "postgresql"
    # no evidence: `unknown`, rechecked (the count of unknown verdicts is SQL on PostgreSQL)
    assert incidents.incident(engine, inc)["diagnosis_state"] == "pending"
    for k in range(1, s.recheck_max + 1):
        assert worker.run_once(engine, s, now=t0 + k * (s.recheck_s + 1)) == [inc]
    assert incidents.incident(engine, inc)["diagnosis_state"] == "done"


def test_no_input_answers_5xx_on_postgres(pg_url, tmp_path):
    """PostgreSQL stores no NUL in text: a `%00` in a filter or an id, or a NUL in a decision's
    name or comment, answered 500 (psycopg DataError) where SQLite answered 200; a NUL in an
    alert's label is kept (the payload is JSON text), and read as U+FFFD in the columns of
    alertname, severity and groupKey (a NUL there answered 500)."""
    s = Settings(db_url=pg_url, require_auth=False, slurm_enabled=False, settle_s=3600,
                 log_dir=str(tmp_path), prometheus_url=None)  # fmt: skip
    app = create_app(s, start_worker=False)
    gets = ["/api/v1/actions/a%00b", "/api/v1/actions?state=a%00b", "/api/v1/audit?type=a%00b",
            "/api/v1/audit?incident_id=a%00b", "/api/v1/audit?job_id=%00",
            "/api/v1/incidents?job_id=%00", "/console/incidents?outcome=%00"]  # fmt: skip
    posts = [("/api/v1/actions/pause", {"who": "a\u0000b"}),
             ("/api/v1/actions/resume", {"who": "ops", "comment": "a\u0000b"}),
             ("/api/v1/actions/x%00/approve", {"who": "ops"}),
             ("/api/v1/nodes/node1/resume", {"who": "a\u0000"})]  # fmt: skip
    alert = {"status": "firing", "startsAt": "2026-01-01T00:00:00Z", "fingerprint": "abc0",
             "labels": {"alertname": "GoodputJobHung\u0000", "severity": "crit\u0000",
                        "job_id": "77", "rack": "r\u00001"},
             "annotations": {"summary": "a\u0000b"}}  # fmt: skip
    with TestClient(app, raise_server_exceptions=False) as c:
        for url in gets:
            assert c.get(url).status_code == 400, url
        for url, body in posts:
            r = c.post(url, json=body)
            assert r.status_code in (400, 404, 422), (url, r.status_code, r.text)
        body = {"version": "4", "status": "firing", "alerts": [alert], "groupKey": "{}:\u0000"}
        r = c.post("/api/v1/alerts", json=body)
        assert r.status_code == 200, r.text
        assert c.get("/api/v1/incidents?job_id=77").json()["total"] == 1

"""Retention (issue 19, item 8): a redelivered webhook body is stored once and counted; bodies
and audit events are pruned by the policy's `retention`; audit events only once exported, and
the chain still verifies (from its anchor) after a prune."""

from __future__ import annotations

import io
import json
import time

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, delete, func, select, text, update
from typer.testing import CliRunner

from goodput.cli import app as cli
from recovery import audit, incidents, logouts, retention, schema
from recovery.app import create_app
from recovery.policy import PolicyError, Retention, parse_policy
from recovery.settings import Settings
from recovery.store import alerts, make_engine, payloads
from tests.unit.test_receiver_webhook import alert, payload

JSON = {"Content-Type": "application/json"}
DAY = 86400.0
NOW = 1_900_000_000.0


@pytest.fixture
def engine(tmp_path):
    e = make_engine(f"sqlite:///{tmp_path}/r.db")
    schema.upgrade(e)
    return e


def _count(engine, table) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table)).scalar_one()


def test_a_redelivered_body_is_stored_once_and_counted(tmp_path):
    s = Settings(db_url=f"sqlite:///{tmp_path}/w.db", require_auth=False, slurm_enabled=False)
    client = TestClient(create_app(s, start_worker=False))
    body = json.dumps(payload(alert(job_id="7")))
    for _ in range(5):
        r = client.post(
            "/api/v1/alerts", content=body, headers={"Content-Type": "application/json"}
        )
        assert r.status_code == 200
    other = json.dumps(payload(alert(fp="beef", job_id="7")))
    client.post("/api/v1/alerts", content=other, headers={"Content-Type": "application/json"})
    engine = client.app.state.engine
    with engine.connect() as conn:
        rows = conn.execute(select(payloads).order_by(payloads.c.id)).all()
    assert [(r.body, r.deliveries) for r in rows] == [(body, 5), (other, 1)]
    assert rows[0].last_seen >= rows[0].received_at


def test_a_logout_is_forgotten_once_its_cookie_has_expired(engine):
    logouts.record(engine, "gone", expires_at=NOW - 1)
    logouts.record(engine, "live", expires_at=NOW + 3600)
    logouts.record(engine, "live", expires_at=NOW + 3600)  # a second logout changes nothing
    assert retention.apply(engine, Retention(), now=NOW)["logouts"] == 1
    assert not logouts.ended(engine, "gone") and logouts.ended(engine, "live")


def test_old_bodies_are_pruned_and_incidents_kept(engine):
    settings = Settings(db_url="sqlite://", slurm_enabled=False)
    incidents.ingest(engine, settings, [alert(job_id="1")], raw="old", now=NOW - 40 * DAY)
    incidents.ingest(engine, settings, [alert(fp="b", job_id="1")], raw="new", now=NOW - DAY)
    incidents.ingest(engine, settings, [alert(fp="c", job_id="1")], raw="old", now=NOW - DAY)
    assert _count(engine, payloads) == 2  # "old" was seen again a day ago: kept
    incidents.ingest(engine, settings, [alert(fp="d", job_id="2")], raw="stale", now=NOW - 31 * DAY)
    deleted = retention.apply(engine, Retention(payload_days=30), now=NOW)
    assert deleted == {"payloads": 1, "audit": 0, "logouts": 0}
    with engine.connect() as conn:
        assert sorted(conn.execute(select(payloads.c.body)).scalars()) == ["new", "old"]
    assert _count(engine, alerts) == 4  # the alerts and incidents are the record; kept


def test_a_database_made_before_retention_gains_the_columns(tmp_path):
    url = f"sqlite:///{tmp_path}/legacy.db"
    legacy = create_engine(url)
    with legacy.begin() as conn:
        conn.execute(
            text(
                "CREATE TABLE receiver_payloads (id INTEGER PRIMARY KEY, received_at FLOAT NOT"
                " NULL, group_key TEXT NOT NULL, status VARCHAR(16) NOT NULL, body TEXT NOT NULL)"
            )
        )
        conn.execute(text("INSERT INTO receiver_payloads VALUES (1, 5.0, '', 'firing', 'x')"))
    engine = make_engine(url)
    settings = Settings(db_url=url, slurm_enabled=False)
    for _ in range(2):
        incidents.ingest(engine, settings, [alert(job_id="1")], raw="y", now=NOW)
    with engine.connect() as conn:
        rows = conn.execute(select(payloads.c.body, payloads.c.deliveries)).all()
    assert sorted(rows) == [("x", None), ("y", 2)]
    assert store_prune(engine) == 1  # the legacy row goes by its received_at


def store_prune(engine) -> int:
    return retention.apply(engine, Retention(payload_days=1), now=NOW)["payloads"]


def _events(engine, n: int, age_days: float, now: float = NOW) -> None:
    for i in range(n):
        audit.record(engine, "notified", {"i": i, "note": "é"}, ts=now - age_days * DAY + i)


def _export(engine) -> str:
    buf = io.StringIO()
    summary = audit.export(engine, buf)
    assert summary is not None
    audit.record_export(engine, summary, "memory", actor="test")
    return buf.getvalue()


def test_audit_events_are_never_pruned_without_an_export(engine):
    _events(engine, 5, age_days=400)
    assert audit.prune(engine, 365, now=NOW) == 0
    assert _count(engine, audit.audit) == 5


def test_prune_stops_at_the_last_export_and_the_chain_still_verifies(engine):
    _events(engine, 5, age_days=400)
    exported = _export(engine)  # seqs 1..5, then the `exported` event is 6
    _events(engine, 3, age_days=390)  # 7..9: old, but not in any export
    assert audit.prune(engine, 365, now=NOW) == 5
    with engine.connect() as conn:
        seqs = list(conn.execute(select(audit.audit.c.seq).order_by(audit.audit.c.seq)).scalars())
        a = conn.execute(select(audit.anchor)).one()
    assert seqs == [6, 7, 8, 9, 10]  # 10 = the `pruned` event
    assert a.seq == 5 and a.hash == json.loads(exported.splitlines()[-1])["hash"]
    assert audit.verify(engine).ok
    assert audit.verify_lines(exported.splitlines()).ok
    # the chain goes on, and a second export + prune continues from the anchor
    audit.record(engine, "notified", {"after": True}, ts=NOW)
    _export(engine)
    assert audit.prune(engine, 365, now=NOW) == 4  # 6..9; the young events stay
    v = audit.verify(engine)
    assert v.ok, v


def test_the_newest_event_is_never_pruned(engine):
    _events(engine, 3, age_days=400)
    _export(engine)
    assert audit.prune(engine, 1, now=NOW + 400 * DAY) == 3  # not the `exported` event
    audit.record(engine, "notified", {}, ts=NOW)
    assert audit.verify(engine).ok


def test_tampering_after_a_prune_is_caught(engine):
    _events(engine, 4, age_days=400)
    _export(engine)
    audit.prune(engine, 365, now=NOW)
    with engine.begin() as conn:  # dropping the anchor makes the chain start mid-air
        conn.execute(delete(audit.anchor))
    assert not audit.verify(engine).ok
    with engine.begin() as conn:  # an anchor past every export: rows deleted unexported
        conn.execute(audit.anchor.insert().values(id=1, seq=99, hash="0" * 64, ts=NOW))
    v = audit.verify(engine)
    assert not v.ok and "past the last export" in v.problem
    lines = _export_lines_edited(engine)
    assert not audit.verify_lines(lines).ok


def _export_lines_edited(engine) -> list[str]:
    buf = io.StringIO()
    audit.export(engine, buf)
    lines = buf.getvalue().splitlines()
    row = json.loads(lines[1])
    row["payload"]["edited"] = True
    lines[1] = json.dumps(row)
    return lines


def test_cli_export_verify_file_and_prune(tmp_path, monkeypatch):
    db = f"sqlite:///{tmp_path}/cli.db"
    engine = make_engine(db)
    schema.upgrade(engine)
    _events(engine, 3, age_days=1000, now=time.time())
    policy = tmp_path / "policy.yaml"
    policy.write_text("retention: {audit_days: 30, payload_days: 30}\n")
    monkeypatch.setenv("GOODPUT_POLICY_FILE", str(policy))
    runner = CliRunner()
    pruned = runner.invoke(cli, ["audit", "prune", "--db", db]).output
    assert "0 audit events" in pruned and "0 expired logouts" in pruned
    out = tmp_path / "audit.jsonl"
    r = runner.invoke(cli, ["audit", "export", "--db", db, "-o", str(out), "--who", "ops"])
    assert r.exit_code == 0 and "exported events 1..3" in r.output
    assert runner.invoke(cli, ["audit", "verify", "--file", str(out)]).exit_code == 0
    r = runner.invoke(cli, ["audit", "prune", "--db", db])
    assert r.exit_code == 0 and "3 audit events" in r.output, r.output
    assert runner.invoke(cli, ["audit", "verify", "--db", db]).exit_code == 0
    with engine.connect() as conn:
        rec = conn.execute(select(audit.exports)).one()
    assert (rec.first_seq, rec.last_seq, rec.rows, rec.actor) == (1, 3, 3, "ops")
    with engine.begin() as conn:
        conn.execute(update(audit.audit).values(actor="mallory"))
    assert runner.invoke(cli, ["audit", "verify", "--db", db]).exit_code == 1


def test_retention_is_policy_data():
    p = parse_policy({"retention": {"payload_days": 7, "audit_days": 90}}, env={})
    assert (p.retention.payload_days, p.retention.audit_days) == (7, 90)
    assert parse_policy({}, env={}).retention.payload_days == 30
    for bad in ({"payload_days": 0}, {"audit_days": -1}, {"keep": "forever"}):
        with pytest.raises(PolicyError):
            parse_policy({"retention": bad}, env={})


def test_an_export_to_stdout_is_not_a_durable_copy(tmp_path, monkeypatch):
    # `goodput audit export | head` or `> /dev/null` recorded an export, and the next prune
    # deleted every old event that no file holds
    db = f"sqlite:///{tmp_path}/cli.db"
    engine = make_engine(db)
    schema.upgrade(engine)
    _events(engine, 3, age_days=1000, now=time.time())
    policy = tmp_path / "policy.yaml"
    policy.write_text("retention: {audit_days: 30, payload_days: 30}\n")
    monkeypatch.setenv("GOODPUT_POLICY_FILE", str(policy))
    runner = CliRunner()
    r = runner.invoke(cli, ["audit", "export", "--db", db])
    assert r.exit_code == 0 and len(r.stdout.splitlines()) == 3
    assert "not recorded" in r.stderr
    with engine.connect() as conn:
        assert conn.execute(select(audit.exports)).all() == []
    r = runner.invoke(cli, ["audit", "prune", "--db", db])
    assert "0 audit events" in r.output, r.output

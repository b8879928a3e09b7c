"""The actions API router and the `goodput actions` / `goodput audit` commands."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Connection, update
from typer.testing import CliRunner

from goodput.cli import app as cli
from recovery import action_config, actions, audit, outbox
from recovery.api_actions import router
from recovery.policy import parse_policy
from recovery.scheduler.simulated import SimulatedScheduler
from recovery.store import make_engine
from tests.unit.actions_fakes import make_fake_sim


@pytest.fixture(autouse=True)
def _no_thread(monkeypatch):
    monkeypatch.setenv("GOODPUT_ACTIONS_THREAD", "0")


@pytest.fixture
def api(tmp_path):
    sim, st, submit = make_fake_sim()
    submit("42", node="node2")
    app = FastAPI()
    app.include_router(router)
    app.state.engine = make_engine(f"sqlite:///{tmp_path / 'api.db'}")
    app.state.settings = SimpleNamespace(
        policy=parse_policy({"mode": "approve"}, env={}),
        alertmanager_url=None,
        scheduler_adapter=SimulatedScheduler("http://testserver", session=sim),
    )
    return TestClient(app), app, st


def plan(app):
    inc = {"id": 1, "job_id": "42", "state": "open", "opened_at": time.time()}
    d = {
        "incident_id": 1,
        "job_id": "42",
        "outcome": "gpu_hardware_fault",
        "root_cause": "xid79",
        "affected_nodes": ["node2"],
        "confidence": 0.9,
        "onset": time.time() - 5,
    }
    return actions.on_diagnosis(app.state.engine, app.state.settings, inc, d)


def test_api_approve_flow_and_audit(api):
    client, app, st = api
    a = plan(app)
    listed = client.get("/api/v1/actions", params={"state": "pending_approval"}).json()
    assert [x["id"] for x in listed["actions"]] == [a["id"]]
    assert client.post(f"/api/v1/actions/{a['id']}/approve", json={}).status_code == 422
    r = client.post(f"/api/v1/actions/{a['id']}/approve", json={"who": "alice"})
    assert r.status_code == 200 and r.json()["state"] == "executed"
    assert st["jobs"]["42"]["excluded"] == ["node2"]
    assert client.post(f"/api/v1/actions/{a['id']}/reject", json={"who": "bob"}).status_code == 409
    page = client.get("/api/v1/audit", params={"job_id": "42", "limit": 2}).json()
    assert len(page["events"]) == 2 and page["next_cursor"] == page["events"][-1]["seq"]
    rest = client.get("/api/v1/audit", params={"job_id": "42", "cursor": page["next_cursor"]})
    assert "approved" in [e["type"] for e in rest.json()["events"]]
    assert client.get("/api/v1/audit", params={"job_id": "x;y"}).status_code == 422
    assert client.get("/api/v1/audit/verify").json()["ok"] is True
    assert client.get("/api/v1/policy").json()["mode"] == "approve"
    assert client.post("/api/v1/actions/pause", json={"who": "ops"}).json() == {"paused": True}
    assert client.get("/api/v1/actions").json()["paused"] is True
    client.post("/api/v1/actions/resume", json={"who": "ops"})
    assert client.post("/api/v1/nodes/bad;node/resume", json={"who": "x"}).status_code == 422
    r = client.post("/api/v1/nodes/node2/resume", json={"who": "ops"})
    assert r.json()["state"] == "executed" and st["nodes"]["node2"]["reason"] == ""


def test_cli_audit_verify_detects_an_edited_row(api, tmp_path):
    _, app, _ = api
    plan(app)
    db = f"sqlite:///{tmp_path / 'api.db'}"
    runner = CliRunner()
    ok = runner.invoke(cli, ["audit", "verify", "--db", db])
    assert ok.exit_code == 0 and "chain intact" in ok.output
    out = runner.invoke(cli, ["audit", "export", "--db", db])
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    assert lines[0]["seq"] == 1 and lines[-1]["hash"]
    listed = runner.invoke(cli, ["actions", "list", "--db", db])
    assert "pending_approval" in listed.output
    with app.state.engine.begin() as conn:
        conn.execute(
            update(audit.audit).where(audit.audit.c.seq == 2).values(payload='{"kind":"none"}')
        )
    bad = runner.invoke(cli, ["audit", "verify", "--db", db])
    assert bad.exit_code == 1 and "seq 2" in bad.output


def test_cli_reject_and_pause(api, tmp_path):
    _, app, _ = api
    a = plan(app)
    db = f"sqlite:///{tmp_path / 'api.db'}"
    runner = CliRunner()
    r = runner.invoke(cli, ["actions", "reject", a["id"], "--who", "zoe", "--db", db])
    assert r.exit_code == 0
    assert outbox.get_action(app.state.engine, a["id"])["decided_by"] == "zoe"
    assert runner.invoke(cli, ["actions", "reject", "nope", "--db", db]).exit_code == 2
    again = runner.invoke(cli, ["actions", "approve", a["id"], "--db", db])  # rejected already
    assert again.exit_code == 2 and "not pending approval" in again.output
    runner.invoke(cli, ["actions", "pause", "--who", "zoe", "--db", db])
    assert action_config.is_paused(app.state.engine)


def test_a_verdict_after_another_receivers_expiry_changes_nothing(api, monkeypatch):
    """Between this receiver's read and its write another one expired the action (or a person
    approved it): the rejection is refused (409) instead of written over that state."""
    client, app, _st = api
    a = plan(app)
    real_now = outbox.now

    def expired_meanwhile(db):
        if isinstance(db, Connection):  # inside the verdict's write, after its read
            db.execute(
                update(outbox.actions_table)
                .where(outbox.actions_table.c.id == a["id"])
                .values(state="expired")
            )
        return real_now(db)

    monkeypatch.setattr(outbox, "now", expired_meanwhile)
    r = client.post(f"/api/v1/actions/{a['id']}/reject", json={"who": "bob"})
    assert r.status_code == 409 and "meanwhile" in r.text
    monkeypatch.setattr(outbox, "now", real_now)
    assert (
        outbox.get_action(app.state.engine, a["id"])["state"] == "pending_approval"
    )  # rolled back
    events = [
        e["type"] for e in client.get("/api/v1/audit", params={"job_id": "42"}).json()["events"]
    ]
    assert "rejected" not in events


def test_deciding_an_action_that_does_not_exist_is_a_404_not_a_conflict(api):
    """A script could not tell "no such action" (409 then) from "decided already" (409)."""
    client, app, _ = api
    for verdict in ("approve", "reject"):
        r = client.post(f"/api/v1/actions/nope/{verdict}", json={"who": "alice"})
        assert r.status_code == 404 and "no action nope" in r.text
    a = plan(app)
    assert client.post(f"/api/v1/actions/{a['id']}/reject", json={"who": "bob"}).status_code == 200
    assert client.post(f"/api/v1/actions/{a['id']}/approve", json={"who": "x"}).status_code == 409

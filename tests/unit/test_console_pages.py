"""The Recovery Console's pages through the TestClient: auth, CSRF, approvals, odd data."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from recovery import action_config, actions, audit, incidents, outbox
from recovery.app import create_app
from recovery.console import plot, security
from recovery.policy import parse_policy
from recovery.scheduler.simulated import SimulatedScheduler
from recovery.settings import Settings
from tests.unit.actions_fakes import make_fake_sim

TOKEN = "console-test-token"
ORIGIN = {"Origin": "http://testserver"}


@dataclasses.dataclass(frozen=True)
class ConsoleSettings(Settings):
    policy: Any = None
    scheduler_adapter: Any = None
    alertmanager_url: Any = None


@pytest.fixture(autouse=True)
def _no_thread(monkeypatch):
    monkeypatch.setenv("GOODPUT_ACTIONS_THREAD", "0")


@pytest.fixture
def env(tmp_path):
    sim, st, submit = make_fake_sim()
    (tmp_path / "token").write_text(TOKEN)
    settings = ConsoleSettings(
        db_url=f"sqlite:///{tmp_path / 'console.db'}",
        token_file=str(tmp_path / "token"),
        slurm_enabled=False,
        log_dir=str(tmp_path),
        policy=parse_policy({"mode": "approve"}, env={}),
        scheduler_adapter=SimulatedScheduler("http://testserver", session=sim),
    )
    app = create_app(settings, start_worker=False)
    return TestClient(app), app, st, submit


def alert(job: str | None, node: str, name="GoodputGPUFatalXid", fp="a", summary="XID 79"):
    labels = {"alertname": name, "node": node, "severity": "critical"}
    if job:
        labels["job_id"] = job
    return {
        "status": "firing",
        "labels": labels,
        "annotations": {"summary": summary},
        "startsAt": "2025-01-01T00:07:30Z",
        "fingerprint": fp,
    }


def diagnosis(incident_id: int, job: str, node: str, **over: Any) -> dict[str, Any]:
    now = time.time()
    d = {
        "schema_version": "1",
        "incident_id": incident_id,
        "job_id": job,
        "job_name": "gpt-a",
        "outcome": "gpu_hardware_fault",
        "category": "infrastructure",
        "root_cause": f"GPU 3 on {node} fell off the bus (XID 79)",
        "affected_nodes": [node],
        "affected_gpus": [{"node": node, "gpu": "3"}],
        "symptoms": [
            {
                "id": "xid_fatal",
                "role": "initiating",
                "first_seen": now - 60,
                "source": "log",
                "node": node,
                "gpu": "3",
                "detail": "XID 79",
            },
            {
                "id": "nccl_timeout",
                "role": "cascade",
                "first_seen": now - 20,
                "source": "log",
                "node": "node1",
                "gpu": None,
                "detail": "watchdog",
            },
        ],
        "evidence": [
            {
                "source": "log",
                "query_or_path": f"kernel/{node}.log",
                "line": 17,
                "time": now - 60,
                "node": node,
                "gpu": "3",
                "excerpt": "NVRM: Xid (PCI:0000:5D:00): 79, GPU has fallen off the bus.",
            },
            {
                "source": "prometheus",
                "query_or_path": f'DCGM_FI_DEV_XID_ERRORS{{hpc_job="{job}"}}',
                "line": None,
                "time": now - 55,
                "node": node,
                "gpu": "3",
                "excerpt": "79",
            },
        ],
        "confidence": 0.9,
        "confidence_basis": "initiating symptom, 2 sources",
        "connector_reports": [
            {"connector": "logs", "status": "ok", "reason": "", "latency_s": 0.01}
        ],
        "diagnosed_at": now,
        "onset": now - 60,
    }
    d.update(over)
    return d


def add_incident(app, job, node, fp, diag_over=None, plan=True) -> int:
    engine, settings = app.state.engine, app.state.settings
    res = incidents.ingest(engine, settings, [alert(job, node, fp=fp)], node_jobs=lambda n: [])
    iid = res.incident_ids[0]
    doc = diagnosis(iid, job, node, **(diag_over or {}))
    incidents.store_diagnosis(engine, iid, 1, doc)
    if plan:
        actions.on_diagnosis(engine, settings, incidents.incident(engine, iid), doc)
    return iid


def login(client, name="Alice Ops", token=TOKEN):
    client.get("/console/login")
    csrf = client.cookies.get(security.CSRF_COOKIE)
    return client.post(
        "/console/login",
        data={"csrf_token": csrf, "name": name, "token": token, "next": "/console/approvals"},
        headers=ORIGIN,
        follow_redirects=False,
    )


def test_reading_needs_credentials_unless_opened(env, tmp_path):
    client, app, _, _ = env
    r = client.get("/console/incidents", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/console/login?next=")
    assert (
        client.get(
            "/console/incidents", headers={"Authorization": "Bearer nope"}, follow_redirects=False
        ).status_code
        == 303
    )
    ok = client.get("/console/incidents", headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200 and "Incidents" in ok.text
    assert "default-src 'self'" in ok.headers["content-security-policy"]
    opened = dataclasses.replace(app.state.settings, extra={"GOODPUT_CONSOLE_OPEN_READ": "1"})
    app.state.settings = opened
    assert client.get("/console/incidents").status_code == 200


def test_login_sets_session_and_rejects_wrong_token_and_bad_csrf(env):
    client, *_ = env
    assert login(client, token="wrong").status_code == 401
    assert client.cookies.get(security.SESSION_COOKIE) is None
    client.get("/console/login")
    csrf = client.cookies.get(security.CSRF_COOKIE)
    bad = client.post(
        "/console/login", data={"csrf_token": "x" * 40, "name": "a", "token": TOKEN}, headers=ORIGIN
    )
    assert bad.status_code == 403
    cross = client.post(
        "/console/login",
        data={"csrf_token": csrf, "name": "a", "token": TOKEN},
        headers={"Origin": "http://evil.example"},
    )
    assert cross.status_code == 403
    r = login(client)
    assert r.status_code == 303 and r.headers["location"] == "/console/approvals"
    assert client.get("/console/incidents").status_code == 200
    session = security.read_session(
        client.app.state.settings, client.cookies.get(security.SESSION_COOKIE)
    )
    assert session is not None and session.name == "Alice Ops"
    assert security.read_session(client.app.state.settings, "e30.deadbeef") is None


def test_logging_out_ends_the_session_even_for_a_copy_of_its_cookie(env):
    """The cookie is signed and carries its expiry: deleting it in one browser is not enough."""
    client, app, _, _ = env
    login(client)
    copy = client.cookies.get(security.SESSION_COOKIE)
    bob = TestClient(app)
    login(bob, name="Bob Ops")  # a session of his own, which Alice's logout leaves alone
    csrf = "c" * 40

    def with_copy(method: str, url: str, **kw: Any) -> Any:
        cookie = f"{security.SESSION_COOKIE}={copy}; {security.CSRF_COOKIE}={csrf}"
        fresh = TestClient(app)  # another browser, holding a copy of Alice's cookie
        return fresh.request(method, url, headers={"Cookie": cookie, **ORIGIN}, **kw)

    assert with_copy("GET", "/console/incidents", follow_redirects=False).status_code == 200
    out = client.post(
        "/console/logout",
        data={"csrf_token": client.cookies.get(security.CSRF_COOKIE)},
        headers=ORIGIN,
        follow_redirects=False,
    )
    assert out.status_code == 303 and client.cookies.get(security.SESSION_COOKIE) is None
    r = with_copy("GET", "/console/incidents", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/console/login")
    form = {"csrf_token": csrf, "paused": "on", "reason": "copied cookie"}
    assert with_copy("POST", "/console/pause", data=form).status_code == 401
    assert not action_config.is_paused(app.state.engine)
    assert bob.get("/console/incidents", follow_redirects=False).status_code == 200


def test_approve_and_reject_through_the_console(env):
    client, app, st, submit = env
    submit("1001", node="node2")
    submit("2001", node="node3")
    a = add_incident(app, "1001", "node2", "fp1")
    b = add_incident(app, "2001", "node3", "fp2")
    assert login(client).status_code == 303
    page = client.get("/console/approvals")
    assert page.status_code == 200
    assert "inc-1001" not in page.text and f"inc-{a}" in page.text and f"inc-{b}" in page.text
    csrf = client.cookies.get(security.CSRF_COOKIE)
    # CSRF: no token, wrong origin -> refused, nothing changes
    assert (
        client.post(
            f"/console/actions/inc-{a}/approve", data={"reason": "x"}, headers=ORIGIN
        ).status_code
        == 403
    )
    assert (
        client.post(
            f"/console/actions/inc-{a}/approve",
            data={"csrf_token": csrf},
            headers={"Origin": "http://evil.example"},
        ).status_code
        == 403
    )
    assert outbox.get_action(app.state.engine, f"inc-{a}")["state"] == "pending_approval"
    # a rejection needs a reason
    assert (
        client.post(
            f"/console/actions/inc-{b}/reject", data={"csrf_token": csrf}, headers=ORIGIN
        ).status_code
        == 400
    )
    r = client.post(
        f"/console/actions/inc-{a}/approve",
        data={"csrf_token": csrf, "reason": "XID 79 is fatal"},
        headers=ORIGIN,
        follow_redirects=False,
    )
    assert r.status_code == 303, r.text
    r = client.post(
        f"/console/actions/inc-{b}/reject",
        data={"csrf_token": csrf, "reason": "node3 is under repair"},
        headers=ORIGIN,
        follow_redirects=False,
    )
    assert r.status_code == 303
    assert outbox.get_action(app.state.engine, f"inc-{a}")["state"] == "executed"
    assert outbox.get_action(app.state.engine, f"inc-{b}")["state"] == "rejected"
    assert st["nodes"]["node2"]["reason"].startswith("goodput:")
    assert st["jobs"]["1001"]["excluded"] == ["node2"]
    assert st["nodes"]["node3"]["reason"] == "" and st["jobs"]["2001"]["restarts"] == 0
    # deciding twice is refused with a message, not a 500
    again = client.post(
        f"/console/actions/inc-{a}/reject",
        data={"csrf_token": csrf, "reason": "late"},
        headers=ORIGIN,
    )
    assert again.status_code == 409 and "not pending" in again.text
    events, _ = audit.query(app.state.engine, limit=1000)
    approved = [e for e in events if e["type"] == "approved"]
    assert approved[0]["actor"] == "Alice Ops (console)"
    assert approved[0]["payload"]["comment"] == "XID 79 is fatal"
    au = client.get("/console/audit?type=rejected")
    assert "node3 is under repair" in au.text and "chain verifies" in au.text
    detail = client.get(f"/console/incidents/{a}")
    assert "executed" in detail.text and "Decided by Alice Ops (console)" in detail.text


def test_mutations_need_credentials(env):
    client, app, _, submit = env
    submit("1001", node="node2")
    a = add_incident(app, "1001", "node2", "fp1")
    client.get("/console/login")
    csrf = client.cookies.get(security.CSRF_COOKIE)
    r = client.post(f"/console/actions/inc-{a}/approve", data={"csrf_token": csrf}, headers=ORIGIN)
    assert r.status_code == 401
    assert (
        client.post(
            "/console/pause",
            data={"csrf_token": csrf, "paused": "on", "reason": "x"},
            headers=ORIGIN,
        ).status_code
        == 401
    )
    assert outbox.get_action(app.state.engine, f"inc-{a}")["state"] == "pending_approval"


def test_pause_switch_from_the_policy_page(env):
    client, app, _, _ = env
    login(client)
    csrf = client.cookies.get(security.CSRF_COOKIE)
    r = client.post(
        "/console/pause",
        data={"csrf_token": csrf, "paused": "on", "reason": "maintenance"},
        headers=ORIGIN,
        follow_redirects=False,
    )
    assert r.status_code == 303 and action_config.is_paused(app.state.engine)
    page = client.get("/console/policy")
    assert page.status_code == 200 and "pause switch is ON" in page.text
    assert "Drains in the last hour" in page.text


def test_incident_detail_explains_and_links_to_prometheus(env):
    client, app, _, submit = env
    app.state.settings = dataclasses.replace(
        app.state.settings, prometheus_url="http://prom.example:9090"
    )
    submit("1001", node="node2")
    series = [
        {"node": "node2", "points": [[1000 + i, 90 if i < 5 else 0] for i in range(10)]},
        {"node": "node1", "points": [[1000 + i, 91] for i in range(10)]},
    ]
    iid = add_incident(
        app, "1001", "node2", "fp1", {"plot": {"title": "GPU util", "unit": "%", "series": series}}
    )
    page = client.get(f"/console/incidents/{iid}", headers={"Authorization": f"Bearer {TOKEN}"})
    assert page.status_code == 200
    text = page.text
    assert "A GPU failed in hardware" in text and "90%" in text and "node2" in text
    assert "kernel/node2.log:17" in text
    assert (
        "http://prom.example:9090/graph?g0.expr=DCGM_FI_DEV_XID_ERRORS%7Bhpc_job%3D%221001" in text
    )
    assert text.count('class="culprit"') >= 1 and '<svg class="plot"' in text
    assert "drain_and_requeue" in text and "approve or reject" in text
    assert "initiating" in text and "cascade" in text
    assert "Next for a person:</strong> Open a repair (RMA) for the GPU named below" in text
    unknown = add_incident(app, "1002", "node3", "fp2", {"outcome": "unknown"})
    page = client.get(f"/console/incidents/{unknown}", headers={"Authorization": f"Bearer {TOKEN}"})
    assert "scontrol update nodename=node3 state=drain" in page.text  # its node and job filled
    assert "scontrol requeue 1002" in page.text


def test_every_outcome_says_what_a_person_does_next() -> None:
    """On call, an incident held for a person said "a person should look" and no more."""
    from catalogue import outcomes
    from recovery.console.templating import words

    said = words()["outcomes"]
    for outcome in [*outcomes(), "healthy"]:
        assert {"headline", "meaning", "next"} <= set(said[outcome]), outcome


HOSTILE = '<script>alert("x")</script>'


def test_odd_data_never_breaks_a_page(env):
    client, app, _, submit = env
    engine = app.state.engine
    long_name = "n" * 64
    submit("3001", node="node1")
    weird = {
        "job_name": HOSTILE + "ü" * 5000,
        "root_cause": HOSTILE + " 🔥" * 3000,
        "affected_nodes": [long_name, "ノード"],
        "affected_gpus": ["not-a-mapping"],
        "symptoms": [{"id": HOSTILE, "role": "weird", "first_seen": "yesterday", "source": "log"}],
        "evidence": [],
        "confidence": "very",
        "connector_reports": [{"connector": "logs", "status": "error", "reason": HOSTILE}],
        "plot": {"series": [{"node": HOSTILE, "points": [[1, "nan"], ["x", 2], [2, 3]]}]},
    }
    a = add_incident(app, "3001", long_name, "fp-odd", weird, plan=False)
    b = add_incident(
        app,
        "3002",
        "node4",
        "fp-empty",
        {"evidence": [], "symptoms": [], "affected_nodes": []},
        plan=False,
    )
    # a diagnosis body that is not even JSON
    from recovery.store import diagnoses

    with engine.begin() as conn:
        conn.execute(
            diagnoses.insert().values(
                incident_id=b, created_at=time.time(), outcome="unknown", body="{not json"
            )
        )
    # hundreds of incidents
    docs = [alert(str(5000 + i), f"node{i % 4 + 1}", fp=f"bulk{i}") for i in range(300)]
    incidents.ingest(engine, app.state.settings, docs, node_jobs=lambda n: [])
    audit.record(engine, "notified", {"text": HOSTILE * 50}, actor=HOSTILE, job_id="3001")
    h = {"Authorization": f"Bearer {TOKEN}"}
    pages = [
        "/console/incidents",
        "/console/incidents?page=7",
        "/console/incidents?page=999999",
        f"/console/incidents?node={long_name}",
        "/console/incidents?node=bad;node",
        "/console/incidents?job=../../etc",
        "/console/incidents?outcome=zzz&state=x",
        "/console/incidents?fragment=rows",
        f"/console/incidents/{a}",
        f"/console/incidents/{b}",
        "/console/incidents/99999999",
        "/console/incidents/abc",
        "/console/approvals",
        "/console/audit",
        "/console/audit?job=x%3By&type=zzz&cursor=abc",
        "/console/policy",
    ]
    for p in pages:
        r = client.get(p, headers=h)
        assert r.status_code in (200, 404), (p, r.status_code, r.text[:300])
        assert HOSTILE not in r.text, p
    nul = client.get("/console/incidents?outcome=%00&state=x", headers=h)
    assert nul.status_code == 400  # no store keeps a NUL: refused at the edge (recovery.edge)
    listing = client.get("/console/incidents", headers=h).text
    assert "page 1 of 7" in listing and listing.count('<tr class="state-') == 50
    by_node = client.get("/console/incidents?node=node3", headers=h).text
    assert "/console/incidents/" in by_node
    assert "Filter ignored" in client.get("/console/incidents?node=bad;node", headers=h).text
    assert "&lt;script&gt;" in client.get(f"/console/incidents/{a}", headers=h).text
    assert client.get("/console/incidents/99999999", headers=h).status_code == 404


def test_list_filters_and_open_first(env):
    client, app, _, submit = env
    engine, settings = app.state.engine, app.state.settings
    submit("1001", node="node2")
    a = add_incident(app, "1001", "node2", "fp1")
    b = add_incident(
        app, "1002", "node3", "fp2", {"outcome": "workload_oom", "affected_nodes": []}, plan=False
    )
    resolved = dict(
        alert("1002", "node3", fp="fp2"), status="resolved", endsAt="2025-01-01T00:09:00Z"
    )
    incidents.ingest(engine, settings, [resolved], node_jobs=lambda n: [])
    h = {"Authorization": f"Bearer {TOKEN}"}
    rows = client.get("/console/incidents", headers=h).text
    ids = [int(x) for x in re.findall(r'href="/console/incidents/(\d+)"', rows)]
    assert ids == [a, b]  # open first
    only = client.get("/console/incidents?outcome=workload_oom", headers=h).text
    assert re.findall(r'href="/console/incidents/(\d+)"', only) == [str(b)]
    assert re.findall(
        r'href="/console/incidents/(\d+)"',
        client.get("/console/incidents?state=open&node=node2", headers=h).text,
    ) == [str(a)]
    assert re.findall(
        r'href="/console/incidents/(\d+)"',
        client.get("/console/incidents?job=1002", headers=h).text,
    ) == [str(b)]


def test_svg_plot_escapes_and_handles_flat_series():
    p = {
        "title": HOSTILE,
        "series": [{"label": HOSTILE, "culprit": True, "points": [(0.0, 1.0), (10.0, 1.0)]}],
    }
    out = str(plot.svg(p, onset=5.0))
    assert out.startswith("<svg") and HOSTILE not in out and "onset" in out
    assert plot.svg({"series": []}) == ""
    assert plot.series_from_diagnosis({"plot": {"series": "nope"}}) is None


def test_a_node_goodput_drained_returns_to_service_from_the_policy_page(env):
    """The console had no way back for a drained node (the API and the CLI only): the policy
    page lists the nodes Goodput drained, and a logged-in person returns one, audited."""
    client, app, st, _ = env
    st["nodes"]["node2"].update(state="DRAINED", reason="goodput: failed quick 3 times: RMA")
    st["nodes"]["node3"].update(state="DRAINED", reason="maintenance by Bob")  # a person's
    page = client.get("/console/policy", headers={"Authorization": f"Bearer {TOKEN}"}).text
    drained = page.split('id="drained"')[1].split("</section>")[0]
    assert "node2" in drained and "node3" not in drained
    assert 'action="/console/nodes/node2/resume"' in drained
    login(client)
    csrf = client.cookies.get(security.CSRF_COOKIE)
    r = client.post("/console/nodes/node2/resume", data={"csrf_token": csrf, "reason": ""},
                    headers=ORIGIN, follow_redirects=False)  # fmt: skip
    assert r.status_code == 400 and st["nodes"]["node2"]["state"] == "DRAINED"
    r = client.post("/console/nodes/node2/resume",
                    data={"csrf_token": csrf, "reason": "GPU 3 replaced"},
                    headers=ORIGIN, follow_redirects=False)  # fmt: skip
    assert r.status_code == 303 and r.headers["location"].startswith("/console/policy?done=")
    assert st["nodes"]["node2"]["state"] == "IDLE"
    events = audit.query(app.state.engine, type_="executed")[0]
    assert any(e["actor"] == "Alice Ops (console)" for e in audit.query(app.state.engine)[0])
    assert events and "node2" in json.dumps(events[-1]["payload"])
    r = client.post("/console/nodes/node9/resume", data={"csrf_token": csrf, "reason": "x"},
                    headers=ORIGIN, follow_redirects=False)  # fmt: skip
    assert r.status_code == 404  # unknown to the scheduler
    r = client.post("/console/nodes/node2/resume", data={"reason": "x"}, headers=ORIGIN,
                    follow_redirects=False)  # fmt: skip
    assert r.status_code == 403  # no CSRF token

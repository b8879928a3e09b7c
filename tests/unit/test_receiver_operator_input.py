"""What an operator's tool or a stray client can send the receiver beyond the webhook, refused
at the edge with a 4xx and nothing changed (found fuzzing a live receiver: a `%00` in a filter
answered 500 on PostgreSQL; `who` took blanks, newlines and direction overrides into the audit
trail; unknown filter values answered an empty 200; a 60 MB decision body was parsed whole;
`paused=on&paused=off` resumed; `/console/../api/...` passed as a console redirect)."""

from __future__ import annotations

import pytest

from recovery import action_config, audit
from recovery.console import security
from tests.unit.test_console_pages import ORIGIN, TOKEN, add_incident, env, login  # noqa: F401

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/actions?state=a%00b",
        "/api/v1/audit?type=a%00b",
        "/api/v1/actions/a%00b",
        "/api/v1/incidents?job_id=%00",
        "/console/incidents?job=%00",
    ],  # fmt: skip
)
def test_a_nul_in_the_url_is_a_400(env, url) -> None:  # noqa: F811
    client, *_ = env
    r = client.get(url, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"] == "a NUL byte in the URL"


@pytest.mark.parametrize(
    "who",
    ["   ", "fuzz\nINJECTED line", "\u202eevil", "<script>alert(1)</script>", "a\x00b", 7, "",
     "x" * 65, "a\u2028b"],
)  # fmt: skip
def test_a_decision_needs_a_plain_name(env, who) -> None:  # noqa: F811
    client, app, *_ = env
    before = audit.verify(app.state.engine).rows
    r = client.post("/api/v1/actions/pause", json={"who": who}, headers=AUTH)
    assert r.status_code == 422, r.text
    assert not action_config.is_paused(app.state.engine)
    assert audit.verify(app.state.engine).rows == before  # nothing written
    r = client.post("/api/v1/actions/pause", json={"who": "Alice", "comment": "a\x00b"},
                    headers=AUTH)  # fmt: skip
    assert r.status_code == 422
    for bad in ("a\u202eb", "a\x85b"):  # a direction override, a C1 control
        r = client.post("/api/v1/actions/pause", json={"who": "Alice", "comment": bad},
                        headers=AUTH)  # fmt: skip
        assert r.status_code == 422
    ok = client.post("/api/v1/actions/pause", json={"who": " Alice Ops ", "comment": "a\r\nb"},
                     headers=AUTH)  # fmt: skip
    assert ok.status_code == 200
    (event,) = audit.query(app.state.engine, type_="paused")[0]
    assert event["actor"] == "Alice Ops"


@pytest.mark.parametrize("who", ["José", "O'Brien", "jdoe+oncall", "ci-bot (pipeline 42)"])
def test_real_names_and_bots_may_decide(env, who) -> None:  # noqa: F811
    client, *_ = env
    r = client.post("/api/v1/actions/pause", json={"who": who}, headers=AUTH)
    assert r.status_code == 200, r.text


def test_unknown_filter_values_are_422_not_an_empty_answer(env) -> None:  # noqa: F811
    client, *_ = env
    r = client.get("/api/v1/actions?state=pending", headers=AUTH)
    assert r.status_code == 422 and "pending_approval" in r.json()["error"]
    assert client.get("/api/v1/actions?state=pending_approval", headers=AUTH).status_code == 200
    assert client.get("/api/v1/audit?type=bogus", headers=AUTH).status_code == 422
    assert client.get("/api/v1/audit?incident_id=abc", headers=AUTH).status_code == 422
    assert client.get("/api/v1/audit?type=paused&incident_id=3", headers=AUTH).status_code == 200


def test_a_body_past_64_kib_is_refused_before_it_is_parsed(env) -> None:  # noqa: F811
    client, app, *_ = env
    big = b'{"who": "Alice", "comment": "' + b"x" * 70_000 + b'"}'
    r = client.post("/api/v1/actions/pause", content=big,
                    headers={**AUTH, "Content-Type": "application/json"})  # fmt: skip
    assert r.status_code == 413

    def chunks():  # no Content-Length: the stream is counted
        for _ in range(70):
            yield b" " * 1024

    r = client.post("/api/v1/actions/pause", content=chunks(),
                    headers={**AUTH, "Content-Type": "application/json"})  # fmt: skip
    assert r.status_code == 413 and not action_config.is_paused(app.state.engine)
    # the webhook keeps its own, larger limit: a valid 100 KB batch is stored
    alerts = [{"status": "firing", "labels": {"alertname": "GoodputJobHung", "job_id": str(i)},
               "annotations": {"description": "d" * 5000}, "startsAt": "2026-01-01T00:00:00Z",
               "fingerprint": f"{i:04x}"} for i in range(20)]  # fmt: skip
    body = {"version": "4", "status": "firing", "alerts": alerts}
    r = client.post("/api/v1/alerts", json=body, headers=AUTH)
    assert r.status_code == 200 and r.json()["alerts"] == 20


def test_a_console_field_given_twice_changes_nothing(env) -> None:  # noqa: F811
    client, app, *_ = env
    login(client)
    csrf = client.cookies.get(security.CSRF_COOKIE)
    action_config.set_paused(app.state.engine, True, "Alice", "maintenance")
    r = client.post(
        "/console/pause",
        content=f"csrf_token={csrf}&paused=on&paused=off&reason=x",
        headers={**ORIGIN, "Content-Type": "application/x-www-form-urlencoded"},
        follow_redirects=False,
    )
    assert r.status_code == 400 and action_config.is_paused(app.state.engine)
    r = client.post(
        "/console/pause",
        data={"csrf_token": csrf, "paused": "off", "reason": "done\x00"},
        headers=ORIGIN,
        follow_redirects=False,
    )
    assert r.status_code == 400 and action_config.is_paused(app.state.engine)


@pytest.mark.parametrize(
    ("target", "kept"),
    [("/console", True), ("/console/incidents/5?x=1", True), ("/consoleevil", False),
     ("/console/../api/v1/policy", False), ("/console//evil.example", False),
     ("/console/%2e%2e/api/v1/policy", False), ("/console/%2F%2Fevil", False),
     ("/console/a\\b", False), ("/console/x\r\nSet-Cookie: a=b", False), (None, False)],
)  # fmt: skip
def test_a_login_returns_inside_the_console_only(target, kept) -> None:
    assert security.safe_next(target) == (target if kept else "/console/incidents")


def test_no_swagger_page(env) -> None:  # noqa: F811
    client, *_ = env
    assert client.get("/docs").status_code == 404
    assert client.get("/openapi.json").status_code == 200


def test_the_edge_passes_what_it_does_not_refuse(env) -> None:  # noqa: F811
    """A form login (its body replayed to the route after counting) still logs in."""
    client, *_ = env
    r = login(client)
    assert r.status_code == 303 and r.headers["location"] == "/console/approvals"
    assert client.get("/console/approvals", follow_redirects=False).status_code == 200


def test_an_unknown_console_page_is_the_consoles_404_page(env) -> None:  # noqa: F811
    client, *_ = env
    r = client.get("/console/no-such-page", headers=AUTH)
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
    assert "no such page" in r.text
    assert client.get("/api/v1/no-such-route", headers=AUTH).json()["error"] == "Not Found"


def test_a_method_a_console_page_does_not_take_is_the_consoles_405_page(env) -> None:  # noqa: F811
    client, *_ = env
    r = client.put("/console/incidents", headers=AUTH)
    assert r.status_code == 405 and r.headers["content-type"].startswith("text/html")
    assert r.headers["allow"] == "GET" and "Method Not Allowed" in r.text
    api = client.put("/api/v1/incidents", headers=AUTH)
    assert api.status_code == 405 and api.json()["error"] == "Method Not Allowed"

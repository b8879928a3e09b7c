"""Input at the receiver's edge (issue 19, items 5 and 8): lone surrogates, big integers,
content types, bounded counts, sizes and timestamps: a clear 4xx, never a 5xx, nothing stored.
And a bad row stored before these checks never breaks the API or the console."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, insert, select

from recovery import incidents, ingest_rows
from recovery.app import create_app
from recovery.settings import Settings
from recovery.store import alerts, payloads
from tests.unit.test_receiver_webhook import alert, payload

JSON = {"Content-Type": "application/json"}


@pytest.fixture
def app(tmp_path):
    s = Settings(
        db_url=f"sqlite:///{tmp_path}/edge.db",
        require_auth=False,
        slurm_enabled=False,
        settle_s=3600,
        extra={"GOODPUT_CONSOLE_OPEN_READ": "1"},
    )
    return create_app(s, start_worker=False)


@pytest.fixture
def client(app):
    return TestClient(app, raise_server_exceptions=False)


def _post(client, doc, headers=JSON):
    # json.dumps writes a lone surrogate as the escape "\ud800": valid JSON, invalid Unicode
    return client.post("/api/v1/alerts", content=json.dumps(doc), headers=headers)


def _stored(app) -> int:
    with app.state.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(payloads)).scalar_one()


@pytest.mark.parametrize(
    "where", ["alertname", "severity", "node_label", "annotation", "label_key", "common"]
)
def test_lone_surrogate_anywhere_is_a_400_and_nothing_is_stored(app, client, where):
    a = alert()
    if where in ("alertname", "severity"):
        a["labels"][where] = "bad\ud800"
    elif where == "node_label":
        a["labels"]["rack"] = "\udfff"
    elif where == "annotation":
        a["annotations"]["description"] = "x\ud83d"
    elif where == "label_key":
        a["labels"]["\ud800"] = "x"
    doc = payload(a)
    if where == "common":
        doc["commonAnnotations"] = {"summary": "\ud800"}
    r = _post(client, doc)
    assert r.status_code == 400, r.text
    assert "lone surrogate" in r.json()["error"]
    assert _stored(app) == 0


@pytest.mark.parametrize("where", ["alertname", "severity", "groupKey"])
def test_a_nul_character_reaches_no_text_column(app, client, where):
    """PostgreSQL's text holds no NUL: an alertname, severity or groupKey with one failed the
    insert with a 500, retried by Alertmanager for ever, failing the group commit's whole batch
    each time (test_receiver_postgres runs it on PostgreSQL). The alert is kept; the columns
    read U+FFFD, the JSON labels the value as sent."""
    a = alert()
    if where in ("alertname", "severity"):
        a["labels"][where] = "Gpu\x00X"
    doc = payload(a)
    if where == "groupKey":
        doc["groupKey"] = '{}:{alertname="x\x00"}'
    assert _post(client, doc).status_code == 200
    with app.state.engine.connect() as conn:
        row = conn.execute(select(alerts.c.alertname, alerts.c.severity, alerts.c.labels)).one()
        keys = conn.execute(select(payloads.c.group_key)).scalars().all()
    assert "\x00" not in row.alertname + row.severity + "".join(keys)
    if where != "groupKey":
        assert json.loads(row.labels)[where] == "Gpu\x00X"


def test_valid_astral_characters_are_fine(client):
    a = alert()
    a["annotations"]["summary"] = "GPU on fire \U0001f525"  # a surrogate *pair* in JSON
    assert _post(client, payload(a)).status_code == 200


def test_a_bad_row_stored_earlier_does_not_break_reads(app, client):
    res = incidents.ingest(
        app.state.engine, app.state.settings, [alert(job_id="7", node="node1")], raw="{}"
    )
    (inc,) = res.incident_ids
    with app.state.engine.begin() as conn:  # what the old receiver stored for a bad label
        conn.execute(
            insert(alerts).values(
                fingerprint="bad",
                starts_at="2026-01-01T00:00:00Z",
                starts_ts=1.0,
                status="firing",
                alertname="X",
                labels='{"alertname":"X","rack":"\\ud800"}',
                annotations='{"d":"\\udc00"}',
                received_at=1.0,
                updated_at=1.0,
            )
        )
        bad = conn.execute(select(alerts.c.id).where(alerts.c.fingerprint == "bad")).scalar_one()
        links = ingest_rows.Links()
        links.add(inc, bad, 1.0, 3600, 1.0)
        links.flush(conn)
    r = client.get(f"/api/v1/incidents/{inc}")
    assert r.status_code == 200, r.text
    assert {"alertname": "X", "rack": "\ufffd"} in [x["labels"] for x in r.json()["alerts"]]
    assert client.get(f"/console/incidents/{inc}").status_code == 200
    assert client.get("/console/incidents").status_code == 200
    assert client.get("/api/v1/incidents").status_code == 200


@pytest.mark.parametrize(
    "path,status",
    [
        ("/api/v1/incidents/99999999999999999999999", 422),
        ("/api/v1/incidents/2147483648", 422),
        ("/api/v1/incidents/2147483647", 404),
        ("/api/v1/audit?cursor=99999999999999999999999", 422),
        ("/api/v1/audit?since=1e400", 422),
        ("/api/v1/audit?until=nan", 422),
        ("/console/incidents/99999999999999999999999", 404),
        ("/console/incidents/%C2%B2", 404),  # '²'.isdigit() is True, int('²') raises
        ("/console/incidents?page=%C2%B2", 200),
        ("/console/audit?cursor=%C2%B2&incident=%C2%B2", 200),
    ],
)
def test_integers_out_of_range_are_4xx(client, path, status):
    r = client.get(path)
    assert r.status_code == status, r.text


def test_verdict_with_a_lone_surrogate_is_422(client):
    body = '{"who": "\\ud800", "comment": ""}'
    for path in ("/api/v1/actions/pause", "/api/v1/actions/inc-1/approve"):
        r = client.post(path, content=body, headers=JSON)
        assert r.status_code == 422, r.text


@pytest.mark.parametrize(
    "ctype,ok",
    [
        ("application/json", True),
        ("application/json; charset=utf-8", True),
        ('Application/JSON;charset="UTF-8"', True),
        ("application/json; charset=latin-1", False),
        ("text/json", False),
        ("application/jsonx", False),
        ("application/problem+json", False),
        ("text/plain; note=json", False),
        (None, False),
    ],
)
def test_only_application_json_is_accepted(client, ctype, ok):
    headers = {"Content-Type": ctype} if ctype else {}
    r = client.post("/api/v1/alerts", content=json.dumps(payload(alert())), headers=headers)
    assert (r.status_code == 200) if ok else (r.status_code == 415), r.text


def _with(**changes):
    a = alert()
    doc = payload(a)
    for key, value in changes.items():
        if key in a:
            a[key] = value
        else:
            doc[key] = value
    return doc


@pytest.mark.parametrize(
    "doc",
    [
        _with(truncatedAlerts=10**7),
        _with(truncatedAlerts=10**30),
        _with(startsAt="0001-01-01T00:00:00Z"),  # Go's zero time is "unset": not for startsAt
        _with(startsAt="0001-02-03T00:00:00Z"),
        _with(startsAt="1969-12-31T23:59:59Z"),
        _with(startsAt="9999-12-31T23:59:59Z"),
        _with(startsAt="2026-02-30T00:00:00Z"),
        _with(startsAt="2026-01-01T00:00:00+99:00"),
        _with(endsAt="0001-01-01T00:00:01Z"),
        _with(commonLabels={"x": "v" * 1025}),
        _with(groupLabels={"bad key": "v"}),
        _with(annotations={"d": "v" * 8193}),
        _with(labels={"alertname": "X", **{f"l{i}": "v" for i in range(64)}}),
        {**payload(alert()), "alerts": [alert(fp=f"{i:x}") for i in range(1001)]},
    ],
)
def test_bounds_are_422(app, client, doc):
    r = _post(client, doc)
    assert r.status_code == 422, r.text
    assert _stored(app) == 0


def test_zero_ends_at_while_firing_and_bounded_truncation_are_accepted(client):
    doc = _with(endsAt="0001-01-01T00:00:00Z", truncatedAlerts=5000)
    assert _post(client, doc).status_code == 200
    doc = _with(endsAt="2026-01-01T00:10:00.5Z", status="resolved")
    assert _post(client, doc).status_code == 200


def _rule_links():
    """Prometheus' generatorURL for each of Goodput's own alert rules: the external URL,
    `/graph?g0.expr=`, the URL-escaped expression (util/strutil.TableLinkForExpression)."""
    from pathlib import Path
    from urllib.parse import quote_plus

    import yaml

    rules = Path(__file__).resolve().parents[2] / "alertmanager" / "rules" / "goodput.yml"
    for group in yaml.safe_load(rules.read_text())["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                expr = " ".join(rule["expr"].split())
                yield (
                    "http://prometheus.example:9090/graph?g0.expr=" + quote_plus(expr) + "&g0.tab=1"
                )


def test_the_links_prometheus_sends_for_goodputs_own_rules_are_accepted(app, client):
    """generatorURL was capped at 2,048 characters; the fatal-XID rule's link is over 5,000,
    so Alertmanager's notification got a 422, which it does not retry: the XID was lost."""
    links = list(_rule_links())
    assert max(map(len, links)) > 5000  # the guard's premise: the XID rule's link is long
    for i, link in enumerate(links):
        r = _post(client, payload(alert(fp=f"{i:x}") | {"generatorURL": link}))
        assert r.status_code == 200, r.text


def _rejected(client) -> float:
    text = client.get("/metrics").text
    line = next((x for x in text.splitlines() if 'status="rejected"' in x and "_total" in x), "")
    return float(line.split()[-1]) if line else 0.0


def test_every_refused_notification_is_counted(app, client):
    """Alertmanager does not retry a 4xx: a 413 or a 415 lost the alerts without a trace in
    goodput_receiver_alerts_received_total{status="rejected"}."""
    big = payload(*(alert(fp=f"{i:x}") | {"annotations": {"d": "v" * 8000}} for i in range(200)))
    assert _post(client, big).status_code == 413
    assert client.post("/api/v1/alerts", content=b"{}", headers={}).status_code == 415
    assert _rejected(client) == 2


def test_an_alert_firing_again_after_it_was_resolved_has_an_open_incident(app, client):
    """Prometheus' resends did not reach Alertmanager for a few minutes, so Alertmanager
    resolved the alert; Prometheus resent it with the same startsAt. The stored alert went back
    to firing on its resolved incident: nothing open, nothing diagnosed."""
    labels = {"node": "node1", "gpu": "3", "job_id": "42", "scope": "gpu"}
    first = _post(client, payload(alert(fp="aa11", **labels))).json()
    gone = alert(fp="aa11", status="resolved", **labels) | {"endsAt": "2026-01-01T00:06:00Z"}
    _post(client, payload(gone, status="resolved"))
    assert incidents.get_incident(app.state.engine, first["incidents"][0])["state"] == "resolved"
    again = _post(client, payload(alert(fp="aa11", **labels))).json()
    (inc,) = again["incidents"]
    got = incidents.get_incident(app.state.engine, inc)
    assert got["state"] == "open" and got["diagnosis_state"] == "pending"
    assert [a["status"] for a in got["alerts"]] == ["firing"]
    # its redelivery changes nothing; one firing alert on an open incident is not linked twice
    assert _post(client, payload(alert(fp="aa11", **labels))).json()["incidents"] == []

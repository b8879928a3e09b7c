"""Receiver webhook: auth, validation, durability, redelivery, incidents API, /metrics."""

from __future__ import annotations

import base64
import json

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from recovery import incidents
from recovery.app import Accepted, create_app
from recovery.settings import Settings
from recovery.store import alerts, payloads

TOKEN = "s3cret-token"


def alert(fp="a1b2c3", status="firing", starts="2026-01-01T00:00:00.123456789Z", **labels):
    base = {"alertname": "GoodputGPUFatalXid", "severity": "critical"}
    base.update(labels)
    return {
        "status": status,
        "labels": base,
        "annotations": {"summary": "x"},
        "startsAt": starts,
        "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": fp,
    }


def payload(*alerts_, status="firing"):
    return {
        "version": "4",
        "groupKey": "{}:{}",
        "status": status,
        "receiver": "goodput",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://am",
        "alerts": list(alerts_),
    }


@pytest.fixture
def settings(tmp_path):
    tok = tmp_path / "token"
    tok.write_text(TOKEN + "\n")
    pw = tmp_path / "pw"
    pw.write_text("hunter2")
    return Settings(
        db_url=f"sqlite:///{tmp_path}/r.db",
        token_file=str(tok),
        basic_user="am",
        basic_password_file=str(pw),
        slurm_enabled=False,
        settle_s=60,
        prometheus_url=None,
        log_dir=str(tmp_path / "logs"),
    )


@pytest.fixture
def client(settings):
    app = create_app(settings, start_worker=False)
    with TestClient(app, raise_server_exceptions=False) as c:
        c.headers["Authorization"] = f"Bearer {TOKEN}"
        yield c


def test_no_credentials_is_401(settings):
    app = create_app(settings, start_worker=False)
    with TestClient(app) as c:
        assert c.post("/api/v1/alerts", json=payload(alert(job_id="1"))).status_code == 401
        bad = c.post(
            "/api/v1/alerts",
            json=payload(alert(job_id="1")),
            headers={"Authorization": "Bearer wrong"},
        )
        assert bad.status_code == 401 and "credentials" in bad.json()["error"]
        assert c.get("/api/v1/incidents").status_code == 401


def test_basic_auth_accepted(settings):
    app = create_app(settings, start_worker=False)
    cred = base64.b64encode(b"am:hunter2").decode()
    with TestClient(app) as c:
        r = c.post(
            "/api/v1/alerts",
            json=payload(alert(job_id="1")),
            headers={"Authorization": f"Basic {cred}"},
        )
        assert r.status_code == 200, r.text
        wrong = base64.b64encode(b"am:nope").decode()
        r = c.post(
            "/api/v1/alerts",
            json=payload(alert(job_id="1")),
            headers={"Authorization": f"Basic {wrong}"},
        )
        assert r.status_code == 401


def test_payload_is_durable_and_opens_incident(client):
    r = client.post("/api/v1/alerts", json=payload(alert(job_id="42", node="node2", gpu="3")))
    assert r.status_code == 200 and r.json()["new"] == 1
    assert Accepted.model_validate(r.json()) == Accepted(alerts=1, new=1, incidents=[1])
    engine = client.app.state.engine
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(payloads)).scalar() == 1
        row = conn.execute(select(alerts)).one()
    assert (row.job_id, row.node, row.gpu) == ("42", "node2", "3")
    page = client.get("/api/v1/incidents").json()
    assert page["total"] == 1 and page["items"][0]["job_id"] == "42"
    detail = client.get(f"/api/v1/incidents/{page['items'][0]['id']}").json()
    assert detail["state"] == "open" and detail["alerts"][0]["gpu"] == "3"
    assert detail["diagnosis"] is None and detail["diagnosis_state"] == "pending"


def test_redelivery_100_times_changes_nothing(client):
    body = payload(alert(job_id="7", node="node1"), alert(fp="ffee", job_id="7", node="node1"))
    first = client.post("/api/v1/alerts", json=body)
    assert first.json()["new"] == 2
    engine = client.app.state.engine
    before = incidents.get_incident(engine, first.json()["incidents"][0])
    for _ in range(100):
        r = client.post("/api/v1/alerts", json=body)
        assert r.status_code == 200 and r.json()["new"] == 0
    after = incidents.get_incident(engine, first.json()["incidents"][0])
    assert after == before
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(alerts)).scalar() == 2
    assert client.get("/api/v1/incidents").json()["total"] == 1


def test_resolved_alerts_resolve_the_incident(client):
    a, b = alert(fp="01", job_id="9"), alert(fp="02", job_id="9", node="node3")
    inc = client.post("/api/v1/alerts", json=payload(a, b)).json()["incidents"][0]
    client.post("/api/v1/alerts", json=payload({**a, "status": "resolved"}, status="resolved"))
    assert client.get(f"/api/v1/incidents/{inc}").json()["state"] == "open"
    client.post("/api/v1/alerts", json=payload({**b, "status": "resolved"}, status="resolved"))
    got = client.get(f"/api/v1/incidents/{inc}").json()
    assert got["state"] == "resolved" and got["resolved_at"] is not None
    # a new firing alert for the job opens a new incident
    new = client.post("/api/v1/alerts", json=payload(alert(fp="03", job_id="9"))).json()
    assert new["incidents"][0] != inc


def test_node_alert_joins_incidents_of_jobs_on_that_node(settings):
    from recovery.store import make_engine

    engine = make_engine(settings.db_url)
    r1 = incidents.ingest(engine, settings, [alert(fp="10", job_id="100", node="node4")])
    r2 = incidents.ingest(engine, settings, [alert(fp="11", job_id="200", node="node1")])
    node_alert = alert(fp="12", node="node4", alertname="GoodputNodeLost")
    r3 = incidents.ingest(engine, settings, [node_alert], node_jobs=lambda n: ["100", "300"])
    assert r1.incident_ids[0] in r3.incident_ids and r2.incident_ids[0] not in r3.incident_ids
    jobs = {incidents.incident(engine, i)["job_id"] for i in r3.incident_ids}
    assert jobs == {"100", "300"}
    # no job on the node: a node incident
    r4 = incidents.ingest(engine, settings, [alert(fp="13", node="node3")], node_jobs=lambda n: [])
    inc = incidents.incident(engine, r4.incident_ids[0])
    assert inc["job_id"] is None and inc["node"] == "node3"


def test_node_alert_skips_a_job_that_left_the_node_long_ago(settings):
    """Job 100's incident named node4, then the job ended; a day later Slurm runs job 300
    there. Failed before: the node alert joined job 100's stale incident too. Minutes after
    the job's own alert it joins, though Slurm no longer lists the job: the fault (a node lost)
    ended it."""
    from recovery.store import make_engine

    engine = make_engine(settings.db_url)
    r1 = incidents.ingest(engine, settings, [alert(fp="20", job_id="100", node="node4")])
    lost = alert(fp="22", starts="2026-01-01T00:05:00Z", node="node4", alertname="GoodputNodeLost")
    assert incidents.ingest(engine, settings, [lost], node_jobs=lambda n: []).incident_ids == (
        r1.incident_ids
    )
    later = alert(fp="21", starts="2026-01-02T00:00:00Z", node="node4", alertname="NodeHot")
    r2 = incidents.ingest(engine, settings, [later], node_jobs=lambda n: ["300"])
    assert r1.incident_ids[0] not in r2.incident_ids
    assert [incidents.incident(engine, i)["job_id"] for i in r2.incident_ids] == ["300"]


def test_without_slurm_a_node_alert_joins_only_recent_job_incidents(settings):
    """Slurm off or failing: a job incident stands in for Slurm's answer while its last alert on
    the node started within lookback_s (900 s) before the node alert. Failed before: a day
    later, it still joined."""
    from recovery.store import make_engine

    engine = make_engine(settings.db_url)
    r1 = incidents.ingest(engine, settings, [alert(fp="30", job_id="100", node="node4")])
    soon = alert(fp="31", starts="2026-01-01T00:10:00Z", node="node4", alertname="NodeHot")
    assert incidents.ingest(engine, settings, [soon]).incident_ids == r1.incident_ids

    def down(node):
        raise RuntimeError("squeue: timed out")

    late = alert(fp="32", starts="2026-01-02T00:10:00Z", node="node4", alertname="NodeLost")
    r3 = incidents.ingest(engine, settings, [late], node_jobs=down)
    inc = incidents.incident(engine, r3.incident_ids[0])
    assert r3.incident_ids != r1.incident_ids and inc["node"] == "node4"
    assert inc["job_id"] is None


@pytest.mark.parametrize(
    "label,value",
    [
        ("node", "node1; rm -rf /"),
        ("node", "../../etc"),
        ("node", "x" * 10_000),
        ("node", "nöde1"),
        ("node", "node1\n"),
        ("job_id", "12; reboot"),
        ("job_id", "../../etc/passwd"),
        ("job_id", "١٢٣"),
        ("gpu", "0 or 1"),
        ("severity", "y" * 10_000),
        ("bad-name", "v"),
    ],
)
def test_hostile_labels_rejected(client, label, value):
    r = client.post("/api/v1/alerts", json=payload(alert(**{label: value})))
    assert r.status_code == 422, r.text
    assert r.json()["error"] and "Traceback" not in r.text
    assert client.get("/api/v1/incidents").json()["total"] == 0


@pytest.mark.parametrize(
    "body,code",
    [
        (b"{not json", 400),
        (b"[]", 422),
        (json.dumps({"version": "3", "status": "firing", "alerts": []}).encode(), 422),
        (json.dumps(payload(alert(starts="yesterday"))).encode(), 422),
        (json.dumps(payload(alert(fp="zz-not-hex"))).encode(), 422),
        (b"[" * 700_000 + b"]" * 700_000, 413),
        (b"[" * 5000 + b"]" * 5000, 400),
    ],
)
def test_malformed_payloads_get_4xx(client, body, code):
    r = client.post("/api/v1/alerts", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == code, r.text
    assert "error" in r.json()


def test_oversized_payload_is_413(client):
    big = payload(*[alert(fp=f"{i:x}", job_id="1", extra="v" * 1000) for i in range(1000)])
    r = client.post("/api/v1/alerts", json=big)
    assert r.status_code == 413 and "larger" in r.json()["error"]


def test_wrong_content_type_is_415(client):
    r = client.post("/api/v1/alerts", content=b"x", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415


def test_openapi_and_metrics(client):
    spec = client.get("/openapi.json").json()
    assert "/api/v1/alerts" in spec["paths"] and "/api/v1/incidents/{incident_id}" in spec["paths"]
    client.post("/api/v1/alerts", json=payload(alert(job_id="5")))
    client.post("/api/v1/alerts", json=payload(alert(node="../x")))
    text = client.get("/metrics").text
    assert 'goodput_receiver_alerts_received_total{status="firing"} 1.0' in text
    assert 'goodput_receiver_alerts_received_total{status="rejected"} 1.0' in text
    assert 'goodput_incidents{outcome="pending",state="open"} 1.0' in text
    assert "goodput_diagnosis_duration_seconds_bucket" in text


def test_incident_paging(client):
    for i in range(5):
        client.post("/api/v1/alerts", json=payload(alert(fp=f"{i + 1:x}0", job_id=str(i + 1))))
    page = client.get("/api/v1/incidents", params={"limit": 2, "offset": 1}).json()
    assert page["total"] == 5 and [i["job_id"] for i in page["items"]] == ["4", "3"]
    assert client.get("/api/v1/incidents", params={"job_id": "1;x"}).status_code == 422
    assert client.get("/api/v1/incidents/999").status_code == 404


def test_goodputs_own_notices_open_no_incident(client):
    notice = alert(
        fp="b1c2d3",
        alertname="GoodputActionPendingApproval",
        job_id="42",
        goodput_notification="true",
    )
    r = client.post("/api/v1/alerts", json=payload(notice))
    assert r.status_code == 200 and r.json()["new"] == 1
    assert client.get("/api/v1/incidents").json()["total"] == 0
    r = client.post("/api/v1/alerts", json=payload(alert(fp="c1d2e3", job_id="42")))
    assert client.get("/api/v1/incidents").json()["total"] == 1


def test_goodputs_own_health_alerts_are_kept_and_open_no_incident(client):
    """A restarted detector or exporter (scope="service") is on-call's: there is no job or
    node to mend, so no `unknown` incident; an alert with neither job nor node and another
    scope still opens the cluster's incident."""
    down = alert(fp="d0", alertname="GoodputExporterDown", scope="service", instance="h:9")
    r = client.post("/api/v1/alerts", json=payload(down))
    assert r.status_code == 200 and r.json() == {**r.json(), "new": 1, "incidents": []}
    resolved = {**down, "status": "resolved", "endsAt": "2026-01-01T00:05:00Z"}
    later = client.post("/api/v1/alerts", json=payload(resolved, status="resolved")).json()
    assert later["incidents"] == []
    assert client.get("/api/v1/incidents").json()["total"] == 0
    with client.app.state.engine.connect() as conn:
        assert conn.execute(select(alerts.c.status)).scalars().all() == ["resolved"]
    cluster = alert(fp="e0", alertname="GoodputSomethingClusterWide", scope="node")
    assert client.post("/api/v1/alerts", json=payload(cluster)).json()["incidents"] != []


def test_an_unreadable_stored_diagnosis_reads_as_none_not_500(client):
    from recovery.store import diagnoses

    client.post("/api/v1/alerts", json=payload(alert(fp="d1e2f3", job_id="42")))
    incident_id = client.get("/api/v1/incidents").json()["items"][0]["id"]
    with client.app.state.engine.begin() as conn:
        conn.execute(
            diagnoses.insert().values(
                incident_id=incident_id, created_at=1.0, outcome="unknown", body="{not json"
            )
        )
    r = client.get(f"/api/v1/incidents/{incident_id}")
    assert r.status_code == 200 and r.json()["diagnosis"] is None

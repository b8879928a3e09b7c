"""An incident's alert summary (total, firing, by name, nodes) as the database counts it
equals the one read from its alerts: in the list (which loads no alert rows) and the detail."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import event

from recovery.app import create_app
from recovery.settings import Settings
from tests.unit.test_receiver_webhook import alert, payload


def _summary(alerts: list[dict]) -> dict:
    names: dict[str, int] = {}
    for a in alerts:
        names[a["alertname"]] = names.get(a["alertname"], 0) + 1
    return {
        "total": len(alerts),
        "firing": sum(a["status"] == "firing" for a in alerts),
        "by_name": names,
        "nodes": sorted({a["node"] for a in alerts if a["node"]}),
    }


def test_the_counted_summary_equals_the_one_read_from_the_alerts(tmp_path):
    app = create_app(
        Settings(
            db_url=f"sqlite:///{tmp_path}/s.db",
            require_auth=False,
            slurm_enabled=False,
            settle_s=3600,
        ),
        start_worker=False,
    )
    client = TestClient(app)
    sent = [alert(f"a{i}", job_id="42", node=f"node{i % 3 + 1}", gpu=str(i)) for i in range(7)]
    sent += [
        alert("b1", alertname="GoodputJobHung", severity="warning", job_id="42"),
        alert("c1", alertname="GoodputNodeEcc", job_id="42", node="node9"),
        alert("c1", status="resolved", alertname="GoodputNodeEcc", job_id="42", node="node9"),
        alert("d1", job_id="43", node="node1"),
    ]
    for a in sent:
        r = client.post("/api/v1/alerts", json=payload(a))
        assert r.status_code == 200, r.text
    statements: list[str] = []
    event.listen(app.state.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    listed = client.get("/api/v1/incidents").json()["items"]
    assert statements and not any("alerts.labels" in s for s in statements)  # no alert rows
    assert {i["job_id"] for i in listed} == {"42", "43"}
    for item in listed:
        detail = client.get(f"/api/v1/incidents/{item['id']}").json()
        assert item["alert_summary"] == detail["alert_summary"] == _summary(detail["alerts"])
    big = next(i for i in listed if i["job_id"] == "42")["alert_summary"]
    assert big["total"] == 9 and big["firing"] == 8
    assert big["by_name"]["GoodputGPUFatalXid"] == 7
    assert big["nodes"] == ["node1", "node2", "node3", "node9"]

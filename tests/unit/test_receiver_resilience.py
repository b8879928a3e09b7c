"""The receiver keeps answering while Slurm is slow or down: it serves before reconciling, asks
Slurm nothing under the ingest lock, records a Slurm error while planning as a retried action,
answers 404 for an unknown node, and diagnoses again once Slurm is back instead of sending a
verdict with Slurm's evidence missing to a person."""

from __future__ import annotations

import json
import socket
import threading
import time
from types import SimpleNamespace

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from recovery import action_config, actions, audit, incidents, outbox, reconciler, worker
from recovery.api_actions import router
from recovery.app import create_app
from recovery.policy import parse_policy
from recovery.scheduler import SchedulerError
from recovery.scheduler.simulated import SimulatedScheduler
from recovery.settings import Settings
from recovery.store import make_engine
from tests.unit.actions_fakes import make_fake_sim


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.setenv("GOODPUT_ACTIONS_THREAD", "0")
    monkeypatch.delenv("GOODPUT_TEST_CRASH_AT", raising=False)


def _settings(tmp_path, **kw):
    return Settings(
        db_url=f"sqlite:///{tmp_path}/r.db",
        require_auth=False,
        slurm_enabled=True,
        settle_s=0.0,
        worker_poll_s=0.05,
        **kw,
    )


def _alert(fp, **labels):
    return {
        "status": "firing",
        "labels": {"alertname": "GoodputGPUFatalXid", **labels},
        "annotations": {},
        "startsAt": "2026-01-01T00:00:10Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": fp,
    }


def test_serves_healthz_at_once_while_the_scheduler_hangs(tmp_path, monkeypatch):
    """A scheduler that accepts connections and never answers (slurmctld hung): the start-up
    reconcile waits on it in the background; /healthz answers immediately."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(16)
    monkeypatch.setenv("GOODPUT_SCHEDULER", "simulated")
    monkeypatch.setenv("GOODPUT_SIM_URL", f"http://127.0.0.1:{hole.getsockname()[1]}")
    monkeypatch.setenv("GOODPUT_ACTIONS_THREAD", "1")
    monkeypatch.setattr(action_config, "_sched_cache", {})
    s = _settings(tmp_path)
    engine = make_engine(s.db_url)
    now = time.time()
    with engine.begin() as conn:  # an action a dead process left ready: start-up finishes it
        conn.execute(
            outbox.actions_table.insert().values(
                id="inc-7",
                incident_id="7",
                job_id="42",
                kind="drain",
                state="ready",
                mode="act",
                body=json.dumps({"action": {"kind": "drain", "nodes": ["node2"]}}),
                created_at=now,
                updated_at=now,
                attempts=0,
            )
        )
    t0 = time.monotonic()
    with TestClient(create_app(s, start_worker=True)) as c:
        assert c.get("/healthz").status_code == 200
        took = time.monotonic() - t0
    hole.close()
    assert took < 2.0, f"/healthz took {took:.1f}s at start-up"


def test_no_slurm_call_under_the_ingest_lock(tmp_path):
    """A node-only alert whose Slurm lookup takes 2 s does not hold up another POST."""
    s = _settings(tmp_path)
    engine = make_engine(s.db_url)
    under_lock = []

    def slow_lookup(node):
        under_lock.append(incidents._LOCK.locked())
        time.sleep(2.0)
        return ["42"]

    t = threading.Thread(
        target=incidents.ingest,
        args=(engine, s, [_alert("n1", node="node2")]),
        kwargs={"node_jobs": slow_lookup},
    )
    t.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    incidents.ingest(engine, s, [_alert("j1", job_id="77")], node_jobs=lambda n: [])
    other = time.monotonic() - t0
    t.join()
    assert under_lock == [False]
    assert other < 1.0, f"a job alert waited {other:.1f}s behind a node lookup"
    found = incidents.list_incidents(engine)["items"]
    assert sorted(i["job_id"] for i in found) == ["42", "77"]


def test_a_redelivered_node_alert_asks_slurm_nothing(tmp_path):
    s = _settings(tmp_path)
    engine = make_engine(s.db_url)
    calls = []
    lookup = lambda n: calls.append(n) or ["42"]  # noqa: E731
    incidents.ingest(engine, s, [_alert("n2", node="node3")], node_jobs=lookup)
    incidents.ingest(engine, s, [_alert("n2", node="node3")], node_jobs=lookup)
    assert calls == ["node3"]


class Broken(SimulatedScheduler):
    def job_state(self, job_id):
        raise SchedulerError("squeue --json failed: Invalid user for SlurmUser")


def test_a_slurm_error_while_planning_is_a_retried_action_with_an_audit_event(tmp_path):
    client, st, submit = make_fake_sim()
    submit("42", node="node2")
    engine = make_engine(f"sqlite:///{tmp_path / 'p.db'}")
    s = SimpleNamespace(
        policy=parse_policy({"mode": "act"}, env={}),
        scheduler_adapter=Broken("http://testserver", session=client),
        alertmanager_url=None,
        prometheus_url=None,
        action_retry_s=0.0,
    )
    inc = {"id": 9, "job_id": "42", "opened_at": time.time()}
    d = {"outcome": "gpu_hardware_fault", "affected_nodes": ["node2"], "confidence": 0.95}
    a = actions.on_diagnosis(engine, s, inc, d)
    assert a["state"] == "waiting_scheduler" and "Invalid user" in a["last_error"]
    ev = audit.query(engine, incident_id="9", type_="retry_scheduled")[0]
    assert ev and "error while planning" in ev[0]["payload"]["reason"]
    s.scheduler_adapter = SimulatedScheduler("http://testserver", session=client)
    reconciler.reconcile(engine, s)
    assert outbox.get_action(engine, a["id"])["state"] == "executed"


def test_resuming_an_unknown_node_is_404_and_records_nothing(tmp_path):
    client, st, _ = make_fake_sim()
    app = FastAPI()
    app.include_router(router)
    app.state.engine = make_engine(f"sqlite:///{tmp_path / 'n.db'}")
    app.state.settings = SimpleNamespace(
        policy=parse_policy({"mode": "act"}, env={}),
        alertmanager_url=None,
        scheduler_adapter=SimulatedScheduler("http://testserver", session=client),
    )
    c = TestClient(app)
    r = c.post("/api/v1/nodes/node9/resume", json={"who": "ana"})
    assert r.status_code == 404 and "unknown" in r.json()["detail"]
    assert outbox.list_actions(app.state.engine) == []


SLURM_DOWN = {"connector": "slurm", "status": "error", "detail": "slurmctld unreachable"}


def test_a_diagnosis_made_while_slurm_was_down_is_made_again_before_anyone_is_asked(
    tmp_path, monkeypatch
):
    s = _settings(tmp_path, recheck_s=10.0)
    engine = make_engine(s.db_url)
    planned = []
    monkeypatch.setattr(actions, "on_diagnosis", lambda e, st, inc, doc: planned.append(doc))
    reports = [[SLURM_DOWN], [SLURM_DOWN], [{"connector": "slurm", "status": "ok"}]]

    def diagnose(st, inc):
        rep = reports.pop(0)
        conf = 0.5 if rep[0]["status"] == "error" else 0.95
        return {
            "incident_id": inc["id"],
            "outcome": "gpu_hardware_fault",
            "affected_nodes": ["node2"],
            "confidence": conf,
            "connector_reports": rep,
        }

    monkeypatch.setattr(worker, "diagnose", diagnose)
    (inc,) = incidents.ingest(engine, s, [_alert("s1", job_id="42")]).incident_ids
    t0 = time.time()
    assert worker.run_once(engine, s, now=t0) == [inc] and planned == []
    assert worker.run_once(engine, s, now=t0 + 5) == []  # not before recheck_s
    assert worker.run_once(engine, s, now=t0 + 11) == [inc] and planned == []
    assert worker.run_once(engine, s, now=t0 + 22) == [inc]
    assert [d["confidence"] for d in planned] == [0.95]
    assert outbox.incident_action(engine, str(inc))["body"]["diagnosis"]["confidence"] == 0.95


def test_a_long_slurm_outage_goes_to_a_person_after_the_bound(tmp_path, monkeypatch):
    s = _settings(tmp_path, recheck_s=1.0)
    engine = make_engine(s.db_url)
    planned = []
    monkeypatch.setattr(actions, "on_diagnosis", lambda e, st, inc, doc: planned.append(doc))
    monkeypatch.setattr(worker, "INCOMPLETE_MAX", 3)
    monkeypatch.setattr(
        worker,
        "diagnose",
        lambda st, inc: {
            "incident_id": inc["id"],
            "outcome": "gpu_hardware_fault",
            "affected_nodes": ["node2"],
            "confidence": 0.5,
            "connector_reports": [SLURM_DOWN],
        },
    )
    (inc,) = incidents.ingest(engine, s, [_alert("s2", job_id="43")]).incident_ids
    t0 = time.time()
    for k in range(3):
        worker.run_once(engine, s, now=t0 + 2 * k)
        assert planned == []
    worker.run_once(engine, s, now=t0 + 10)
    assert len(planned) == 1 and incidents.incident(engine, inc)["diagnosis_state"] == "done"

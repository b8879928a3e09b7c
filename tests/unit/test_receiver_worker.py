"""The diagnosis worker: settle delay, restart resumes pending work, missing sources, hook."""

from __future__ import annotations

import socket
import time

import pytest
from fastapi.testclient import TestClient

from recovery import actions, incidents, worker
from recovery.app import create_app
from recovery.settings import Settings
from recovery.store import make_engine

XID79 = (
    "2026-01-01T00:00:05+0000 node2 kernel: NVRM: Xid (PCI:0000:2b:00): 79, pid=<unknown>, "
    "name=<unknown>, GPU has fallen off the bus."
)
CUDA = (
    "[rank9]:[E0101 00:00:15.408271257 ProcessGroupNCCL.cpp:1896] [PG ID 0 PG GUID 0(default_pg)"
    " Rank 9] Process group watchdog thread terminated with exception: CUDA error: an illegal "
    "memory access was encountered"
)


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def settings(tmp_path):
    logs = tmp_path / "logs"
    (logs / "jobs").mkdir(parents=True)
    (logs / "kernel").mkdir()
    (logs / "jobs" / "slurm-77.out").write_text("training ...\n" + CUDA + "\n")
    (logs / "kernel" / "node2.log").write_text(XID79 + "\n")
    return Settings(
        db_url=f"sqlite:///{tmp_path}/w.db",
        require_auth=False,
        slurm_enabled=False,
        settle_s=0.0,
        worker_poll_s=0.05,
        log_dir=str(logs),
        log_timezone="UTC",  # the stamps above are UTC, whatever the host's zone
        prometheus_url=f"http://127.0.0.1:{_closed_port()}",
        http_timeout_s=1.0,
        lookback_s=10 * 365 * 86400,
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


def test_settle_delay_groups_alerts_before_diagnosis(settings):
    s = settings.with_(settle_s=30.0)
    engine = make_engine(s.db_url)
    r = incidents.ingest(engine, s, [_alert("a1", job_id="77", node="node2")])
    assert worker.run_once(engine, s) == []  # not due yet
    incidents.ingest(engine, s, [_alert("a2", job_id="77", node="node1")])
    done = worker.run_once(engine, s, now=time.time() + 31)
    assert done == r.incident_ids


def test_prometheus_down_still_diagnoses_with_error_report(settings):
    engine = make_engine(settings.db_url)
    r = incidents.ingest(engine, settings, [_alert("b1", job_id="77", node="node2")])
    assert worker.run_once(engine, settings) == r.incident_ids
    doc = incidents.latest_diagnosis(engine, r.incident_ids[0])
    assert doc["outcome"] == "gpu_hardware_fault" and doc["affected_nodes"] == ["node2"]
    reports = {c["connector"]: c for c in doc["connector_reports"]}
    assert reports["prometheus"]["status"] == "error"
    assert reports["logs"]["status"] == "ok"
    assert doc["confidence"] < 0.9  # missing sources lower confidence
    roles = {s["id"]: s["role"] for s in doc["symptoms"]}
    assert roles["illegal_memory_access"] == "cascade" and roles["xid_fatal"] == "initiating"
    assert incidents.incident(engine, r.incident_ids[0])["diagnosis_state"] == "done"


def test_restart_resumes_pending_diagnoses_and_calls_actions_hook(settings, monkeypatch):
    # first "process": accepts the alert, dies before diagnosing
    app1 = create_app(settings, start_worker=False)
    with TestClient(app1) as c:
        body = {"version": "4", "status": "firing", "alerts": [_alert("c1", job_id="77")]}
        inc = c.post("/api/v1/alerts", json=body).json()["incidents"][0]
    calls = []
    monkeypatch.setattr(
        actions,
        "on_diagnosis",
        lambda engine, s, incident, diagnosis: calls.append((incident, diagnosis)),
    )
    # second "process": the worker picks the pending incident up
    app2 = create_app(settings, start_worker=True)
    with TestClient(app2) as c:
        deadline = time.time() + 20
        while time.time() < deadline and not calls:
            time.sleep(0.1)
        detail = c.get(f"/api/v1/incidents/{inc}").json()
    assert detail["diagnosis"] is not None and detail["diagnosis_state"] == "done"
    assert calls and calls[0][0]["id"] == inc and calls[0][1]["incident_id"] == inc
    assert calls[0][1]["schema_version"] == "1"


def test_new_alert_during_diagnosis_repends(settings):
    engine = make_engine(settings.db_url)
    r = incidents.ingest(engine, settings, [_alert("d1", job_id="77")])
    ((inc, gen),) = incidents.due_diagnoses(engine)
    incidents.ingest(engine, settings, [_alert("d2", job_id="77", node="node2")])
    assert incidents.store_diagnosis(engine, inc, gen, {"outcome": "unknown"}) == "superseded"
    assert incidents.incident(engine, r.incident_ids[0])["diagnosis_state"] == "pending"


def _hook(monkeypatch):
    calls = []
    monkeypatch.setattr(
        actions, "on_diagnosis", lambda e, s, inc, doc: calls.append(doc["outcome"])
    )
    return calls


def test_an_inconclusive_diagnosis_is_rechecked_before_any_action(settings, monkeypatch):
    s = settings.with_(recheck_s=30.0, recheck_max=2)
    engine = make_engine(s.db_url)
    calls = _hook(monkeypatch)
    (inc,) = incidents.ingest(engine, s, [_alert("r1", job_id="88")]).incident_ids
    t0 = time.time()
    assert worker.run_once(engine, s, now=t0) == [inc]  # no evidence for job 88: unknown
    assert incidents.latest_diagnosis(engine, inc)["outcome"] == "unknown"
    assert incidents.incident(engine, inc)["diagnosis_state"] == "pending" and calls == []
    assert worker.run_once(engine, s, now=t0 + 5) == []  # not due before recheck_s
    assert worker.run_once(engine, s, now=t0 + 31) == [inc] and calls == []  # second unknown
    assert worker.run_once(engine, s, now=t0 + 62) == [inc]  # third: rechecks spent, final
    assert calls == ["unknown"] and incidents.incident(engine, inc)["diagnosis_state"] == "done"
    assert worker.run_once(engine, s, now=t0 + 200) == []


def test_a_recheck_that_finds_the_cause_acts_on_it(settings, monkeypatch, tmp_path):
    s = settings.with_(recheck_s=30.0, recheck_max=2)
    engine = make_engine(s.db_url)
    calls = _hook(monkeypatch)
    (inc,) = incidents.ingest(engine, s, [_alert("r2", job_id="88")]).incident_ids
    t0 = time.time()
    worker.run_once(engine, s, now=t0)
    assert calls == []
    (tmp_path / "logs" / "jobs" / "slurm-88.out").write_text("step 10\n" + CUDA + "\n")
    assert worker.run_once(engine, s, now=t0 + 31) == [inc]
    assert calls == ["workload_crash"]
    assert incidents.incident(engine, inc)["diagnosis_state"] == "done"


def test_no_recheck_once_resolved_or_when_turned_off(settings, monkeypatch):
    calls = _hook(monkeypatch)
    off = settings.with_(recheck_max=0)
    engine = make_engine(off.db_url)
    (a,) = incidents.ingest(engine, off, [_alert("r3", job_id="88")]).incident_ids
    worker.run_once(engine, off)
    assert calls == ["unknown"] and incidents.incident(engine, a)["diagnosis_state"] == "done"
    s = settings.with_(recheck_s=30.0, recheck_max=2)
    (b,) = incidents.ingest(engine, s, [_alert("r4", job_id="89")]).incident_ids
    incidents.ingest(engine, s, [{**_alert("r4", job_id="89"), "status": "resolved"}])
    assert incidents.incident(engine, b)["state"] == "resolved"
    worker.run_once(engine, s)
    assert calls == ["unknown"]  # inconclusive on a resolved incident: nobody is asked
    assert incidents.incident(engine, b)["diagnosis_state"] == "done"


def test_an_incident_resolving_during_a_recheck_asks_nobody(settings, monkeypatch):
    s = settings.with_(recheck_s=30.0, recheck_max=2)
    engine = make_engine(s.db_url)
    calls = _hook(monkeypatch)
    (inc,) = incidents.ingest(engine, s, [_alert("r5", job_id="90")]).incident_ids
    t0 = time.time()
    worker.run_once(engine, s, now=t0)
    incidents.ingest(engine, s, [{**_alert("r5", job_id="90"), "status": "resolved"}])
    assert worker.run_once(engine, s, now=t0 + 31) == [inc]
    assert calls == [] and incidents.incident(engine, inc)["diagnosis_state"] == "done"


def test_a_superseded_diagnosis_plans_nothing(settings, monkeypatch):
    engine = make_engine(settings.db_url)
    calls = _hook(monkeypatch)
    (inc,) = incidents.ingest(engine, settings, [_alert("s1", job_id="91")]).incident_ids
    real = worker.diagnose

    def diagnose_while_an_alert_arrives(st, incident):
        incidents.ingest(engine, st, [_alert("s2", job_id="91", node="node2")])
        return real(st, incident)

    monkeypatch.setattr(worker, "diagnose", diagnose_while_an_alert_arrives)
    assert worker.run_once(engine, settings) == [inc]
    assert calls == [] and incidents.incident(engine, inc)["diagnosis_state"] == "pending"
    monkeypatch.setattr(worker, "diagnose", real)
    assert worker.run_once(engine, settings, now=time.time() + 5) == [inc]
    assert len(calls) == 1 and incidents.incident(engine, inc)["diagnosis_state"] == "done"


def test_a_failed_diagnosis_leaves_the_one_another_receiver_stored(settings, monkeypatch):
    # while this receiver diagnosed, a new alert ended its claim and another receiver stored
    # the new generation's diagnosis; the failure then set the incident back to pending
    engine = make_engine(settings.db_url)
    (inc,) = incidents.ingest(engine, settings, [_alert("f1", job_id="93")]).incident_ids

    def another_receiver_wins(st, incident):
        incidents.ingest(engine, st, [_alert("f2", job_id="93", node="node2")])
        ((_, gen),) = incidents.claim_diagnoses(engine, "other", 30.0, time.time() + 1)
        doc = {"outcome": "workload_crash"}
        assert incidents.store_diagnosis(engine, inc, gen, doc, owner="other") == "done"
        raise RuntimeError("evidence source gone")

    monkeypatch.setattr(worker, "diagnose", another_receiver_wins)
    assert worker.run_once(engine, settings) == []
    assert incidents.incident(engine, inc)["diagnosis_state"] == "done"
    assert incidents.due_diagnoses(engine, now=time.time() + 3600) == []


def test_recheck_settings_are_validated():
    assert Settings.from_env({"GOODPUT_RECEIVER_RECHECK_S": "12"}).recheck_s == 12.0
    with pytest.raises(ValueError, match="GOODPUT_RECEIVER_RECHECK_S must be a number"):
        Settings.from_env({"GOODPUT_RECEIVER_RECHECK_S": "soon"})
    with pytest.raises(ValueError, match="RECHECK_MAX must be a whole number"):
        Settings.from_env({"GOODPUT_RECEIVER_RECHECK_MAX": "1.5"})
    with pytest.raises(ValueError, match="RECHECK_MAX must be 0..10"):
        Settings.from_env({"GOODPUT_RECEIVER_RECHECK_MAX": "99"})

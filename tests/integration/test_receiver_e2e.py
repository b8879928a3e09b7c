"""End to end: real Alertmanager delivers an alert to the receiver, which stores a diagnosis."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import requests
import uvicorn

from recovery.app import create_app
from recovery.settings import Settings
from tests.conftest import wait_until
from tests.helpers import forget_faults, slurm

PORT = 19430


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture
def receiver(local_stack, tmp_path):
    """Our own receiver on 19430, or the one already serving there (e.g. `goodput demo`)."""
    settings = Settings.from_env(
        None,
        db_url=f"sqlite:///{tmp_path}/e2e.db",
        settle_s=1.0,
        worker_poll_s=0.2,
        lookback_s=600.0,
    )
    assert settings.token_file and os.path.exists(settings.token_file)
    token = open(settings.token_file).read().strip()
    server = thread = None
    if _port_free(PORT):
        server = uvicorn.Server(
            uvicorn.Config(create_app(settings), host="127.0.0.1", port=PORT, log_level="warning")
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        wait_until(lambda: not _port_free(PORT), timeout=15, what="receiver listening")
    yield {"url": f"http://127.0.0.1:{PORT}", "headers": {"Authorization": f"Bearer {token}"}}
    if server is not None:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def job(local_stack):
    """A 2-node job whose rank 9 (second node with 8 GPUs a node) logs a fatal NVLink error."""
    forget_faults(local_stack["GOODPUT_PROMETHEUS_URL"], local_stack["GOODPUT_LOG_DIR"])
    name = f"e2e-recv-{uuid.uuid4().hex[:6]}"
    out_path = os.path.join(local_stack["GOODPUT_LOG_DIR"], "jobs", "slurm-%j.out")
    script = (
        "echo '[rank9]: RuntimeError: CUDA error: uncorrectable NVLink error detected "
        "during the execution'; sleep 300"
    )
    out = slurm("sbatch", "--parsable", "-N", "2", "-J", name, "-o", out_path, "--wrap", script)
    job_id = out.strip().split(";")[0]
    try:
        wait_until(
            lambda: slurm("squeue", "-h", "-j", job_id, "-o", "%T").strip() == "RUNNING",
            timeout=30,
            what="job running",
        )
        nodes = slurm("squeue", "-h", "-j", job_id, "-o", "%N").strip()
        hosts = slurm("scontrol", "show", "hostnames", nodes).split()
        log = os.path.join(local_stack["GOODPUT_LOG_DIR"], "jobs", f"slurm-{job_id}.out")
        wait_until(
            lambda: os.path.exists(log) and "NVLink" in open(log).read(),
            timeout=20,
            what="job log written",
        )
        yield job_id, hosts
    finally:
        slurm("scancel", job_id, check=False)


def test_alertmanager_to_diagnosis(receiver, job, alertmanager_url):
    job_id, hosts = job
    culprit = hosts[1]  # rank 9 with 8 GPUs a node
    now = datetime.now(UTC)
    alert = {
        "labels": {
            "alertname": "GoodputGPUFatalXid",
            "severity": "critical",
            "job_id": job_id,
            "node": culprit,
            "gpu": "3",
            "e2e_run": uuid.uuid4().hex,
        },
        "annotations": {"summary": "XID 79", "description": "e2e", "runbook_url": "x"},
        "startsAt": now.isoformat(),
    }
    r = requests.post(f"{alertmanager_url}/api/v2/alerts", json=[alert], timeout=5)
    assert r.status_code == 200, r.text

    def diagnosed():
        page = requests.get(
            f"{receiver['url']}/api/v1/incidents",
            params={"job_id": job_id},
            headers=receiver["headers"],
            timeout=5,
        ).json()
        if not page["items"]:
            return None
        detail = requests.get(
            f"{receiver['url']}/api/v1/incidents/{page['items'][0]['id']}",
            headers=receiver["headers"],
            timeout=5,
        ).json()
        return detail if detail.get("diagnosis") else None

    try:
        detail = wait_until(diagnosed, timeout=45, interval=0.5, what="a stored diagnosis")
    finally:
        alert["endsAt"] = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
        requests.post(f"{alertmanager_url}/api/v2/alerts", json=[alert], timeout=5)
    doc = detail["diagnosis"]
    assert detail["job_id"] == job_id and detail["alerts"][0]["node"] == culprit
    assert doc["outcome"] == "gpu_hardware_fault", doc["root_cause"]
    assert doc["affected_nodes"] == [culprit]
    reports = {c["connector"]: c["status"] for c in doc["connector_reports"]}
    assert reports["slurm"] == "ok" and reports["logs"] == "ok"
    assert reports["prometheus"] in ("ok", "empty")  # reachable; the fake job has no GPUs
    assert {e["source"] for e in doc["evidence"]} >= {"log"}
    assert doc["job_name"].startswith("e2e-recv-")
    metrics = requests.get(f"{receiver['url']}/metrics", timeout=5).text
    assert 'goodput_receiver_alerts_received_total{status="firing"}' in metrics

"""The foundation's promise: each real service of the local stack works, used as Goodput uses it."""

from __future__ import annotations

import json
import subprocess
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from tests.conftest import ROOT, wait_until
from tests.helpers import add_scrape_target, prom_query, slurm

STACK_SH = ROOT / "compose" / "local" / "stack.sh"


def test_prometheus_scrapes_a_client_endpoint_and_answers_queries(prometheus_url):
    registry = CollectorRegistry()
    marker = uuid.uuid4().hex[:8]
    gauge = Gauge("goodput_test_marker", "test gauge", ["marker"], registry=registry)
    gauge.labels(marker=marker).set(42)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    port = server.server_address[1]
    target = add_scrape_target(f"stack-{marker}", port)
    try:
        result = wait_until(
            lambda: prom_query(prometheus_url, f'goodput_test_marker{{marker="{marker}"}}'),
            timeout=30,
            what="Prometheus to scrape the test endpoint",
        )
        assert float(result[0]["value"][1]) == 42
    finally:
        target.unlink()
        server.shutdown()


class _Sink(BaseHTTPRequestHandler):
    received: list[dict] = []

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Sink.received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_alertmanager_delivers_a_firing_alert_to_a_webhook(alertmanager_url):
    server = ThreadingHTTPServer(("127.0.0.1", 19440), _Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    marker = uuid.uuid4().hex[:8]
    try:
        alert = {
            "labels": {"alertname": "GoodputStackTest", "goodput_test": "true", "marker": marker},
            "annotations": {"summary": "stack test"},
        }
        requests.post(
            f"{alertmanager_url}/api/v2/alerts", json=[alert], timeout=5
        ).raise_for_status()

        def delivered():
            return [
                p
                for p in _Sink.received
                if any(a["labels"].get("marker") == marker for a in p["alerts"])
            ]

        payload = wait_until(delivered, timeout=30, what="Alertmanager webhook delivery")[0]
        assert payload["version"] == "4"
        assert payload["status"] == "firing"
        assert (
            payload["alerts"][0]["endsAt"].startswith("0001-01-01")
            or payload["alerts"][0]["endsAt"]
        )
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture()
def batch_script(tmp_path):
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        'echo "gpus=$CUDA_VISIBLE_DEVICES restarts=${SLURM_RESTART_COUNT:-0}"\n'
        "sleep 60\n"
    )
    return script


def _job(job_id: str) -> dict:
    for line in slurm("scontrol", "show", "job", "-o", job_id).splitlines():
        return dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
    return {}


def test_slurm_runs_requeues_and_drains(local_stack, batch_script, tmp_path):
    out = tmp_path / "out-%j.txt"
    comment = json.dumps({"goodput": {"mode": "monitor"}}, separators=(",", ":"))
    job_id = slurm(
        "sbatch",
        "--parsable",
        "--gpus=2",
        "--requeue",
        f"--comment={comment}",
        f"--output={out}",
        "--job-name=stack-test",
        str(batch_script),
    ).strip()
    try:
        wait_until(
            lambda: _job(job_id).get("JobState") == "RUNNING", timeout=30, what="job running"
        )
        first = _job(job_id)["NodeList"]
        log = tmp_path / f"out-{job_id}.txt"
        wait_until(
            lambda: log.exists() and "gpus=" in log.read_text(), timeout=15, what="job output"
        )
        assert "gpus=0,1" in log.read_text()

        # requeue-hold, exclude the first node, release: the job restarts elsewhere
        slurm("scontrol", "requeuehold", job_id)
        wait_until(lambda: _job(job_id).get("JobState") == "PENDING", timeout=30, what="job held")
        slurm("scontrol", "update", f"JobId={job_id}", f"ExcNodeList={first}")
        slurm("scontrol", "release", job_id)
        wait_until(
            lambda: _job(job_id).get("JobState") == "RUNNING", timeout=30, what="job restarted"
        )
        job = _job(job_id)
        assert job["NodeList"] != first
        assert int(job["Restarts"]) == 1

        # drain and resume a node
        node = job["NodeList"]
        slurm("scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=goodput:stack-test")
        reasons = slurm("sinfo", "-R", "-h", "-o", "%N %E")
        assert f"{node} goodput:stack-test" in reasons
        slurm("scontrol", "update", f"NodeName={node}", "State=RESUME")
        wait_until(
            lambda: "drain" not in slurm("sinfo", "-h", "-n", node, "-o", "%T"),
            timeout=15,
            what="node resumed",
        )
    finally:
        slurm("scancel", job_id, check=False)


def test_sacct_shows_the_job_comment(local_stack, batch_script, tmp_path):
    comment = json.dumps({"goodput": {"max_requeues": 1}}, separators=(",", ":"))
    job_id = slurm(
        "sbatch",
        "--parsable",
        "--gpus=1",
        f"--comment={comment}",
        f"--output={tmp_path}/c-%j.txt",
        str(batch_script),
    ).strip()
    try:
        wait_until(
            lambda: _job(job_id).get("JobState") == "RUNNING", timeout=30, what="job running"
        )
    finally:
        slurm("scancel", job_id)

    def recorded():
        out = slurm("sacct", "-j", job_id, "-X", "-n", "-P", "-o", "jobid,state,comment")
        return out if comment in out else None

    row = wait_until(recorded, timeout=30, what="sacct to record the comment")
    assert row.startswith(f"{job_id}|CANCELLED")


def test_clear_cancels_every_job_and_keeps_the_stack(local_stack):
    """`stack.sh clear`, the test session's first step: jobs a run left when it died before
    its stop (running, pending behind them, held) are all cancelled, and Slurm keeps serving.
    Its first version cancelled by a state filter, which Slurm 22.05 applied to some jobs only."""
    submit = ("sbatch", "--parsable", "--output=/dev/null", "--job-name=left-by-a-dead-run")
    ids = [slurm(*submit, "--gpus=8", "--wrap", "sleep 600").strip() for _ in range(5)]
    ids.append(slurm(*submit, "--hold", "--gpus=1", "--wrap", "sleep 600").strip())
    wait_until(
        lambda: sum(_job(j).get("JobState") == "RUNNING" for j in ids) == 4,
        timeout=30,
        what="4 running, 1 pending behind them, 1 held",
    )
    out = subprocess.run(
        ["bash", str(STACK_SH), "clear"], capture_output=True, text=True, timeout=120, check=True
    )
    assert "cancelled 6 Slurm job(s)" in out.stdout
    assert slurm("squeue", "-h", "-o", "%i").split() == []
    assert "UP" in slurm("scontrol", "ping")

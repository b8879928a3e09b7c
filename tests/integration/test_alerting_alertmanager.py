"""alertmanager/alertmanager.yml in a real Alertmanager (a private instance on a free port, so the
shared stack is untouched): the recovery webhook gets every Goodput alert with the bearer token
from the file, critical ones also reach on-call (Slack example) with the diagnosis link from the
templates, and a node's hardware alert inhibits the job-level alerts of the same job only (as
the fault benchmark's model of inhibition, bench.inhibition, says)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
import yaml

from bench.inhibition import Inhibition
from tests.conftest import wait_until

AM_DIR = Path(__file__).resolve().parents[2] / "alertmanager"
TOKEN = "integration-test-token"


class _Capture(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.posts.append(  # type: ignore[attr-defined]
            {"path": self.path, "auth": self.headers.get("Authorization"), "body": json.loads(body)}
        )
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def private_am(tmp_path_factory):
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if not binary:
        pytest.skip("Alertmanager not installed (Debian package prometheus-alertmanager)")
    capture = ThreadingHTTPServer(("127.0.0.1", 0), _Capture)
    capture.posts = []  # type: ignore[attr-defined]
    threading.Thread(target=capture.serve_forever, daemon=True).start()
    hook = f"http://127.0.0.1:{capture.server_port}"
    d = tmp_path_factory.mktemp("am")
    (d / "secrets").mkdir()
    (d / "secrets" / "receiver-token").write_text(TOKEN)
    (d / "secrets" / "slack-webhook-url").write_text(f"{hook}/slack")
    (d / "secrets" / "pagerduty-routing-key").write_text("not-a-real-key")
    (d / "secrets" / "smtp-password").write_text("not-a-real-password")
    shutil.copytree(AM_DIR / "templates", d / "templates")
    cfg = yaml.safe_load((AM_DIR / "alertmanager.yml").read_text())
    # only the destinations change: the routing tree, inhibition and templates are the real ones
    recv = {r["name"]: r for r in cfg["receivers"]}
    recv["goodput-recovery"]["webhook_configs"][0]["url"] = f"{hook}/recovery"
    recv["test-sink"]["webhook_configs"][0]["url"] = f"{hook}/test-sink"
    del recv["oncall"]["email_configs"], recv["oncall"]["pagerduty_configs"]  # no network here
    (d / "alertmanager.yml").write_text(yaml.safe_dump(cfg))
    port = _free_port()
    proc = subprocess.Popen(
        [binary, f"--config.file={d / 'alertmanager.yml'}", f"--storage.path={d / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        stdout=subprocess.DEVNULL, stderr=open(d / "am.log", "w"), cwd=d,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _ready(url), 20, what="private Alertmanager ready")
        yield url, capture.posts
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        capture.shutdown()


def _ready(url: str) -> bool:
    try:
        return requests.get(f"{url}/-/ready", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def _post(url: str, *alerts: dict) -> None:
    body = [
        {"labels": a, "annotations": {"summary": f"{a['alertname']} test",
                                      "runbook_url": "alertmanager/runbooks.md#x"}}
        for a in alerts
    ]  # fmt: skip
    r = requests.post(f"{url}/api/v2/alerts", json=body, timeout=5)
    assert r.status_code == 200, r.text


def _alerts(posts: list[dict], path: str) -> list[dict]:
    return [a for p in posts if p["path"] == path for a in p["body"].get("alerts", [])]


def test_routing_inhibition_and_templates(private_am):
    url, posts = private_am
    xid = {"alertname": "GoodputGPUFatalXid", "severity": "critical", "scope": "gpu",
           "node": "node2", "gpu": "3", "job_id": "42", "signal": "dcgm_xid"}  # fmt: skip
    # a slower job pages once: GoodputJobSlow mutes the combined score's GoodputJobAnomaly
    slow44 = {"alertname": "GoodputJobSlow", "severity": "warning", "scope": "job",
              "job_id": "44", "detector": "pace"}  # fmt: skip
    _post(url, xid, slow44)
    time.sleep(0.5)  # the source is known before its targets are dispatched
    hung42 = {"alertname": "GoodputJobHung", "severity": "warning", "scope": "job",
              "job_id": "42", "signal": "progress_score"}  # fmt: skip
    log42 = {"alertname": "GoodputJobLogFault", "severity": "warning", "scope": "job",
             "job_id": "42", "node": "node1", "pattern": "nccl_watchdog_timeout",
             "signal": "log_pattern"}  # fmt: skip
    hung43 = dict(hung42, job_id="43")
    anomaly44 = {"alertname": "GoodputJobAnomaly", "severity": "warning", "scope": "job",
                 "job_id": "44", "detector": "combined"}  # fmt: skip
    _post(url, hung42, log42, hung43, anomaly44)

    # the recovery webhook: the XID and job 43's alert, bearer token from the file
    def recovery_got():
        got = {(a["labels"]["alertname"], a["labels"].get("job_id")) for a in
               _alerts(posts, "/recovery")}  # fmt: skip
        want = {("GoodputGPUFatalXid", "42"), ("GoodputJobHung", "43"), ("GoodputJobSlow", "44")}
        return got if want <= got else None

    got = wait_until(recovery_got, 20, what="recovery webhook deliveries")
    assert all(p["auth"] == f"Bearer {TOKEN}" for p in posts if p["path"] == "/recovery")
    # inhibited: job 42's job-level alerts (from node1 too: equal is on job_id only)
    assert ("GoodputJobHung", "42") not in got and ("GoodputJobLogFault", "42") not in got
    state = requests.get(f"{url}/api/v2/alerts", timeout=5).json()
    inhibited = {(a["labels"]["alertname"], a["labels"]["job_id"]) for a in state
                 if a["status"]["inhibitedBy"]}  # fmt: skip
    assert inhibited == {
        ("GoodputJobHung", "42"),
        ("GoodputJobLogFault", "42"),
        ("GoodputJobAnomaly", "44"),
    }
    assert ("GoodputJobAnomaly", "44") not in got
    # the fault benchmark's model of inhibition answers the same on the same alerts
    posted = [xid, slow44, hung42, log42, hung43, anomaly44]
    modelled = {(a["alertname"], a["job_id"]) for a, m in
                zip(posted, Inhibition.load().muted(posted), strict=True) if m}  # fmt: skip
    assert modelled == inhibited

    # on-call (Slack example): only the critical alert, with the diagnosis link (group_wait 10s)
    slack = wait_until(
        lambda: [p["body"] for p in posts if p["path"] == "/slack"], 30, what="slack message"
    )
    attachment = slack[0]["attachments"][0]
    assert attachment["title_link"] == "http://127.0.0.1:19430/incidents?job_id=42"
    assert "GoodputGPUFatalXid" in attachment["title"] and "on node2" in attachment["title"]
    assert "Diagnosis: http://127.0.0.1:19430/incidents?job_id=42" in attachment["text"]
    assert "Runbook: alertmanager/runbooks.md#x" in attachment["text"]
    assert not any("GoodputJobHung" in json.dumps(p) for p in slack)
    assert not _alerts(posts, "/test-sink")


def test_test_alerts_go_to_the_sink_only(private_am):
    url, posts = private_am
    alert = {"alertname": "GoodputGPUFatalXid", "severity": "critical", "scope": "gpu",
             "node": "node9", "goodput_test": "true"}  # fmt: skip
    _post(url, alert)
    wait_until(lambda: _alerts(posts, "/test-sink"), 15, what="test-sink delivery")
    time.sleep(1)
    assert not [a for a in _alerts(posts, "/recovery") if a["labels"].get("node") == "node9"]

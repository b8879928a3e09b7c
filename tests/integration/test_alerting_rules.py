"""The generated rules on the real local Prometheus: loaded and healthy, and an alert fires from
a scraped series end to end (Prometheus -> Alertmanager), while a benign series stays quiet.

Test series carry goodput_test="true", so Alertmanager routes their alerts to the test sink,
never to the recovery receiver."""

from __future__ import annotations

import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from alertdsl import spec as A
from tests.conftest import wait_until
from tests.helpers import add_scrape_target, prom_query


def _reload(prometheus_url: str) -> None:
    r = requests.post(f"{prometheus_url}/-/reload", timeout=10)
    assert r.status_code == 200, r.text


def test_every_generated_rule_is_loaded_and_healthy(prometheus_url):
    _reload(prometheus_url)
    spec = A.load()

    def groups():
        data = requests.get(f"{prometheus_url}/api/v1/rules", timeout=5).json()["data"]
        return [g for g in data["groups"] if g["name"].startswith("goodput-")]

    loaded = wait_until(lambda: len(groups()) == 2 and groups(), 20, what="goodput rule groups")
    rules = [r for g in loaded for r in g["rules"]]
    alerts = {r["name"] for r in rules if r["type"] == "alerting"}
    records = {r["name"] for r in rules if r["type"] == "recording"}
    assert alerts == {a.name for a in spec.alerts}
    assert records == {r["record"] for r in spec.recording}
    wait_until(
        lambda: all(r.get("health") == "ok" for g in groups() for r in g["rules"]),
        15,
        what="every rule evaluated without error",
    )


class _Exposition(BaseHTTPRequestHandler):
    body = b""

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)


@pytest.fixture
def test_target(local_stack):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Exposition)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server, lambda name: add_scrape_target(name, server.server_port)
    finally:
        server.shutdown()
        for p in Path(local_stack["GOODPUT_STACK_DIR"]).glob(
            "prometheus/targets/extra-alerting-*.json"
        ):
            p.unlink(missing_ok=True)


def test_log_fault_and_kernel_xid_fire_and_benign_lines_stay_quiet(
    prometheus_url, alertmanager_url, test_target
):
    _reload(prometheus_url)
    job, quiet_job = (str(random.randint(900_000_000, 999_999_999)) for _ in range(2))
    node = f"alerttest{random.randint(1000, 9999)}"
    server, add = test_target
    server.RequestHandlerClass.body = (
        "# TYPE goodput_log_pattern_matches_total counter\n"
        f'goodput_log_pattern_matches_total{{job_id="{job}",node="{node}",pattern="cuda_oom",'
        'goodput_test="true"} 1\n'
        f'goodput_log_pattern_matches_total{{job_id="{quiet_job}",node="{node}",'
        'pattern="checkpoint_saved",goodput_test="true"} 3\n'
        "# TYPE goodput_node_xid_errors_total counter\n"
        f'goodput_node_xid_errors_total{{node="{node}",xid="79",goodput_test="true"}} 1\n'
        f'goodput_node_xid_errors_total{{node="{node}",xid="13",goodput_test="true"}} 1\n'
    ).encode()
    add(f"alerting-{node}")

    def firing(alertname: str, **labels: str) -> list[dict]:
        sel = ",".join(f'{k}="{v}"' for k, v in labels.items())
        return prom_query(
            prometheus_url, f'ALERTS{{alertstate="firing",alertname="{alertname}",{sel}}}'
        )

    (log_alert,) = wait_until(
        lambda: firing("GoodputJobLogFault", job_id=job), 30, what="GoodputJobLogFault firing"
    )
    assert log_alert["metric"]["pattern"] == "cuda_oom"
    assert log_alert["metric"]["severity"] == "warning"
    assert log_alert["metric"]["node"] == node
    (xid_alert,) = wait_until(
        lambda: firing("GoodputGPUFatalXid", node=node), 20, what="GoodputGPUFatalXid firing"
    )
    assert xid_alert["metric"]["xid"] == "79"
    assert xid_alert["metric"]["signal"] == "kernel_log_xid"
    assert xid_alert["metric"]["severity"] == "critical"
    # the benign pattern and the application XID 13 never fire
    assert not firing("GoodputJobLogFault", job_id=quiet_job)
    assert not [a for a in firing("GoodputGPUFatalXid", node=node) if a["metric"]["xid"] != "79"]

    # Alertmanager has it, with annotations, routed to the test sink only
    def in_alertmanager():
        r = requests.get(
            f"{alertmanager_url}/api/v2/alerts",
            params={"filter": [f'job_id="{job}"', 'alertname="GoodputJobLogFault"']},
            timeout=5,
        )
        return r.json()

    (am,) = wait_until(in_alertmanager, 20, what="the alert in Alertmanager")
    assert am["annotations"]["runbook_url"].endswith("#goodputjoblogfault")
    assert job in am["annotations"]["summary"]
    assert [r["name"] for r in am["receivers"]] == ["test-sink"]

"""VictoriaMetrics as the TSDB: `stack.sh start-vm` (vmagent -> victoria-metrics -> vmalert ->
an Alertmanager API) in a private state directory, scraping dcgm-exporter-shaped series with the
shipped scrape config; the detector's queries (unsharded and 2 shards), the generated rules in
vmalert (a fatal XID reaches the notifier as GoodputGPUFatalXid) and the receiver's evidence
queries all run against it. The notifier is a local sink speaking Alertmanager's v2 API, so the
shared stack's Alertmanager never sees these alerts.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from bench.scale_data import Cluster, dcgm_text
from detector import fields as F
from detector.baselines import BaselineStore
from detector.ingest import Shard, fetch
from detector.service import Service, ServiceConfig
from recovery.evidence import Context
from recovery.evidence import prometheus as evidence
from recovery.settings import Settings
from tests.conftest import wait_until
from tests.integration.test_prom_client import check_the_client

ROOT = Path(__file__).resolve().parents[2]
STACK = ROOT / "compose" / "local" / "stack.sh"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    srv = ThreadingHTTPServer(("127.0.0.1", _port()), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture(scope="module")
def vm(tmp_path_factory):
    if not shutil.which("victoria-metrics"):
        pytest.skip("victoria-metrics is not installed (apt-get install victoria-metrics)")
    cluster = Cluster.make(8 * 12, idle=1 / 3, seed=5)  # 4 jobs of 16 GPUs + 32 idle GPUs
    cluster.values[3, F.DCGM_FIELDS.index(F.XID_FIELD)] = 79  # node1 GPU 3 fell off the bus
    body = dcgm_text(cluster)
    alerts: list[dict] = []

    class Exporter(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):  # noqa: N802 - the notifier sink: Alertmanager's /api/v2/alerts
            n = int(self.headers.get("Content-Length") or 0)
            alerts.extend(json.loads(self.rfile.read(n) or b"[]"))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a):
            pass

    class Sink(Exporter):
        def do_GET(self):  # noqa: N802 - scraped as Alertmanager is (its job): no DCGM series
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()

    exporter, sink = _serve(Exporter), _serve(Sink)
    state = tmp_path_factory.mktemp("vm-stack")
    ports = {k: str(_port()) for k in ("VM", "VMAGENT", "VMALERT")}
    env = {
        **os.environ,
        "GOODPUT_STACK_DIR": str(state),
        "GOODPUT_VM_PORT": ports["VM"],
        "GOODPUT_VMAGENT_PORT": ports["VMAGENT"],
        "GOODPUT_VMALERT_PORT": ports["VMALERT"],
        "GOODPUT_ALERTMANAGER_PORT": str(sink.server_address[1]),
        "GOODPUT_DETECTOR_SHARDS": "2",
    }
    (state / "prometheus" / "targets").mkdir(parents=True)
    (state / "prometheus" / "targets" / "dcgm.json").write_text(
        json.dumps([{"targets": [f"127.0.0.1:{exporter.server_address[1]}"]}])
    )
    url = f"http://127.0.0.1:{ports['VM']}"
    try:
        subprocess.run(["bash", str(STACK), "start-vm"], env=env, check=True, timeout=120)

        def scraped():
            r = requests.get(
                f"{url}/api/v1/query", params={"query": "count(DCGM_FI_DEV_GPU_UTIL)"}, timeout=5
            ).json()["data"]["result"]
            return r and float(r[0]["value"][1]) == len(cluster.node)

        wait_until(scraped, 90, interval=1, what="victoria-metrics to hold every GPU")
        yield url, cluster, alerts, ports
    finally:
        subprocess.run(["bash", str(STACK), "stop"], env=env, timeout=120, check=False)
        exporter.shutdown()
        sink.shutdown()


def _query(url: str, expr: str) -> list[dict]:
    return requests.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()["data"][
        "result"
    ]


def test_detector_queries_and_shards_work_on_victoriametrics(vm, tmp_path):
    url, cluster, _, _ = vm
    jobs = set(cluster.job) - {""}
    whole = Service(ServiceConfig(prometheus_url=url), store=BaselineStore(tmp_path))
    assert whole.cycle()
    assert set(whole.engine.base.jobs) == jobs
    assert whole.scores.series == len(cluster.node)
    per = _query(url, "count by (hpc_job, goodput_shard) (DCGM_FI_DEV_GPU_UTIL)")
    shard_of: dict[str, set[str]] = {}
    for s in per:  # vmagent's hashmod: one shard per job (its hash is not Prometheus' md5)
        m = s["metric"]
        shard_of.setdefault(m.get("hpc_job", ""), set()).add(m.get("goodput_shard", ""))
    assert shard_of.pop("") == {""} and all(len(v) == 1 for v in shard_of.values())
    seen = []
    for k in range(2):
        frame, _ = fetch(Service(ServiceConfig(prometheus_url=url)).client, shard=Shard(k, 2))
        mine = set(frame.job) - {""}
        assert all((frame.job == j).sum() == cluster.job.count(j) == 16 for j in mine)
        assert (frame.job == "").sum() == 32  # and every GPU without a job
        assert mine == {j for j, v in shard_of.items() if v == {str(k)}}
        seen.append(mine)
    assert not seen[0] & seen[1] and seen[0] | seen[1] == jobs


def test_generated_rules_run_in_vmalert_and_notify(vm):
    url, cluster, alerts, ports = vm
    groups = requests.get(f"http://127.0.0.1:{ports['VMALERT']}/api/v1/rules", timeout=10).json()[
        "data"
    ]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) > 20  # every generated recording and alerting rule is loaded

    def fired():
        return [
            a
            for a in alerts
            if a.get("labels", {}).get("alertname") == "GoodputGPUFatalXid"
            and a["labels"].get("node") == "node1"
        ]

    got = wait_until(fired, 60, interval=1, what="GoodputGPUFatalXid from vmalert")
    labels = got[-1]["labels"]
    assert labels["gpu"] == "3" and labels["job_id"] == cluster.job[3]
    assert labels["severity"] == "critical" and labels["signal"] == "dcgm_xid"
    assert got[-1]["annotations"]["runbook_url"]
    errors = [r for r in rules if r.get("lastError")]
    assert not errors, [(r["name"], r["lastError"]) for r in errors][:5]
    # a recording rule: vmalert writes it back through remote write, seconds after evaluating
    wait_until(
        lambda: len(_query(url, 'goodput:dcgm_gpu_util:by_gpu{node="node1"}')) == 8,
        60,
        interval=1,
        what="the recording rule's 8 series of node1 in VictoriaMetrics",
    )


def test_receiver_evidence_queries_work_on_victoriametrics(vm):
    url, cluster, _, _ = vm
    now = time.time()
    ctx = Context(job_id=cluster.job[0], nodes=["node1"], start=now - 120, end=now)
    bundle = evidence.collect(ctx, Settings(prometheus_url=url))
    assert not [r for r in bundle.reports if r.status == "error"], bundle.reports
    names = {s.name for s in bundle.series}
    assert {"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_GPU_UTIL", "node_presence"} <= names
    xid = [s for s in bundle.series if s.name == "DCGM_FI_DEV_XID_ERRORS" and s.gpu == "3"]
    assert xid and xid[0].points[-1][1] == 79


def test_the_prometheus_client_works_on_victoriametrics(vm):
    check_the_client(vm[0], exact=False)

"""Sharding by job with the real Prometheus: the local stack's own hashmod relabel rules
(compose/local/prometheus.yml) on dcgm-exporter-shaped series and the Slurm exporter's job ->
node join, scraped by a private Prometheus; N detector replicas query it.

A job's GPUs always carry one shard, the Slurm join of a job the same one, GPUs without a job
none; the detector's hashmod (Shard.owns) agrees with Prometheus'; the replicas score disjoint
job sets whose union is every job, each job with all its GPUs; one unsharded service sees all.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
import yaml

from bench.scale_data import Cluster, dcgm_text, slurm_text
from detector.baselines import BaselineStore
from detector.ingest import Shard, fetch
from detector.service import Service, ServiceConfig
from tests.conftest import wait_until

ROOT = Path(__file__).resolve().parents[2]
SHARDS = 3


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rules(job_name: str) -> list[dict]:
    """The shipped metric_relabel_configs of one scrape job, with N shards filled in."""
    doc = yaml.safe_load((ROOT / "compose/local/prometheus.yml").read_text())
    job = next(j for j in doc["scrape_configs"] if j["job_name"] == job_name)
    rules = job["metric_relabel_configs"]
    assert any(r.get("action") == "hashmod" for r in rules)
    return [{**r, "modulus": SHARDS} if r.get("modulus") == "@SHARDS@" else r for r in rules]


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    if not shutil.which("prometheus"):
        pytest.skip("prometheus is not installed (the local stack installs it)")
    cluster = Cluster.make(8 * 40, idle=0.1, seed=3)  # 18 jobs of 16 GPUs, 32 idle GPUs
    bodies = {"/dcgm": dcgm_text(cluster), "/slurm": slurm_text(cluster)}

    class Exporter(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = bodies.get(self.path, b"")
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    exp = ThreadingHTTPServer(("127.0.0.1", _port()), Exporter)
    threading.Thread(target=exp.serve_forever, daemon=True).start()
    target = f"127.0.0.1:{exp.server_address[1]}"
    tmp = tmp_path_factory.mktemp("prom")
    cfg = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {
                "job_name": name,
                "metrics_path": path,
                "static_configs": [{"targets": [target]}],
                "metric_relabel_configs": _rules(name),
            }
            for name, path in (("dcgm", "/dcgm"), ("goodput-slurm-exporter", "/slurm"))
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    port = _port()
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"

    def scraped():
        try:
            r = requests.get(
                f"{url}/api/v1/query",
                params={
                    "query": "count(DCGM_FI_DEV_GPU_UTIL) + count(goodput_slurm_job_node_info)"
                },
                timeout=2,
            ).json()
            return r["data"]["result"]
        except (requests.RequestException, ValueError, KeyError):
            return None

    try:
        wait_until(scraped, 60, what="the private Prometheus to scrape both targets")
        yield url, cluster
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        exp.shutdown()


def _query(url: str, expr: str) -> list[dict]:
    return requests.get(f"{url}/api/v1/query", params={"query": expr}, timeout=5).json()["data"][
        "result"
    ]


def test_a_jobs_series_land_on_one_shard_and_agree_with_the_detector(prom):
    url, cluster = prom
    jobs = set(cluster.job) - {""}
    gpu = _query(url, "count by (hpc_job, goodput_shard) (DCGM_FI_DEV_GPU_UTIL)")
    shard_of: dict[str, set[str]] = {}
    for s in gpu:
        shard_of.setdefault(s["metric"].get("hpc_job", ""), set()).add(
            s["metric"].get("goodput_shard", "")
        )
    assert shard_of.pop("") == {""}  # GPUs without a job carry no shard
    assert set(shard_of) == jobs
    assert all(len(v) == 1 for v in shard_of.values())  # one shard per job
    for job, (k,) in shard_of.items():
        assert Shard(int(k), SHARDS).owns(job)  # Prometheus' hashmod = the detector's
    assert len({next(iter(v)) for v in shard_of.values()}) == SHARDS  # every shard has jobs
    info = _query(url, "goodput_slurm_job_node_info")
    assert {(s["metric"]["job_id"], s["metric"]["goodput_shard"]) for s in info} == {
        (j, next(iter(v))) for j, v in shard_of.items()
    }


def test_replicas_score_disjoint_jobs_whose_union_is_all(prom, tmp_path):
    url, cluster = prom
    jobs = set(cluster.job) - {""}
    seen = []
    for k in range(SHARDS):
        svc = Service(
            ServiceConfig(prometheus_url=url, shard=Shard(k, SHARDS)),
            store=BaselineStore(tmp_path),
        )
        assert svc.cycle()
        frame, _ = fetch(svc.client, shard=Shard(k, SHARDS))
        per_job = {j: int((frame.job == j).sum()) for j in set(frame.job) - {""}}
        assert set(per_job.values()) == {16}  # each of its jobs with all its GPUs
        assert (frame.job == "").sum() == 32  # and the GPUs without a job
        seen.append(set(svc.engine.base.jobs))
        text = svc.exposition().decode()
        assert f'goodput_detector_shard_info{{shard="{k}",shards="{SHARDS}"}} 1.0' in text
    for a in range(SHARDS):
        for b in range(a + 1, SHARDS):
            assert not seen[a] & seen[b]
    assert set().union(*seen) == jobs
    whole = Service(ServiceConfig(prometheus_url=url), store=BaselineStore(tmp_path))
    assert whole.cycle()
    assert set(whole.engine.base.jobs) == jobs


def test_prometheus_answers_every_field_in_one_series_order(prom):
    """The fetch's fast path (one list comparison per field instead of indexing) holds."""
    url, _ = prom
    from detector.ingest import KEY, queries

    qs = queries(Shard(0, SHARDS))
    orders = [
        [s["metric"][KEY] for s in _query(url, qs[f])]
        for f in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_XID_ERRORS")
    ]
    assert orders[0] and orders[0] == orders[1] == orders[2]

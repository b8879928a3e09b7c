"""Node names with '-' and '.' on the real Prometheus: the selectors Goodput builds parse,
match the node's series and nothing else (catalogue.promql; issue 19, item 6).

A tiny exporter serves dcgm-style series for `gpu-node-01.rack.a` and a near miss
`gpu-node-01Xrack.a` (goodput_test="true": any alert goes to the test sink); the series are
deleted again at the end.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from catalogue import promql
from recovery.evidence import Context
from recovery.evidence import prometheus as evidence_prom
from recovery.settings import Settings
from tests.conftest import wait_until
from tests.helpers import add_scrape_target, prom_query

NODE, MISS = "gpu-node-01.rack.a", "gpu-node-01Xrack.a"
TAG = "promql-quoting"
BODY = "".join(
    f'DCGM_FI_DEV_GPU_UTIL{{Hostname="{h}",gpu="0",goodput_test="true"}} 42\n'
    f'goodput_node_xid_errors_total{{node="{h}",xid="0",goodput_test="true"}} 0\n'
    for h in (NODE, MISS)
).encode()


class _Metrics(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *_args):
        pass


@pytest.fixture
def scraped(prometheus_url):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    target = add_scrape_target(TAG, server.server_address[1])
    try:
        wait_until(
            lambda: len(prom_query(prometheus_url, f'DCGM_FI_DEV_GPU_UTIL{{test="{TAG}"}}')) == 2,
            60,
            what="the test exporter's series",
        )
        yield prometheus_url
    finally:
        target.unlink(missing_ok=True)
        server.shutdown()
        requests.post(
            f"{prometheus_url}/api/v1/admin/tsdb/delete_series",
            params={"match[]": f'{{test="{TAG}"}}'},
            timeout=10,
        )


def _instant(url: str, expr: str) -> requests.Response:
    return requests.get(f"{url}/api/v1/query", params={"query": expr}, timeout=5)


def test_label_replace_agrees_on_quoting_and_anchoring(prometheus_url):
    # scrape-free: Prometheus's own lexer and RE2 check a value's literal and its alternation
    for value in (NODE, 'odd "quoted" \\ name\t', "a|b(c)*"):
        expr = (
            f'label_replace(label_replace(vector(1), "node", {promql.quote(value)}, "", ""), '
            f'"hit", "yes", "node", {promql.quote(promql.any_of([value, "other"]))})'
        )
        r = _instant(prometheus_url, expr)
        assert r.status_code == 200, r.text
        (sample,) = r.json()["data"]["result"]
        assert sample["metric"] == {"node": value, "hit": "yes"}
    miss = (
        f'label_replace(label_replace(vector(1), "node", {promql.quote(MISS)}, "", ""), '
        f'"hit", "yes", "node", {promql.quote(promql.any_of([NODE]))})'
    )
    assert "hit" not in _instant(prometheus_url, miss).json()["data"]["result"][0]["metric"]


def test_the_old_escaping_is_a_parse_error(prometheus_url):
    r = _instant(prometheus_url, 'up{node=~"gpu\\-node\\-01"}')
    assert r.status_code == 400 and "escape" in r.text


def test_evidence_queries_match_the_dotted_node_only(scraped):
    ctx = Context(job_id=None, nodes=[NODE], start=0.0, end=1.0)
    for q in evidence_prom.queries(ctx):
        r = _instant(scraped, q)
        assert r.status_code == 200, (q, r.text)
    now = time.time()
    ctx = Context(job_id=None, nodes=[NODE], start=now - 120, end=now)
    bundle = evidence_prom.collect(ctx, Settings(prometheus_url=scraped))
    got = {(s.name, s.node) for s in bundle.series}
    assert ("DCGM_FI_DEV_GPU_UTIL", NODE) in got
    assert ("goodput_node_xid_errors_total", NODE) in got
    assert ("node_presence", NODE) in got
    assert not any(node == MISS for _, node in got)


def test_a_jobs_dcgm_evidence_is_read_by_node_where_dcgm_maps_no_jobs(scraped):
    """dcgm-exporter labels series with hpc_job only when told to (--hpc-job-mapping-dir); a
    job's incident asked for its DCGM fields by hpc_job alone and, there, got none of them
    (XID, ECC, row remaps, NVLink). Its nodes' unlabelled series are read; a near miss not."""
    now = time.time()
    ctx = Context(job_id="4242", nodes=[NODE], start=now - 120, end=now)
    bundle = evidence_prom.collect(ctx, Settings(prometheus_url=scraped))
    got = {(s.name, s.node) for s in bundle.series}
    assert ("DCGM_FI_DEV_GPU_UTIL", NODE) in got, got
    assert not any(node == MISS for _, node in got)
    assert bundle.reports[0].status == "ok", bundle.reports

"""The Prometheus and Loki clients on real sockets: a local server answers as Prometheus does
(shapes and messages of the HTTP API reference, prometheus.io/docs/prometheus/latest/querying/
api/; the 11,000-point limit and its message are Prometheus' `web/api/v1/api.go`), or breaks
the way a proxy or an overloaded server does; Loki is tests/lokifake.py. The real Prometheus and
VictoriaMetrics run in tests/integration/test_prom_client.py and test_victoriametrics.py.

The old clients had no total deadline (a server dripping bytes held the detector forever), no
bound on an answer's size, and the receiver's evidence raised on a non-JSON answer, losing
every series already read (test_evidence_keeps_what_it_read_when_one_answer_is_not_json).
"""

from __future__ import annotations

import functools
import gzip
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from clients.loki import LokiClient, LokiError, labels_key
from clients.prometheus import MAX_POINTS, PromClient, PromError, decode
from recovery import accounting
from recovery.console import plot
from recovery.evidence import Context
from recovery.evidence import prometheus as evidence
from recovery.settings import Settings
from tests.lokifake import FakeLoki

TOO_MANY = (
    "exceeded maximum resolution of 11,000 points per timeseries. "
    "Try decreasing the query resolution (?step=XX)"
)
Answer = Callable[[BaseHTTPRequestHandler, str, dict[str, str]], None]


def send(h: BaseHTTPRequestHandler, code: int, body: bytes | str, **headers: str) -> None:
    data = body.encode() if isinstance(body, str) else body
    h.send_response(code)
    fields = {"Content-Type": "application/json", "Content-Length": str(len(data))}
    fields.update({k.replace("_", "-"): v for k, v in headers.items()})
    for k, v in fields.items():
        h.send_header(k, v)
    h.end_headers()
    h.wfile.write(data)


def vector(*series: tuple[dict, str]) -> str:
    result = [{"metric": m, "value": [1000.0, v]} for m, v in series]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})


class Server:
    """A local HTTP server; `answer(handler, path, form)` answers each request (form: the POSTed
    or query parameters); `requests` keeps (path, form)."""

    def __init__(self, answer: Answer) -> None:
        self.answer, self.requests = answer, []
        srv = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def _do(self) -> None:
                u = urlparse(self.path)
                n = int(self.headers.get("Content-Length") or 0)
                form = {k: v[0] for k, v in parse_qs(u.query).items()}
                form.update(
                    {k: v[0] for k, v in parse_qs(self.rfile.read(n).decode("latin-1")).items()}
                )
                srv.requests.append((u.path, form))
                try:
                    srv.answer(self, u.path, form)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up, as it should

            do_GET = do_POST = _do  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve():
    servers: list[Server] = []

    def make(answer: Answer) -> Server:
        servers.append(Server(answer))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


# ---------------------------------------------------------------------------- Prometheus
def test_instant_query_posts_the_expression_and_skips_malformed_samples(serve):
    srv = serve(lambda h, p, f: send(h, 200, vector(({"node": "n1"}, "2.5"), ({"a": "b"}, "x"))))
    with PromClient(srv.url + "/") as prom:
        assert prom.query('up{job="a b"}', at=1000.0) == [({"node": "n1"}, 2.5)]
    assert srv.requests == [("/api/v1/query", {"query": 'up{job="a b"}', "time": "1000.000"})]


def prometheus_range(h: BaseHTTPRequestHandler, path: str, form: dict[str, str]) -> None:
    """Prometheus' range answer for one series, refusing > 11,000 points as Prometheus does."""
    start, end, step = float(form["start"]), float(form["end"]), float(form["step"])
    if (end - start) / step > 11_000:
        err = {"status": "error", "errorType": "bad_data", "error": TOO_MANY}
        return send(h, 400, json.dumps(err))
    n = int((end - start) / step + 1e-9) + 1
    values = [[start + i * step, str(i)] for i in range(n)]
    result = [{"metric": {"__name__": "m", "gpu": "0"}, "values": values}]
    send(
        h,
        200,
        json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}),
    )


def test_a_long_range_is_asked_in_parts_under_the_point_limit_and_joined(serve):
    srv = serve(prometheus_range)
    prom = PromClient(srv.url)
    with pytest.raises(PromError, match="11,000 points"):  # what asking at once gets
        status, body, url = prom._post(
            "/api/v1/query_range", {"start": "0", "end": "2500", "step": "0.1"}
        )
        decode(body, status, url, "matrix")
    srv.requests.clear()
    [(labels, points)] = prom.query_range("m", 0.0, 2500.0, 0.1)
    assert labels == {"__name__": "m", "gpu": "0"}
    times = [t for t, _ in points]
    assert len(times) == 25_001 and times == sorted(set(times))
    assert times[0] == 0.0 and times[-1] == pytest.approx(2500.0)
    assert len(srv.requests) == 3 == -(-25_001 // (MAX_POINTS + 1))
    with pytest.raises(ValueError, match="step"):
        prom.query_range("m", 0.0, 10.0, 0.0)


def test_prometheus_status_error_names_url_status_and_error_type(serve):
    err = {"status": "error", "errorType": "bad_data", "error": 'parse error: unexpected "}"'}
    srv = serve(lambda h, p, f: send(h, 400, json.dumps(err)))
    with pytest.raises(PromError) as got:
        PromClient(srv.url).raw("up{")
    e = got.value
    assert e.status == 400 and e.url == srv.url + "/api/v1/query"
    where = f"Prometheus at {srv.url}/api/v1/query"
    assert str(e) == f'{where} answered 400: bad_data: parse error: unexpected "}}"'


@pytest.mark.parametrize(
    ("code", "body", "want"),
    [
        (503, b"<html>Service Unavailable</html>", "answered 503: <html>Service Unavailable"),
        (200, b"<html>login</html>", "answered 200: answer is not JSON"),
        (200, b"[1, 2]", "not a Prometheus API answer"),
        (
            200,
            b'{"status":"success","data":{"resultType":"matrix","result":[]}}',
            "expected a vector, got matrix",
        ),
        (
            200,
            b'{"status":"success","data":{"resultType":"vector","result":{}}}',
            "result is not a list",
        ),
    ],
)
def test_what_is_not_an_answer_is_a_prom_error(serve, code, body, want):
    srv = serve(lambda h, p, f: send(h, code, body, Content_Type="text/html"))
    with pytest.raises(PromError, match=want) as got:
        PromClient(srv.url).raw("up")
    assert got.value.status == code


def test_an_answer_over_the_size_bound_is_refused_however_it_comes(serve):
    big = vector(*[({"gpu": str(i)}, "1") for i in range(200)]).encode()
    ways = {
        "/length": lambda h: send(h, 200, b"", Content_Length=str(10**9)),  # not read at all
        "/chunked": lambda h: _chunked(h, [big[i : i + 500] for i in range(0, len(big), 500)]),
        "/gzip": lambda h: send(h, 200, gzip.compress(big), Content_Encoding="gzip"),
    }
    srv = serve(lambda h, p, f: ways[p.split("/api")[0]](h))
    for way in ways:
        prom = PromClient(srv.url + way, max_bytes=len(big) // 2)
        with pytest.raises(PromError, match="over") as got:
            prom.raw("up")
        assert got.value.status == 200
    assert len(PromClient(srv.url + "/gzip", max_bytes=len(big)).raw("up")) == 200


def _chunked(h: BaseHTTPRequestHandler, parts: list[bytes], pause: float = 0.0) -> None:
    h.protocol_version = "HTTP/1.1"
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.send_header("Transfer-Encoding", "chunked")
    h.end_headers()
    for part in parts:
        h.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
        h.wfile.flush()
        time.sleep(pause)
    h.wfile.write(b"0\r\n\r\n")


def test_timeouts_a_silent_server_and_one_that_drips(serve):
    def answer(h, path, form):
        if path.startswith("/silent"):
            time.sleep(3)
            return send(h, 200, vector())
        _chunked(h, [b" "] * 30 + [vector().encode()], pause=0.1)  # 3 s, each read in time

    srv = serve(answer)
    for way, want in (("/silent", "ReadTimeout"), ("/drip", "no full answer within 0.5 s")):
        t0 = time.monotonic()
        with pytest.raises(PromError, match=want) as got:
            PromClient(srv.url + way, timeout=0.5).raw("up")
        assert time.monotonic() - t0 < 2.5  # the server answers at 3 s: gave up before it
        assert got.value.status is None and got.value.slow and "too slow" in str(got.value)


def test_a_body_sent_a_byte_at_a_time_is_given_up_at_the_deadline(serve):
    """Old code checked the deadline only between 1 MiB reads, each waiting for its whole
    MiB or the end: a body of known length sent a byte every 0.1 s held a client with
    timeout=0.5 until its last byte (5 s here), then called the server unreachable."""

    def drip(h, path, form):
        body = vector().encode()
        h.send_response(200)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        for i in range(len(body)):
            h.wfile.write(body[i : i + 1])
            h.wfile.flush()
            time.sleep(0.1)

    srv = serve(drip)
    t0 = time.monotonic()
    with pytest.raises(PromError, match="too slow: no full answer within 0.5 s") as got:
        PromClient(srv.url, timeout=0.5).raw("up")
    assert time.monotonic() - t0 < 1.0
    assert got.value.status is None and "unreachable" not in str(got.value)


def test_unreachable_and_bad_urls(serve):
    with pytest.raises(PromError) as got:
        PromClient("http://127.0.0.1:9").raw("up")
    assert got.value.status is None and "ConnectionError" in str(got.value)
    for bad in (
        "127.0.0.1:9090",
        "ftp://h",
        "http://",
        "http://h:port",
        "http://h/ x",
        "http://h?q=1",
    ):
        with pytest.raises(ValueError, match="Prometheus URL"):
            PromClient(bad)
    srv = serve(lambda h, p, f: send(h, 500, b"boom"))
    with pytest.raises(PromError) as got:
        PromClient(srv.url.replace("//", "//user:s3cret@")).raw("up")
    assert "s3cret" not in str(got.value) and got.value.url == srv.url + "/api/v1/query"


# ---------------------------------------------------------------------------- callers
def test_evidence_keeps_what_it_read_when_one_answer_is_not_json(serve):
    """Old code: `resp.json()` raised out of `collect`, so a proxy's HTML page for one query
    turned the whole Prometheus evidence into an error and dropped every series read."""

    def answer(h, path, form):
        if form["query"].startswith("DCGM_FI_DEV_GPU_UTIL"):
            return send(h, 200, b"<html>proxy error</html>", Content_Type="text/html")
        values = [[float(form["start"]), "1"]]
        result = [{"metric": {"__name__": "x", "Hostname": "node1", "gpu": "0"}, "values": values}]
        send(
            h,
            200,
            json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}),
        )

    srv = serve(answer)
    ctx = Context(job_id="42", nodes=["node1"], start=1000.0, end=1300.0)
    bundle = evidence.collect(ctx, Settings(prometheus_url=srv.url))
    [report] = bundle.reports
    assert report.status == "ok" and bundle.series
    assert report.reason.startswith(
        'DCGM_FI_DEV_GPU_UTIL{hpc_job="42"} or DCGM_FI_DEV_GPU_UTIL{Hostname=~"node1", hpc_job=""}'
    )
    assert len(srv.requests) == len(evidence.queries(ctx))


def test_evidence_stops_at_the_first_query_without_an_answer(serve):
    srv = serve(lambda h, p, f: time.sleep(2))
    ctx = Context(job_id="42", nodes=["node1"], start=1000.0, end=1300.0)
    bundle = evidence.collect(ctx, Settings(prometheus_url=srv.url, http_timeout_s=0.3))
    assert bundle.reports[0].status == "error" and "ReadTimeout" in bundle.reports[0].reason
    assert len(srv.requests) == 1


def test_accounting_and_the_console_read_through_the_client(serve):
    def answer(h, path, form):
        if path == "/api/v1/query":
            return send(h, 200, vector(({}, "1234.5")))
        result = [{"metric": {"Hostname": "node2"}, "values": [[1000.0, "5"], [1005.0, "NaN"]]}]
        send(
            h,
            200,
            json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}),
        )

    srv = serve(answer)
    assert accounting._checkpoint(srv.url, "42") == 1234.5
    assert 'job_id="42"' in srv.requests[-1][1]["query"]
    spec = {"expr": "DCGM_FI_DEV_GPU_UTIL{hpc_job={job_id}}", "title": "util", "unit": "%"}
    got, note = plot.series_from_prometheus(srv.url, spec, "42", 1000.0, ["node2"])
    assert note == "" and got["series"] == [
        {"label": "node2", "culprit": True, "points": [(1000.0, 5.0)]}
    ]
    down = serve(lambda h, p, f: send(h, 503, b"down"))
    assert accounting._checkpoint(down.url, "42") is None
    assert plot.series_from_prometheus(down.url, spec, "42", 1000.0, [])[1] == (
        "Prometheus did not answer (PromError)"
    )


def test_a_bad_prometheus_url_is_a_usage_error_of_the_detector(tmp_path):
    """Old code: the detector started with it and failed every cycle, forever."""
    argv = [sys.executable, "-m", "goodput.entry", "detector", "serve", "--port", "0"]
    argv += ["--prometheus-url", "127.0.0.1:19090", "--state-dir", str(tmp_path)]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert run.returncode == 2 and "Prometheus URL must be http(s)" in run.stderr
    assert "Traceback" not in run.stderr


# ---------------------------------------------------------------------------- Loki
@pytest.fixture
def loki():
    f = FakeLoki()
    yield f
    f.close()


def test_loki_push_and_query_range(loki):
    now = time.time_ns()
    key = labels_key({"source": "job", "job_id": "7"})
    client = LokiClient(loki.url, tenant="t1")
    client.push([(key, now - 2000, "b NCCL"), (key, now - 3000, "a NCCL"), (key, now - 1000, "c")])
    got = client.query_range('{source="job", job_id="7"} |= "NCCL"', limit=5)
    assert [g.line for g in got] == ["b NCCL", "a NCCL"]  # newest first
    assert got[0].labels == {"source": "job", "job_id": "7"} and got[0].ts_ns == now - 2000
    forward = client.query_range('{job_id="7"}', limit=2, direction="forward")
    assert [g.line for g in forward] == ["a NCCL", "b NCCL"]


def test_loki_backward_limit_keeps_the_newest_lines(loki):
    """What the receiver's Loki evidence relies on: `direction=backward` with a limit answers
    the window's newest lines (the ones near an alert), newest first."""
    now = time.time_ns()
    key = labels_key({"source": "job", "job_id": "8"})
    LokiClient(loki.url).push([(key, now - 1000 * i, f"line {i}") for i in range(10)])
    got = LokiClient(loki.url).query_range('{source="job", job_id="8"}', limit=3)
    assert [g.line for g in got] == ["line 0", "line 1", "line 2"]


def test_loki_refusals_keep_status_body_and_headers(loki):
    client = LokiClient(loki.url)
    old = (labels_key({"source": "job", "job_id": "7"}), 10**9, "from 1970")
    with pytest.raises(LokiError) as got:
        client.push([old])
    assert got.value.status == 400 and "has timestamp too old" in got.value.body
    loki.script = [(429, {"Retry-After": "2"})]
    with pytest.raises(LokiError) as got:
        client.push([old])
    assert got.value.status == 429 and got.value.headers["retry-after"] == "2"
    with pytest.raises(LokiError, match="answered 400: parse error"):
        client.query_range("not logql")


@pytest.mark.parametrize(
    ("body", "want"),
    [
        (b"<html>", "answered 200: answer is not JSON"),
        (b'{"status":"success","data":{"resultType":"matrix","result":[]}}', "not a log query"),
        (b'{"status":"success"}', "unreadable Loki answer"),
    ],
)
def test_what_is_not_a_loki_answer_is_a_loki_error(serve, body, want):
    srv = serve(lambda h, p, f: send(h, 200, body))
    with pytest.raises(LokiError, match=want):
        LokiClient(srv.url).query_range('{job_id="1"}')


def test_loki_size_bound_timeout_and_unreachable(serve):
    srv = serve(lambda h, p, f: send(h, 200, b"", Content_Length=str(10**9)))
    with pytest.raises(LokiError, match="over 1000"):
        LokiClient(srv.url, max_bytes=1000).query_range('{job_id="1"}')
    slow = serve(lambda h, p, f: time.sleep(2))
    with pytest.raises(LokiError, match="too slow: no full answer within 0.3 s") as got:
        LokiClient(slow.url, timeout=0.3).push([])
    assert got.value.status is None
    with pytest.raises(LokiError, match="unreachable"):
        LokiClient("http://127.0.0.1:9").query_range('{job_id="1"}')
    with pytest.raises(ValueError, match="Loki URL"):
        LokiClient("loki:3100")


def test_many_keeps_the_order_and_sends_at_most_parallel_ahead():
    """The answers come in query order, and a query leaves only when an answer is taken: on
    the code before this every query was sent (and its answer decoded and held) at once."""

    class Counting(PromClient):
        def __init__(self) -> None:
            super().__init__("http://127.0.0.1:9", parallel=3)
            self.sent: list[str] = []

        def raw(self, expr, at=None, want="vector"):
            self.sent.append(expr)
            time.sleep(0.01 * (int(expr) % 3))  # out of order if the order were not kept
            return [expr]

    c = Counting()
    answers = c.many([functools.partial(c.raw, str(i)) for i in range(12)])
    first = next(answers)
    time.sleep(0.2)
    assert first == ["0"] and len(c.sent) <= 4
    assert [a[0] for a in answers] == [str(i) for i in range(1, 12)]
    assert sorted(c.sent, key=int) == [str(i) for i in range(12)]
    c.close()

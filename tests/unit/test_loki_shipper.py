"""Loki shipping and query_range against a local server that implements Loki's documented
shapes (204 empty body, 400 plain text with partial accept, 429, gzip, JSON content type).
No real Loki server can be installed here."""
# ruff: noqa: E501

from __future__ import annotations

import gzip
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from exporters.loki import LokiError, LokiShipper, query_range

LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class FakeLoki:
    """Stores entries (deduplicated) like Loki; `script` = status codes to answer next."""

    def __init__(self, reject_older_than_ns: int = 0):
        self.entries: set[tuple[tuple, int, str]] = set()
        self.script: list[int] = []
        self.pushes = 0
        self.reject_older_than_ns = reject_older_than_ns
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body=b"", ctype="text/plain; charset=utf-8"):
                self.send_response(code)
                if body:
                    self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                fake.pushes += 1
                if fake.script:
                    code = fake.script.pop(0)
                    return self._send(
                        code, b"Ingestion rate limit exceeded\n" if code == 429 else b"internal\n"
                    )
                if self.headers.get("Content-Type") != "application/json":
                    return self._send(400, b"snappy: corrupt input\n")
                if self.headers.get("Content-Encoding") == "gzip":
                    raw = gzip.decompress(raw)
                body = json.loads(raw)
                refused = []
                for s in body["streams"]:
                    if not all(LABEL.match(k) for k in s["stream"]):
                        return self._send(400, b"error parsing labels\n")
                    key = tuple(sorted(s["stream"].items()))
                    for ts, line in s["values"]:
                        if int(ts) < fake.reject_older_than_ns:
                            refused.append(
                                f"entry for stream '{s['stream']}' has timestamp too old: {ts}"
                            )
                        else:
                            fake.entries.add((key, int(ts), line))
                if refused:  # Loki: 400 although the good entries were stored
                    return self._send(400, ("\n".join(refused) + "\n").encode())
                return self._send(204)

            def do_GET(self):
                u = urlparse(self.path)
                if u.path == "/ready":
                    return self._send(200, b"ready\n")
                if u.path != "/loki/api/v1/query_range":
                    return self._send(404, b"404 page not found\n")
                q = parse_qs(u.query)
                m = re.fullmatch(r'\{(.*?)\}(?:\s*\|=\s*"(.*)")?', q["query"][0].strip())
                if not m:
                    return self._send(400, b"parse error at line 1, col 1: syntax error\n")
                want = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
                needle = m.group(2) or ""
                start, end = int(q["start"][0]), int(q["end"][0])
                limit = int(q.get("limit", ["100"])[0])
                hits = sorted(
                    (
                        e
                        for e in fake.entries
                        if all(dict(e[0]).get(k) == v for k, v in want.items())
                        and needle in e[2]
                        and start <= e[1] <= end
                    ),
                    key=lambda e: e[1],
                    reverse=q.get("direction", ["backward"])[0] == "backward",
                )[:limit]
                streams: dict = {}
                for key, ts, line in hits:
                    streams.setdefault(key, []).append([str(ts), line])
                data = {
                    "status": "success",
                    "data": {
                        "resultType": "streams",
                        "result": [{"stream": dict(k), "values": v} for k, v in streams.items()],
                        "stats": {},
                    },
                }
                return self._send(200, json.dumps(data).encode(), "application/json")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def lines(self):
        return [e[2] for e in sorted(self.entries, key=lambda e: e[1])]


@pytest.fixture
def loki():
    f = FakeLoki()
    yield f
    f.server.shutdown()


def test_lines_arrive_with_labels_and_come_back(loki):
    s = LokiShipper(loki.url, flush_interval=0.05, backoff_base=0.01).start()
    s.on_lines(
        "job",
        "4242",
        [
            "[rank3]: step 1 loss 2.0",
            "NCCL WARN NET/IB : Got async event : port error",
            "  7: hello",
        ],
    )
    s.on_lines("kernel", "node2", ["NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus."])
    s.close()
    assert s.stats.sent_lines == 4 and s.stats.failed_lines == 0
    streams = {k for k, _, _ in loki.entries}
    assert (("job_id", "4242"), ("rank", "3"), ("stream", "stdout")) in streams
    assert (("job_id", "4242"), ("rank", "7"), ("stream", "stdout")) in streams
    assert (("node", "node2"), ("stream", "kernel")) in streams
    got = query_range(loki.url, '{job_id="4242"} |= "NCCL"', start=time.time() - 60)
    assert [g.line for g in got] == ["NCCL WARN NET/IB : Got async event : port error"]
    assert got[0].labels["job_id"] == "4242"
    newest_first = query_range(loki.url, '{job_id="4242"}', start=time.time() - 60)
    assert [g.line for g in newest_first][0] == "  7: hello"
    oldest_first = query_range(
        loki.url, '{job_id="4242"}', start=time.time() - 60, direction="forward"
    )
    assert oldest_first[0].line == "[rank3]: step 1 loss 2.0"


def test_429_and_5xx_are_retried_with_backoff(loki):
    loki.script = [429, 500, 503]
    s = LokiShipper(loki.url, flush_interval=0.05, backoff_base=0.01, max_retries=5).start()
    s.push("job", "1", "survives the storm")
    s.close()
    assert loki.lines() == ["survives the storm"]
    assert s.stats.retries == 3 and s.stats.errors == {"429": 1, "500": 1, "503": 1}


def test_retries_are_bounded_then_counted(loki):
    loki.script = [503] * 10
    s = LokiShipper(loki.url, backoff_base=0.001, max_retries=2)
    assert s.send([(time.time_ns(), "job", "1", "lost")]) is False
    assert loki.pushes == 3 and s.stats.failed_lines == 1


def test_partial_accept_400_is_not_resent(loki):
    loki.reject_older_than_ns = time.time_ns() - 10**9
    s = LokiShipper(loki.url)
    old = time.time_ns() - 3600 * 10**9
    assert s.send([(old, "job", "1", "too old"), (time.time_ns(), "job", "1", "fresh")]) is True
    assert loki.pushes == 1  # no loop
    assert loki.lines() == ["fresh"] and s.stats.rejected_batches == 1


def test_queue_is_bounded_and_push_never_blocks():
    # nothing listens on this port and no sender runs: pushes must return at once
    s = LokiShipper("http://127.0.0.1:9", queue_max=100)
    t0 = time.perf_counter()
    for i in range(10_000):
        s.push("job", "1", f"line {i}")
    assert time.perf_counter() - t0 < 1.0
    assert len(s._queue) == 100 and s.stats.dropped_lines == 9_900
    assert s._queue[-1][3] == "line 9999"  # the oldest were dropped


def test_batches_are_split_by_bytes(loki):
    s = LokiShipper(loki.url, batch_max_bytes=10_000)
    for i in range(50):
        s.push("job", "1", f"{i:03d}" + "x" * 997)
    while batch := s._take():
        assert sum(len(b[3]) for b in batch) <= 10_000
        s.send(batch)
    assert loki.pushes >= 5 and len(loki.lines()) == 50


def test_query_errors_are_clear(loki):
    with pytest.raises(LokiError, match="400.*parse error"):
        query_range(loki.url, "not logql")
    with pytest.raises(LokiError, match="unreachable"):
        query_range("http://127.0.0.1:9", '{job_id="1"}')


def test_bad_static_label_name():
    with pytest.raises(ValueError, match="label name"):
        LokiShipper("http://x", static_labels={"bad-name": "1"})

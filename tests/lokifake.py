"""A small Loki for contract tests: the push and query_range answers of Loki 2.6, as documented.

No Loki can be installed here, so this double implements what the shipper and the receiver
meet, each rule from a public source:

- `POST /loki/api/v1/push`, JSON (`Content-Type: application/json`, optionally
  `Content-Encoding: gzip`), `{"streams":[{"stream":{labels},"values":[["<ns>","line"]]}]}`;
  success is `204 No Content` with an empty body (Loki HTTP API reference,
  grafana.com/docs/loki/latest/reference/loki-http-api/#ingest-logs). Errors are
  `text/plain; charset=utf-8` (grafana/loki#11774 shows the headers).
- The distributor validates each stream and entry, drops only what is invalid, pushes the rest
  and answers 400 with the last error (grafana/loki pkg/distributor/distributor.go `Push`:
  `validationErr = err; continue`). Messages are Loki's constants (pkg/validation/validate.go):
  `entry for stream '%s' has timestamp too old: %v, oldest acceptable timestamp is: %v` (times
  RFC 3339; the body seen in grafana/loki#11774), `... has timestamp too new: %v`,
  `Max entry size '%d' bytes exceeded for stream '%s' while adding an entry with length '%d'
  bytes`, `Error parsing labels '%s' with error: %s`, and for the whole request
  `Ingestion rate limit exceeded for user %s (limit: %d bytes/sec) while attempting to ingest
  '%d' lines totaling '%d' bytes, reduce log volume or contact your Loki administrator to see if
  the limit can be increased` with 429. Defaults: `reject_old_samples_max_age` 168h,
  `creation_grace_period` 10m.
- The ingester pushes every stream, skipping one that fails (pkg/ingester/instance.go
  `appendErr = err; continue`), and with unordered writes (default since 2.4) refuses an entry
  older than the stream's newest minus `max_chunk_age`/2 (1 h), answering 400 with one line per
  entry and a total (2.x format, grafana/loki#4694 and #9151): `entry with timestamp <Go time>
  ignored, reason: 'entry too far behind' for stream: {..},` ... `total ignored: N out of M`.
  An entry equal to a stored one (same stream, time and line) is kept once (ingester
  `TestPushDeduplication`; queriers also merge identical entries).
- `GET /loki/api/v1/query_range` answers `{"status":"success","data":{"resultType":"streams",
  "result":[{"stream":{..},"values":[["<ns>","line"]]}],"stats":{}}}`; a bad query is 400
  `parse error at line 1, col 1: syntax error: ...`.

`refuse_whole_request=True` models what the issue reports from a Loki 2.6.1 build (a 400 for
one bad stream stored nothing of the request); `script` forces the next answers
(e.g. `[(429, {"Retry-After": "2"})]` or `[503]`).
"""

from __future__ import annotations

import gzip
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

LABEL = re.compile(r"\A[a-zA-Z_][a-zA-Z0-9_]*\Z")
HOUR_NS = 3600 * 10**9
RATE_LIMIT = (
    "Ingestion rate limit exceeded for user fake (limit: 4194304 bytes/sec) while attempting to "
    "ingest '{n}' lines totaling '{b}' bytes, reduce log volume or contact your Loki "
    "administrator to see if the limit can be increased"
)


def label_string(labels: dict[str, str]) -> str:
    """Loki's (Prometheus') label string: sorted, `{a="1", b="2"}`."""
    return "{" + ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items())) + "}"


def rfc3339(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns // 10**9))


def go_time(ns: int) -> str:
    """Go's time.Time.String() in UTC: `2021-11-08 03:31:11.947572938 +0000 UTC`."""
    s = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ns // 10**9))
    frac = f"{ns % 10**9:09d}".rstrip("0")
    return f"{s}{'.' + frac if frac else ''} +0000 UTC"


class FakeLoki:
    def __init__(
        self,
        max_age_s: float = 168 * 3600,
        grace_s: float = 600,
        max_line_size: int = 0,
        refuse_whole_request: bool = False,
    ) -> None:
        self.streams: dict[tuple, dict[tuple[int, str], None]] = {}  # labels -> ordered set
        self.highest: dict[tuple, int] = {}
        self.script: list[int | tuple[int, dict[str, str]]] = []
        self.pushes: list[int] = []  # status of each push
        self.received = 0  # entries in all pushes, duplicates included
        self.max_age_s, self.grace_s, self.max_line_size = max_age_s, grace_s, max_line_size
        self.refuse_whole_request = refuse_whole_request
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def entries(self) -> list[tuple[dict[str, str], int, str]]:
        with self.lock:
            out = [(dict(k), ts, line) for k, v in self.streams.items() for ts, line in v]
        return sorted(out, key=lambda e: e[1])

    def lines(self) -> list[str]:
        return [e[2] for e in self.entries()]

    # ------------------------------------------------------------------ push
    def push(self, body: dict) -> tuple[int, str]:
        now = time.time_ns()
        oldest = now - int(self.max_age_s * 1e9)
        validation_err = ""
        accepted: list[tuple[tuple, dict[str, str], list[tuple[int, str]]]] = []
        for s in body["streams"]:
            labels, values = s["stream"], s["values"]
            self.received += len(values)
            if not values:
                continue
            ls = label_string(labels)
            if not labels or not all(LABEL.match(k) for k in labels):
                validation_err = f"Error parsing labels '{ls}' with error: parse error"
                continue
            good = []
            for ts_s, line in values:
                ts = int(ts_s)
                if ts < oldest:
                    validation_err = (
                        f"entry for stream '{ls}' has timestamp too old: {rfc3339(ts)}, "
                        f"oldest acceptable timestamp is: {rfc3339(oldest)}"
                    )
                elif ts > now + int(self.grace_s * 1e9):
                    validation_err = f"entry for stream '{ls}' has timestamp too new: {rfc3339(ts)}"
                elif self.max_line_size and len(line.encode()) > self.max_line_size:
                    validation_err = (
                        f"Max entry size '{self.max_line_size}' bytes exceeded for stream '{ls}' "
                        f"while adding an entry with length '{len(line.encode())}' bytes"
                    )
                else:
                    good.append((ts, line))
            accepted.append((tuple(sorted(labels.items())), labels, good))
        if self.refuse_whole_request and validation_err:
            return 400, validation_err
        ingest_err = ""
        with self.lock:
            for key, labels, good in accepted:
                ignored = []
                stored = self.streams.setdefault(key, {})
                for ts, line in good:
                    if ts < self.highest.get(key, 0) - HOUR_NS:
                        ignored.append(ts)
                        continue
                    stored.setdefault((ts, line), None)
                    self.highest[key] = max(self.highest.get(key, 0), ts)
                if ignored:
                    ls = label_string(labels)
                    ingest_err = (
                        "".join(
                            f"entry with timestamp {go_time(ts)} ignored, reason: 'entry too far "
                            f"behind' for stream: {ls},\n"
                            for ts in ignored[:10]
                        )
                        + f"total ignored: {len(ignored)} out of {len(good)}"
                    )
        if ingest_err:
            return 400, ingest_err
        if validation_err:
            return 400, validation_err
        return 204, ""

    # ------------------------------------------------------------------ query
    def query_range(self, q: dict[str, list[str]]) -> tuple[int, str]:
        m = re.fullmatch(r'\{(.*?)\}(?:\s*\|=\s*"(.*)")?', q.get("query", [""])[0].strip())
        if not m:
            return 400, "parse error at line 1, col 1: syntax error: unexpected IDENTIFIER"
        want = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        needle = m.group(2) or ""
        now = time.time_ns()
        start = int(q.get("start", [str(now - HOUR_NS)])[0])
        end = int(q.get("end", [str(now)])[0])
        limit = int(q.get("limit", ["100"])[0])
        backward = q.get("direction", ["backward"])[0] == "backward"
        hits = [
            e
            for e in self.entries()
            if all(e[0].get(k) == v for k, v in want.items())
            and needle in e[2]
            and start <= e[1] < end
        ]
        hits.sort(key=lambda e: e[1], reverse=backward)
        streams: dict[tuple, list[list[str]]] = {}
        for labels, ts, line in hits[:limit]:
            streams.setdefault(tuple(sorted(labels.items())), []).append([str(ts), line])
        data = {
            "status": "success",
            "data": {
                "resultType": "streams",
                "result": [{"stream": dict(k), "values": v} for k, v in streams.items()],
                "stats": {},
            },
        }
        return 200, json.dumps(data)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def _send(self, code: int, body: str = "", headers: dict | None = None) -> None:
                data = body.encode()
                self.send_response(code)
                ctype = "application/json" if body.startswith("{") else "text/plain; charset=utf-8"
                if data:
                    self.send_header("Content-Type", ctype)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if urlparse(self.path).path != "/loki/api/v1/push":
                    return self._send(404, "404 page not found\n")
                if fake.script:
                    step = fake.script.pop(0)
                    code, headers = step if isinstance(step, tuple) else (step, {})
                    fake.pushes.append(code)
                    text = RATE_LIMIT.format(n=1, b=len(raw)) if code == 429 else "internal error"
                    return self._send(code, text + "\n", headers)
                if self.headers.get("Content-Type") != "application/json":
                    fake.pushes.append(400)
                    return self._send(400, "snappy: corrupt input\n")
                if self.headers.get("Content-Encoding") == "gzip":
                    raw = gzip.decompress(raw)
                try:
                    body = json.loads(raw)
                except ValueError as exc:
                    fake.pushes.append(400)
                    return self._send(400, f"loghttp.PushRequest.Streams: {exc}\n")
                code, text = fake.push(body)
                fake.pushes.append(code)
                self._send(code, text + "\n" if text else "")

            def do_GET(self) -> None:  # noqa: N802
                u = urlparse(self.path)
                if u.path == "/ready":
                    return self._send(200, "ready\n")
                if u.path != "/loki/api/v1/query_range":
                    return self._send(404, "404 page not found\n")
                code, text = fake.query_range(parse_qs(u.query))
                self._send(code, text)

        return Handler

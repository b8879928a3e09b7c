"""Loki's HTTP API (grafana.com/docs/loki/latest/reference/loki-http-api/): push and
query_range, with the timeouts, size bound and typed errors of `clients.http`.

`push_body(entries)` groups entries (labels, ts_ns, line) into streams, each sorted by time, and
gzips `{"streams":[{"stream":{labels},"values":[["<ns>","line"], ...]}]}`; `LokiClient.push`
sends it, and any answer but 2xx is a `LokiError` whose `status`, `body` and `headers` let the
caller read a refusal (`exporters/lokiapi.py`). `query_range` reads
`{"status":"success","data":{"resultType":"streams","result":[{"stream":{..},"values":
[["<ns>","line"]]}]}}` (`parse_streams`) into `LogLine`s.
"""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import requests

from clients import http

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs
Entry = tuple[Labels, int, str]  # (labels, ts_ns, line)
PUSH = "/loki/api/v1/push"
QUERY_RANGE = "/loki/api/v1/query_range"


class LokiError(http.ClientError):
    """Loki unreachable, or it refused a request or answered something unreadable."""

    SERVICE = "Loki"


@dataclass(frozen=True)
class LogLine:
    ts_ns: int
    labels: dict[str, str]
    line: str


def labels_key(labels: dict[str, str]) -> Labels:
    return tuple(sorted(labels.items()))


def push_body(entries: Sequence[Entry]) -> bytes:
    streams: dict[Labels, list[list[str]]] = {}
    for key, ts, line in entries:
        streams.setdefault(key, []).append([str(ts), line])
    payload = {
        "streams": [
            {"stream": dict(k), "values": sorted(v, key=lambda e: int(e[0]))}
            for k, v in streams.items()
        ]
    }
    return gzip.compress(json.dumps(payload).encode(), compresslevel=5)


def parse_streams(payload: object) -> list[tuple[dict[str, str], int, str]]:
    """(labels, ts_ns, line) of a `query_range` answer for a log query; ValueError if it is
    not one."""
    try:
        data = payload["data"]  # type: ignore[index]
        kind = data["resultType"]
        if kind != "streams":
            raise ValueError(f"not a log query (result type {kind!r})")
        out = []
        for s in data["result"]:
            labels = {str(k): str(v) for k, v in dict(s["stream"]).items()}
            for ts, line in s["values"]:
                out.append((labels, int(ts), str(line)))
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"unreadable Loki answer: {exc!r}") from None
    return out


class LokiClient:
    """`LokiClient(url, tenant=...)`: `push(entries)`, `query_range(logql, ...)`."""

    def __init__(
        self,
        url: str,
        timeout: float = 10.0,
        tenant: str | None = None,
        max_bytes: int = http.MAX_BYTES,
        session: requests.Session | None = None,
    ) -> None:
        self.url = http.check_url(url, "Loki")
        self.timeout, self.max_bytes = timeout, max_bytes
        self.headers = {"X-Scope-OrgID": tenant} if tenant else {}
        self.session = session if session is not None else requests.Session()

    def __enter__(self) -> LokiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.session.close()

    def _send(self, method: str, path: str, **kw: Any) -> bytes:
        url = self.url + path
        status, body, headers = http.request(
            self.session, method, url, LokiError, self.timeout, self.max_bytes, **kw
        )
        if not 200 <= status < 300:
            text = body.decode("utf-8", "replace")
            raise LokiError(text.strip()[:300], http.redact(url), status, text, headers)
        return body

    def push(self, entries: Sequence[Entry]) -> None:
        """One push of `entries`; LokiError unless Loki took it (2xx)."""
        headers = {**self.headers, "Content-Type": "application/json", "Content-Encoding": "gzip"}
        self._send("POST", PUSH, data=push_body(entries), headers=headers)

    def query_range(
        self,
        query: str,
        start: float | None = None,
        end: float | None = None,
        limit: int = 100,
        direction: str = "backward",
    ) -> list[LogLine]:
        """Lines matching a LogQL log query (e.g. `{source="job", job_id="42"} |= "NCCL"`),
        newest first by default, at most `limit`. `start`/`end` are unix seconds (default: the
        last hour)."""
        if direction not in ("backward", "forward"):
            raise ValueError("direction is 'backward' or 'forward'")
        end = time.time() if end is None else end
        start = end - 3600 if start is None else start
        params = {
            "query": query,
            "start": str(int(start * 1e9)),
            "end": str(int(end * 1e9)),
            "limit": str(int(limit)),
            "direction": direction,
        }
        body = self._send("GET", QUERY_RANGE, params=params, headers=self.headers)
        where = http.redact(self.url + QUERY_RANGE)
        try:
            got = parse_streams(orjson.loads(body))
        except orjson.JSONDecodeError as exc:
            raise LokiError(f"answer is not JSON: {exc}", where, 200) from None
        except ValueError as exc:
            raise LokiError(str(exc), where, 200) from None
        out = [LogLine(ts, labels, line) for labels, ts, line in got]
        out.sort(key=lambda e: e.ts_ns, reverse=direction == "backward")
        return out[:limit]

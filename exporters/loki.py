"""Ship log lines to Loki's HTTP push API, and read them back with `query_range`.

`LokiShipper` never blocks its caller: `push()` / `on_lines()` append to a bounded queue
(when full the oldest lines are dropped and counted); a sender thread batches lines (by count,
bytes and time), groups them into streams by labels, gzips the JSON body and POSTs it to
`/loki/api/v1/push`. 2xx is success (Loki answers 204). 429, 5xx and connection errors are
retried with exponential backoff and jitter, then the batch is dropped and counted. 400 means
Loki refused some entries (too old, bad labels) but stored the good ones: the batch is not
resent (no loop) and the refusal is counted and logged. Other 4xx drop the batch.

Labels: `job_id`, `node`, `rank`, `stream` (`stdout` for Slurm job output, `kernel` for
kernel logs); a label without a valid value is left out. `on_lines(kind, key, lines)` is the
log-metrics exporter's hook. Tested against a local server that implements Loki's documented
request and response shapes (no Loki server could be installed here).
"""

from __future__ import annotations

import gzip
import json
import logging
import random
import re
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import requests
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from catalogue import names

log = logging.getLogger(__name__)
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
JOB_ID = names.JOB_ID
NODE = names.NODE
RANK_HINTS = (  # where a job line says which rank wrote it (the catalogue's rank_hints, simplified)
    re.compile(r"^\[rank(\d+)\]"),
    re.compile(r"^\s{0,4}(\d{1,5}): "),
)


class LokiError(RuntimeError):
    """Loki refused a request or answered something unreadable."""


@dataclass
class ShipperStats:
    sent_lines: int = 0
    dropped_lines: int = 0  # queue full: oldest dropped
    failed_lines: int = 0  # retries exhausted or refused batch
    rejected_batches: int = 0  # 400: Loki kept what it could
    retries: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # status code or "connection" -> n


def _labels(kind: str, key: str, line: str) -> dict[str, str]:
    if kind == "kernel":
        return {"node": key, "stream": "kernel"} if NODE.match(key) else {"stream": "kernel"}
    labels = {"job_id": key, "stream": "stdout"} if JOB_ID.match(key) else {"stream": "stdout"}
    for rx in RANK_HINTS:
        m = rx.search(line)
        if m:
            labels["rank"] = m.group(1)
            break
    return labels


class LokiShipper(Collector):
    """Batching, retrying, non-blocking Loki client. `start()`, then `push()`, then `close()`."""

    def __init__(
        self,
        url: str,
        static_labels: dict[str, str] | None = None,
        queue_max: int = 100_000,
        batch_max_lines: int = 2000,
        batch_max_bytes: int = 1 << 20,
        flush_interval: float = 1.0,
        max_retries: int = 5,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        timeout: float = 10.0,
        tenant: str | None = None,
        session: requests.Session | None = None,
    ) -> None:
        self.url = url.rstrip("/") + "/loki/api/v1/push"
        self.static_labels = dict(static_labels or {})
        for name in self.static_labels:
            if not LABEL_NAME.match(name):
                raise ValueError(f"invalid Loki label name {name!r}")
        self.batch_max_lines = batch_max_lines
        self.batch_max_bytes = batch_max_bytes
        self.flush_interval = flush_interval
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        if tenant:
            self.headers["X-Scope-OrgID"] = tenant
        self.session = session or requests.Session()
        self.stats = ShipperStats()
        self._queue: deque[tuple[int, str, str, str]] = deque()  # (ts_ns, kind, key, line)
        self._queue_max = queue_max
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ producer side
    def push(self, kind: str, key: str, line: str, ts_ns: int | None = None) -> None:
        """Queue one line (kind "job" with key = job id, or "kernel" with key = node)."""
        self._enqueue([(ts_ns or time.time_ns(), kind, key, line)])

    def on_lines(self, kind: str, key: str, lines: list[str]) -> None:
        """The log-metrics exporter's hook: queue a batch of lines read just now."""
        now = time.time_ns()
        self._enqueue([(now + i, kind, key, line) for i, line in enumerate(lines)])

    def _enqueue(self, items: list[tuple[int, str, str, str]]) -> None:
        with self._lock:
            self._queue.extend(items)
            over = len(self._queue) - self._queue_max
            for _ in range(max(0, over)):
                self._queue.popleft()
            if over > 0:
                self.stats.dropped_lines += over
            full = len(self._queue) >= self.batch_max_lines
        if full:
            self._wake.set()

    # ------------------------------------------------------------------ sender side
    def start(self) -> LokiShipper:
        self._thread = threading.Thread(target=self._run, name="loki-shipper", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Send what is queued (within `timeout`), then stop the sender."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            while True:
                batch = self._take()
                if not batch:
                    break
                self.send(batch)
                if not self._stop.is_set() and len(batch) < self.batch_max_lines:
                    break
            if self._stop.is_set() and not self._queue:
                return

    def _take(self) -> list[tuple[int, str, str, str]]:
        batch: list[tuple[int, str, str, str]] = []
        size = 0
        with self._lock:
            while self._queue and len(batch) < self.batch_max_lines:
                item = self._queue[0]
                size += len(item[3]) + 64
                if batch and size > self.batch_max_bytes:
                    break
                batch.append(self._queue.popleft())
        return batch

    def body(self, batch: list[tuple[int, str, str, str]]) -> bytes:
        streams: dict[tuple[tuple[str, str], ...], list[list[str]]] = {}
        for ts, kind, key, line in batch:
            labels = {**self.static_labels, **_labels(kind, key, line)}
            streams.setdefault(tuple(sorted(labels.items())), []).append([str(ts), line])
        payload = {
            "streams": [
                {"stream": dict(k), "values": sorted(v, key=lambda e: int(e[0]))}
                for k, v in streams.items()
            ]
        }
        return gzip.compress(json.dumps(payload).encode(), compresslevel=5)

    def send(self, batch: list[tuple[int, str, str, str]]) -> bool:
        """POST one batch with retries; True when Loki took it (fully or, on 400, partly)."""
        data = self.body(batch)
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.stats.retries += 1
                delay = min(self.backoff_max, self.backoff_base * 2 ** (attempt - 1))
                # while shutting down the wait returns at once: close() bounds the time
                self._stop.wait(delay * (0.5 + random.random() / 2))
            try:
                r = self.session.post(
                    self.url, data=data, headers=self.headers, timeout=self.timeout
                )
            except requests.RequestException as exc:
                self._error("connection", str(exc))
                continue
            if 200 <= r.status_code < 300:
                self.stats.sent_lines += len(batch)
                return True
            self._error(str(r.status_code), r.text)
            if r.status_code == 400:  # partial accept: the good entries are stored
                self.stats.rejected_batches += 1
                return True
            if r.status_code != 429 and r.status_code < 500:
                break
        self.stats.failed_lines += len(batch)
        return False

    def _error(self, code: str, text: str) -> None:
        self.stats.errors[code] = self.stats.errors.get(code, 0) + 1
        log.warning("Loki push: %s: %s", code, text.strip()[:300])

    def collect(self) -> Iterator:
        s = self.stats
        lines = CounterMetricFamily(
            "goodput_loki_lines", "Log lines by outcome of the push.", labels=["result"]
        )
        lines.add_metric(["sent"], s.sent_lines)
        lines.add_metric(["dropped_queue_full"], s.dropped_lines)
        lines.add_metric(["failed"], s.failed_lines)
        errors = CounterMetricFamily(
            "goodput_loki_push_errors", "Failed pushes by status code.", labels=["code"]
        )
        for code, n in sorted(s.errors.items()):
            errors.add_metric([code], n)
        queued = GaugeMetricFamily("goodput_loki_queue_lines", "Lines waiting to be pushed.")
        queued.add_metric([], len(self._queue))
        yield from (lines, errors, queued)


# ---------------------------------------------------------------------- reading back


@dataclass(frozen=True)
class LogLine:
    ts_ns: int
    labels: dict[str, str]
    line: str


def query_range(
    url: str,
    query: str,
    start: float | None = None,
    end: float | None = None,
    limit: int = 100,
    direction: str = "backward",
    timeout: float = 10.0,
    session: requests.Session | None = None,
    tenant: str | None = None,
) -> list[LogLine]:
    """Lines matching a LogQL log query (e.g. `{job_id="42"} |= "NCCL"`), newest first by
    default. `start`/`end` are unix seconds (default: the last hour)."""
    if direction not in ("backward", "forward"):
        raise ValueError("direction is 'backward' or 'forward'")
    end = time.time() if end is None else end
    start = end - 3600 if start is None else start
    params: dict[str, Any] = {
        "query": query,
        "start": str(int(start * 1e9)),
        "end": str(int(end * 1e9)),
        "limit": int(limit),
        "direction": direction,
    }
    headers = {"X-Scope-OrgID": tenant} if tenant else {}
    http = session or requests
    try:
        r = http.get(
            url.rstrip("/") + "/loki/api/v1/query_range",
            params=params,
            headers=headers,
            timeout=timeout,
        )
    except requests.RequestException as exc:
        raise LokiError(f"Loki unreachable: {exc}") from None
    if r.status_code != 200:
        raise LokiError(f"Loki query failed ({r.status_code}): {r.text.strip()[:300]}")
    try:
        data = r.json()["data"]
        if data["resultType"] != "streams":
            raise LokiError(f"not a log query (result type {data['resultType']!r})")
        out = [
            LogLine(int(ts), dict(s["stream"]), str(line))
            for s in data["result"]
            for ts, line in s["values"]
        ]
    except (ValueError, KeyError, TypeError) as exc:
        raise LokiError(f"unreadable Loki answer: {exc}") from None
    out.sort(key=lambda e: e.ts_ns, reverse=direction == "backward")
    return out[:limit]

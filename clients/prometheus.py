"""The Prometheus HTTP API client: instant and range queries, for Prometheus and
VictoriaMetrics (the same API). Queries are POSTed (selectors can be long), answers read within
the timeout and size bound of `clients.http`, decoded with orjson and checked; every failure is a
`PromError` naming the URL and the status. `column` reads one label and the values of a vector
straight into a list and a float64 array, for the large per-GPU answers: msgspec decodes such an
answer into typed records with the values already floats (one pass in C, where orjson's objects
and two more passes over them cost twice as long), and an answer it refuses (an error, a damaged
series, a `+Inf`) is read the orjson way, so errors read the same on both paths.

Expressions come built and quoted (`catalogue.promql`): the client puts nothing into PromQL.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from itertools import islice
from typing import Any, TypeVar

import msgspec
import numpy as np
import orjson
import requests

from clients import http

MAX_POINTS = 10_000  # per series per range request (Prometheus refuses more than 11,000)
IDENTITY = {"Accept-Encoding": "identity"}  # loopback/LAN: gzip costs more CPU than it saves

Points = list[tuple[float, float]]
Column = tuple[list[Any], np.ndarray]
T = TypeVar("T")


class PromError(http.ClientError):
    """Prometheus unreachable, or it answered an error or something that is not an answer."""

    SERVICE = "Prometheus"


def decode(body: bytes, status: int = 200, url: str = "", want: str = "vector") -> list[Any]:
    """The `result` list of an answer of type `want` (vector, matrix); PromError otherwise,
    with Prometheus' `errorType: error` when it gave one."""
    try:
        doc: Any = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        text = body[:200].decode("utf-8", "replace").strip()
        reason = text if status != 200 and text else f"answer is not JSON: {exc}"
        raise PromError(reason, url, status) from exc
    if not isinstance(doc, dict) or doc.get("status") not in ("success", "error"):
        raise PromError("answer is not a Prometheus API answer", url, status)
    if status != 200 or doc["status"] != "success":
        kind = doc.get("errorType") or "error"
        raise PromError(f"{kind}: {str(doc.get('error'))[:300]}", url, status)
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") != want:
        got = data.get("resultType") if isinstance(data, dict) else type(data).__name__
        raise PromError(f"expected a {want}, got {got}", url, status)
    result = data.get("result")
    if not isinstance(result, list):
        raise PromError(f"{want} result is not a list", url, status)
    return result


def column(result: list[dict[str, Any]], label: str) -> tuple[list[Any], np.ndarray]:
    """(value of `label` per series, float64 sample values). A malformed series gets label
    "" and NaN; a label value may still be any JSON value: callers check the distinct ones."""
    try:
        keys = [s["metric"].get(label, "") for s in result]
        return keys, np.array([s["value"][1] for s in result], dtype=np.float64)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        pass
    keys, out = [], np.full(len(result), np.nan)  # slow path, only for a damaged answer
    for i, s in enumerate(result):
        try:
            k = s["metric"].get(label, "")
            out[i] = float(s["value"][1])
            keys.append(k)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            keys.append("")
    return keys, out


@lru_cache(maxsize=8)
def _column_decoder(label: str) -> msgspec.json.Decoder[Any]:
    """A vector answer as typed records keeping only `label` ("" when absent) and the sample;
    `strict=False` reads Prometheus' quoted values ("0.5", "NaN", "-Inf") as floats."""
    metric = msgspec.defstruct("Metric", [("key", str, "")], rename={"key": label}, gc=False)
    sample = msgspec.defstruct(
        "Sample", [("metric", metric), ("value", tuple[float, float])], gc=False
    )
    records: Any = list[sample]  # type: ignore[valid-type]
    data = msgspec.defstruct("Data", [("resultType", str), ("result", records)])
    return msgspec.json.Decoder(
        msgspec.defstruct("Answer", [("status", str), ("data", data)]), strict=False
    )


def decode_column(body: bytes, label: str, status: int = 200, url: str = "") -> Column:
    """`column(decode(body), label)`, decoded straight into typed records where it can be."""
    if status == 200:
        try:
            doc = _column_decoder(label).decode(body)
        except (msgspec.ValidationError, msgspec.DecodeError):
            doc = None
        if doc is not None and doc.status == "success" and doc.data.resultType == "vector":
            result = doc.data.result
            keys = [s.metric.key for s in result]
            return keys, np.fromiter((s.value[1] for s in result), np.float64, len(result))
    return column(decode(body, status, url, "vector"), label)


def samples(result: list[Any]) -> list[tuple[dict[str, str], float]]:
    """A vector's `result` as [(labels, value)] (malformed samples skipped): `query`'s answer
    from a `raw` one."""
    out = []
    for s in result:
        labels, pts = _labels(s), _points([s.get("value")])
        if labels is not None and pts:
            out.append((labels, pts[0][1]))
    return out


def _labels(series: Any) -> dict[str, str] | None:
    metric = series.get("metric") if isinstance(series, dict) else None
    return {str(k): str(v) for k, v in metric.items()} if isinstance(metric, dict) else None


def _points(values: Any) -> Points:
    out: Points = []
    for p in values if isinstance(values, list) else ():
        try:
            out.append((float(p[0]), float(p[1])))
        except (TypeError, ValueError, IndexError):
            continue
    return out


class PromClient:
    """`PromClient(url)`: `query`/`raw` (instant), `query_range`; `with` closes it."""

    def __init__(
        self,
        url: str,
        timeout: float = 10.0,
        parallel: int = 4,
        max_bytes: int = http.MAX_BYTES,
        session: requests.Session | None = None,
    ) -> None:
        self.url = http.check_url(url, "Prometheus")
        self.timeout, self.parallel, self.max_bytes = timeout, parallel, max_bytes
        self.session = session if session is not None else requests.Session()
        self._pool: ThreadPoolExecutor | None = None

    def __enter__(self) -> PromClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        self.session.close()

    def _post(self, path: str, form: dict[str, str]) -> tuple[int, bytes, str]:
        url = self.url + path
        status, body, _ = http.request(
            self.session, "POST", url, PromError, self.timeout, self.max_bytes,
            data=form, headers=IDENTITY,
        )  # fmt: skip
        return status, body, http.redact(url)

    @staticmethod
    def _instant(expr: str, at: float | None) -> dict[str, str]:
        return {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}

    def raw(self, expr: str, at: float | None = None, want: str = "vector") -> list[Any]:
        """Instant query at `at` (unix seconds; default now): the `result` list."""
        status, body, url = self._post("/api/v1/query", self._instant(expr, at))
        return decode(body, status, url, want)

    def column(self, expr: str, label: str, at: float | None = None) -> Column:
        """Instant vector query read as `column` of `label`: (label values, float64 values)."""
        status, body, url = self._post("/api/v1/query", self._instant(expr, at))
        return decode_column(body, label, status, url)

    def many(self, calls: list[Callable[[], T]]) -> Iterator[T]:
        """Each call's answer, in order, `parallel` in flight at once: Prometheus evaluates
        and sends the next answers while this process decodes one. The next call starts only
        when an answer is taken, so at most `parallel` + 1 decoded answers are alive at a
        time: with every query submitted up front (`Executor.map`) a cycle's answers were all
        held at once, and at 10,000 GPUs a fetch took ~3x the page faults (fresh memory for
        each answer; the CPU time moved less than the machine's noise)."""
        if self.parallel <= 1 or len(calls) <= 1:
            return (call() for call in calls)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.parallel, thread_name_prefix="promclient")
        return self._window(self._pool, calls)

    def _window(self, pool: ThreadPoolExecutor, calls: list[Callable[[], T]]) -> Iterator[T]:
        todo = iter(calls)
        ahead = deque(pool.submit(c) for c in islice(todo, self.parallel))
        try:
            while ahead:
                done = ahead.popleft()
                for c in islice(todo, 1):
                    ahead.append(pool.submit(c))
                yield done.result()
        finally:  # abandoned (an answer failed): the queries not yet sent are not sent
            for f in ahead:
                f.cancel()

    def query(self, expr: str, at: float | None = None) -> list[tuple[dict[str, str], float]]:
        """Instant vector: [(labels, value)] (for small answers; malformed samples skipped)."""
        return samples(self.raw(expr, at))

    def query_range(
        self, expr: str, start: float, end: float, step: float
    ) -> list[tuple[dict[str, str], Points]]:
        """[(labels, [(t, v)])] on the grid start, start+step, ... <= end; a range of more than
        MAX_POINTS steps is asked in parts and each series' parts joined, in time order."""
        if not (math.isfinite(start) and math.isfinite(end) and start <= end):
            raise ValueError(f"range query needs finite start <= end, not {start!r}..{end!r}")
        if not (math.isfinite(step) and step > 0):
            raise ValueError(f"range query needs a step > 0, not {step!r}")
        merged: dict[tuple[tuple[str, str], ...], tuple[dict[str, str], Points]] = {}
        t = start
        while t <= end:
            stop = min(end, t + step * MAX_POINTS)
            form = {"query": expr, "start": f"{t:.3f}", "end": f"{stop:.3f}", "step": f"{step:g}"}
            status, body, url = self._post("/api/v1/query_range", form)
            for s in decode(body, status, url, "matrix"):
                labels = _labels(s)
                if labels is None:
                    continue
                got = merged.setdefault(tuple(sorted(labels.items())), (labels, []))[1]
                last = got[-1][0] if got else -math.inf  # a TSDB that aligns to the step
                got.extend(p for p in _points(s.get("values")) if p[0] > last)  # repeats a seam
            t = stop + step
        return list(merged.values())

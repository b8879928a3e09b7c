"""A small Prometheus HTTP API client (instant queries) with validated answers.

Answers are decoded with orjson; `column` reads one label and the values of a vector straight
into a list and a float64 array, for the large per-GPU answers (no per-series dicts kept).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import orjson
import requests


class PromError(RuntimeError):
    """Prometheus unreachable or answered with an error."""


def decode(body: bytes, status: int = 200) -> list[dict[str, Any]]:
    """The `result` list of an instant-vector answer; PromError for anything else."""
    try:
        doc: Any = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise PromError(f"answer is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise PromError("answer is not a JSON object")
    if status != 200 or doc.get("status") != "success":
        raise PromError(f"Prometheus said {status}: {str(doc.get('error'))[:200]}")
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        got = data.get("resultType") if isinstance(data, dict) else type(data).__name__
        raise PromError(f"expected a vector, got {got}")
    result = data.get("result")
    if not isinstance(result, list):
        raise PromError("vector result is not a list")
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


class PromClient:
    def __init__(self, url: str, timeout: float = 10.0, parallel: int = 4) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        self.parallel = parallel
        self._pool: ThreadPoolExecutor | None = None

    def raw_many(self, exprs: list[str]) -> Iterator[list[dict[str, Any]]]:
        """`raw` of each expression, in order, `parallel` in flight at once: Prometheus
        evaluates and sends the next answers while this process decodes one."""
        if self.parallel <= 1 or len(exprs) <= 1:
            return map(self.raw, exprs)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.parallel, thread_name_prefix="promclient")
        return self._pool.map(self.raw, exprs)

    def raw(self, expr: str) -> list[dict[str, Any]]:
        """Instant query (POSTed: selectors can be long), decoded: the `result` list."""
        try:
            with self.session.post(
                f"{self.url}/api/v1/query",
                data={"query": expr},
                timeout=self.timeout,
                headers={"Accept-Encoding": "identity"},  # loopback/LAN: gzip costs more CPU
                stream=True,
            ) as r:
                body, status = r.raw.read(decode_content=True), r.status_code
        except requests.RequestException as exc:
            raise PromError(f"query failed: {exc}") from exc
        return decode(body, status)

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """Instant vector: [(labels, value)] (for small answers)."""
        out = []
        for s in self.raw(expr):
            try:
                out.append((dict(s["metric"]), float(s["value"][1])))
            except (KeyError, IndexError, TypeError, ValueError):
                continue
        return out

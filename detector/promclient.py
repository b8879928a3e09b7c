"""A small Prometheus HTTP API client (instant queries) with validated answers."""

from __future__ import annotations

from typing import Any

import requests


class PromError(RuntimeError):
    """Prometheus unreachable or answered with an error."""


class PromClient:
    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """Instant vector: [(labels, value)]."""
        try:
            r = self.session.get(
                f"{self.url}/api/v1/query", params={"query": expr}, timeout=self.timeout
            )
            doc: Any = r.json()
        except (requests.RequestException, ValueError) as exc:
            raise PromError(f"query failed: {exc}") from exc
        if r.status_code != 200 or doc.get("status") != "success":
            raise PromError(f"Prometheus said {r.status_code}: {str(doc.get('error'))[:200]}")
        data = doc.get("data", {})
        if data.get("resultType") != "vector":
            raise PromError(f"expected a vector, got {data.get('resultType')}")
        out = []
        for s in data.get("result", []):
            try:
                out.append((dict(s["metric"]), float(s["value"][1])))
            except (KeyError, IndexError, TypeError, ValueError):
                continue
        return out

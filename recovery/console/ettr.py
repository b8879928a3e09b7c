"""The effective training time ratio for the console: the recording rules, read from
Prometheus with fixed queries (nothing from a request reaches them), bounded and validated."""

from __future__ import annotations

import math
from typing import Any

import requests

CLUSTER = "goodput:cluster_ettr:1h"
JOBS = "bottomk(50, goodput:job_ettr:1h)"  # the 50 jobs that lost the most
LOST = "sum by (cause) (increase(goodput_gpu_seconds_lost_total[1h]))"
TIMEOUT_S = 2.0


def _query(base: str, expr: str) -> list[tuple[dict[str, str], float]]:
    resp = requests.get(
        f"{base.rstrip('/')}/api/v1/query", params={"query": expr}, timeout=TIMEOUT_S
    )
    resp.raise_for_status()
    out = []
    for r in resp.json()["data"]["result"]:
        v = float(r["value"][1])
        if math.isfinite(v):
            out.append(({str(k): str(x)[:128] for k, x in r.get("metric", {}).items()}, v))
    return out


def read(prometheus_url: str | None) -> dict[str, Any]:
    """{cluster: ratio or None, jobs: [{job_id, ettr}] worst first, lost: {cause: GPU-s}, note}."""
    out: dict[str, Any] = {"cluster": None, "jobs": [], "lost": {}, "note": ""}
    if not prometheus_url:
        out["note"] = "Prometheus is not configured (GOODPUT_PROMETHEUS_URL)"
        return out
    try:
        cluster = _query(prometheus_url, CLUSTER)
        jobs = _query(prometheus_url, JOBS)
        lost = _query(prometheus_url, LOST)
    except (requests.RequestException, ValueError, KeyError, TypeError, IndexError) as exc:
        out["note"] = f"Prometheus did not answer ({type(exc).__name__})"
        return out
    out["cluster"] = cluster[0][1] if cluster else None
    out["jobs"] = sorted(
        ({"job_id": m.get("job_id", "?"), "ettr": v} for m, v in jobs), key=lambda j: j["ettr"]
    )
    out["lost"] = {m.get("cause", "?"): v for m, v in lost}
    if cluster == [] and not jobs:
        out["note"] = "no ETTR yet: the recording rules have no running jobs in the last hour"
    return out

"""The effective training time ratio for the console: the recording rules, read from
Prometheus with fixed queries (nothing from a request reaches them), bounded and validated."""

from __future__ import annotations

import math
from typing import Any

from clients.prometheus import PromClient, PromError

CLUSTER = "goodput:cluster_ettr:1h"
JOBS = "bottomk(50, goodput:job_ettr:1h)"  # the 50 jobs that lost the most
LOST = "goodput:gpu_seconds_lost:1h"  # by cause, counted once across receivers in HA
TIMEOUT_S = 2.0


def read(prometheus_url: str | None) -> dict[str, Any]:
    """{cluster: ratio or None, jobs: [{job_id, ettr}] worst first, lost: {cause: GPU-s}, note}."""
    out: dict[str, Any] = {"cluster": None, "jobs": [], "lost": {}, "note": ""}
    if not prometheus_url:
        out["note"] = "Prometheus is not configured (GOODPUT_PROMETHEUS_URL)"
        return out
    try:
        with PromClient(prometheus_url, timeout=TIMEOUT_S, parallel=1) as prom:
            cluster, jobs, lost = (prom.query(e) for e in (CLUSTER, JOBS, LOST))
    except (PromError, ValueError) as exc:
        out["note"] = f"Prometheus did not answer ({type(exc).__name__}: {str(exc)[:200]})"
        return out
    out["cluster"] = cluster[0][1] if cluster and math.isfinite(cluster[0][1]) else None
    out["jobs"] = sorted(
        ({"job_id": m.get("job_id", "?")[:128], "ettr": v} for m, v in jobs if math.isfinite(v)),
        key=lambda j: j["ettr"],
    )
    out["lost"] = {m.get("cause", "?")[:64]: v for m, v in lost if math.isfinite(v)}
    if cluster == [] and not jobs:
        out["note"] = "no ETTR yet: the recording rules have no running jobs in the last hour"
    return out

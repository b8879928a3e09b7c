"""Whether each evidence source answers now (short, parallel probes) and the node states."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

from recovery.settings import Settings

PROBE_TIMEOUT_S = 2.0


def _http(url: str) -> tuple[str, str]:
    try:
        r = requests.get(url, timeout=PROBE_TIMEOUT_S)
    except requests.RequestException as exc:
        return "error", type(exc).__name__
    return ("ok", f"HTTP {r.status_code}") if r.ok else ("error", f"HTTP {r.status_code}")


def _logs(settings: Settings) -> tuple[str, str]:
    if not settings.log_dir:
        return "off", "GOODPUT_LOG_DIR is not set"
    d = Path(settings.log_dir)
    if not d.is_dir() or not os.access(d, os.R_OK | os.X_OK):
        return "error", "log directory is missing or unreadable"
    jobs = d / "jobs"
    n = sum(1 for _ in jobs.glob("slurm-*.out")) if jobs.is_dir() else 0
    return "ok", f"{n} job log files"


def _scheduler(sched: Any) -> tuple[str, str, list[Any]]:
    try:
        nodes = list(sched.node_states())
    except Exception as exc:  # noqa: BLE001 - reported, never raised
        return "error", f"{type(exc).__name__}: {str(exc)[:200]}", []
    return "ok", f"{len(nodes)} nodes", nodes


def probe(settings: Settings, sched: Any | None) -> tuple[list[dict[str, Any]], list[Any]]:
    """[{source, status (ok|error|off), detail, latency_s}], and the scheduler's node states."""
    jobs: dict[str, Callable[[], tuple[Any, ...]]] = {}
    prom, loki = settings.prometheus_url, settings.loki_url
    if prom:
        jobs["prometheus"] = lambda: _http(f"{prom.rstrip('/')}/-/ready")
    jobs["logs"] = lambda: _logs(settings)
    if loki:
        jobs["loki"] = lambda: _http(f"{loki.rstrip('/')}/ready")
    if sched is not None:
        jobs["scheduler"] = lambda: _scheduler(sched)

    def timed(fn: Callable[[], tuple[Any, ...]]) -> tuple[tuple[Any, ...], float]:
        t0 = time.monotonic()
        return fn(), time.monotonic() - t0

    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {k: pool.submit(timed, fn) for k, fn in jobs.items()}
        results = {k: f.result() for k, f in futures.items()}
    rows: list[dict[str, Any]] = []
    nodes: list[Any] = []
    for source in ("prometheus", "logs", "loki", "scheduler"):
        if source not in results:
            rows.append(
                {"source": source, "status": "off", "detail": "not configured", "latency_s": None}
            )
            continue
        out, latency = results[source]
        if source == "scheduler":
            nodes = out[2]
        rows.append(
            {"source": source, "status": out[0], "detail": out[1], "latency_s": round(latency, 3)}
        )
    return rows, nodes

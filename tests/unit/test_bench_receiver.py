"""The fault benchmark measures the receiver itself: break a rule in `recovery/` and the
benchmark's numbers move (a copy of the receiver in `bench/` would not notice)."""

from __future__ import annotations

from typing import Any

import pytest

from bench import faults as B
from bench.faults_plan import plan
from recovery import executor, ingest_rows

pytestmark = pytest.mark.filterwarnings("ignore")


def _xid79() -> dict[str, Any]:
    spec = next(r for r in plan(pattern="xid79-off-bus", seeds=1) if not r.healthy)
    (fault,) = B.run_one(spec)["faults"]
    return fault


def test_the_benchmark_runs_the_receivers_settle_and_executor(monkeypatch) -> None:
    base = _xid79()
    assert base["action"] == "drain_and_requeue" and base["result"] == "executed"
    assert base["time_to_recover_s"] is not None and base["time_to_recover_s"] < 120

    # the receiver's settle (recovery.incidents): diagnose 60 s after an alert, not settle_s
    links = ingest_rows.Links
    add = links.add
    monkeypatch.setattr(
        links,
        "add",
        lambda self, inc, alert, now, settle, starts: add(self, inc, alert, now, 60.0, starts),
    )
    late = _xid79()
    assert late["latency_s"] == base["latency_s"]  # detection is not the receiver's
    assert late["time_to_recover_s"] >= base["time_to_recover_s"] + 50
    monkeypatch.undo()

    # the executor (recovery.executor.execute): a drain_and_requeue that no longer requeues
    monkeypatch.setattr(executor, "RESTARTS", ("requeue",))
    broken = _xid79()
    assert broken["action"] == "drain_and_requeue" and broken["result"] == "executed"
    assert broken["time_to_recover_s"] is None  # drained, never requeued: the job stays down
    assert broken["gpu_hours_lost"] > base["gpu_hours_lost"]


def test_the_benchmarks_receiver_reaches_no_real_service(monkeypatch) -> None:
    """With the local stack's URLs in the environment, the in-process receiver still notifies no
    Alertmanager and queries no Prometheus (a stop notifies on-call in production)."""
    import requests

    monkeypatch.setenv("GOODPUT_ALERTMANAGER_URL", "http://alertmanager.invalid:9093")
    monkeypatch.setenv("GOODPUT_PROMETHEUS_URL", "http://prometheus.invalid:9090")
    calls: list[str] = []

    def record(_session: Any, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(url)
        raise AssertionError(f"the bench's receiver called {method} {url}")

    # every HTTP call of the receiver (notices, the clients package) goes through a Session
    monkeypatch.setattr(requests.Session, "request", record)
    spec = next(r for r in plan(pattern="nan-divergence", seeds=1) if not r.healthy)
    (fault,) = B.run_one(spec)["faults"]
    assert fault["action"] == "stop" and fault["result"] == "executed"
    assert calls == []

"""The receiver's own metrics, on a registry passed in (one per app, so tests read them back)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import Engine, func, select

from recovery.store import incidents


class _IncidentGauge(Collector):
    """`goodput_incidents{state,outcome}`, counted from the store at scrape time."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily(
            "goodput_incidents", "Incidents by state and outcome.", labels=["state", "outcome"]
        )
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    select(incidents.c.state, incidents.c.outcome, func.count()).group_by(
                        incidents.c.state, incidents.c.outcome
                    )
                ).all()
        except Exception:  # noqa: BLE001 - a scrape must not fail because the DB is busy
            rows = []
        for state, outcome, n in rows:
            g.add_metric([state, outcome or "pending"], float(n))
        yield g


class ReceiverMetrics:
    def __init__(self, registry: CollectorRegistry, engine: Engine) -> None:
        self.registry = registry
        self.alerts_received = Counter(
            "goodput_receiver_alerts_received",
            "Alerts received on the webhook, by status (firing, resolved, rejected).",
            ["status"],
            registry=registry,
        )
        self.diagnosis_duration = Histogram(
            "goodput_diagnosis_duration_seconds",
            "Time to collect evidence and attribute one incident.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
            registry=registry,
        )
        self.connector_errors = Counter(
            "goodput_connector_errors",
            "Evidence connector errors, by connector.",
            ["connector"],
            registry=registry,
        )
        self.time_to_detect = Histogram(
            "goodput_incident_time_to_detect_seconds",
            "First alert time minus the diagnosed onset of the fault.",
            buckets=(5, 10, 20, 30, 60, 120, 300, 600, 1800),
            registry=registry,
        )
        registry.register(_IncidentGauge(engine))

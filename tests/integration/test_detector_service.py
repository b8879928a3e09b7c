"""The detector service against the real Prometheus: it queries, and its metrics get scraped."""

from __future__ import annotations

import socket
import threading

from prometheus_client import CollectorRegistry

from detector.baselines import BaselineStore
from detector.service import Service, ServiceConfig
from tests.conftest import wait_until
from tests.helpers import add_scrape_target, prom_query


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_service_scores_are_queryable_in_prometheus(prometheus_url, tmp_path):
    port = _free_port()
    svc = Service(
        ServiceConfig(prometheus_url=prometheus_url, port=port, interval_s=1.0),
        store=BaselineStore(tmp_path),
        registry=CollectorRegistry(),
    )
    thread = threading.Thread(target=svc.serve, daemon=True)
    thread.start()
    target = add_scrape_target(f"detector-{port}", port)
    try:
        wait_until(lambda: svc.scores.last_cycle > 0, 20, what="a successful cycle")
        assert svc.scores.errors == 0
        expr = f'goodput_detector_last_cycle_timestamp_seconds{{test="detector-{port}"}}'
        wait_until(lambda: prom_query(prometheus_url, expr), 30, what=expr)
        # GPU scores appear when the simulator feeds DCGM metrics with running jobs
        if svc.scores.series:
            sexpr = f'goodput_job_anomaly_score{{test="detector-{port}",detector="combined"}}'
            wait_until(lambda: prom_query(prometheus_url, sexpr), 30, what=sexpr)
    finally:
        svc.stop.set()
        target.unlink(missing_ok=True)

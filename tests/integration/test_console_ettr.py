"""The console's ETTR on the real local Prometheus: the page shows what the recording rules say."""

from __future__ import annotations

import dataclasses
import re
import threading
import uuid
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from exporters.slurm_exporter import serve
from recovery.app import create_app
from tests.conftest import wait_until
from tests.helpers import add_scrape_target, prom_query, slurm
from tests.integration.test_exporters_slurm import _free_port
from tests.unit.test_console_pages import TOKEN, ConsoleSettings


@pytest.fixture
def a_running_job(prometheus_url) -> Iterator[str]:
    """A real 1-GPU Slurm job, seen by a Slurm exporter the stack's Prometheus scrapes, so the
    ETTR rules have GPU-time to count whatever ran before this test."""
    port, stop, tag = _free_port(), threading.Event(), uuid.uuid4().hex[:8]
    t = threading.Thread(target=serve, kwargs={"port": port, "interval": 1.0, "stop": stop})
    t.start()
    target = add_scrape_target(f"ettr-{tag}", port)
    job = slurm("sbatch", "--parsable", "-J", f"gp-ettr-{tag}", "-o", "/dev/null", "--gpus=1",
                "--wrap", "sleep 300").strip().split(";")[0]  # fmt: skip
    try:
        wait_until(
            lambda: prom_query(prometheus_url, "goodput:cluster_ettr:1h"),
            timeout=90,
            what="goodput:cluster_ettr:1h has a value",
        )
        yield job
    finally:
        slurm("scancel", job, check=False)
        target.unlink(missing_ok=True)
        stop.set()
        t.join(timeout=10)


def test_the_console_shows_the_clusters_ettr(prometheus_url, a_running_job, tmp_path, monkeypatch):
    monkeypatch.setenv("GOODPUT_ACTIONS_THREAD", "0")
    now = prom_query(prometheus_url, "goodput:cluster_ettr:1h")
    (tmp_path / "token").write_text(TOKEN)
    settings = ConsoleSettings(
        db_url=f"sqlite:///{tmp_path / 'c.db'}",
        token_file=str(tmp_path / "token"),
        slurm_enabled=False,
    )
    app = create_app(dataclasses.replace(settings, prometheus_url=prometheus_url), False)
    page = TestClient(app).get("/console/nodes", headers={"Authorization": f"Bearer {TOKEN}"})
    assert page.status_code == 200
    shown = float(re.search(r'id="cluster-ettr">([\d.]+) %', page.text).group(1))
    again = float(prom_query(prometheus_url, "goodput:cluster_ettr:1h")[0]["value"][1])
    assert abs(shown - 100 * again) <= 0.1 + 100 * abs(again - float(now[0]["value"][1]))
    jobs = prom_query(prometheus_url, "goodput:job_ettr:1h")
    for j in jobs[:5]:
        assert f'?job={j["metric"]["job_id"]}"' in page.text

"""The console's ETTR on the real local Prometheus: the page shows what the recording rules say."""

from __future__ import annotations

import dataclasses
import re

import pytest
from fastapi.testclient import TestClient

from recovery.app import create_app
from tests.helpers import prom_query
from tests.unit.test_console_pages import TOKEN, ConsoleSettings


def test_the_console_shows_the_clusters_ettr(prometheus_url, tmp_path, monkeypatch):
    monkeypatch.setenv("GOODPUT_ACTIONS_THREAD", "0")
    now = prom_query(prometheus_url, "goodput:cluster_ettr:1h")
    if not now:
        pytest.skip("no running jobs in the last hour: the recording rule has no value")
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

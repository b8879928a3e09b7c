"""Every dashboard query on the real local Prometheus, fed by the simulator: each one parses
(the query API answers success), and each returns series whenever its inputs exist (every raw
metric it reads has series). Also: every Goodput exporter's /metrics passes `promtool check
metrics`. If the simulator is not running, this test starts it for its own duration."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest
import requests

from dashboards import build
from tests.conftest import wait_until
from tests.helpers import prom_query

NAME = re.compile(r"(?:DCGM_(?:FI|EXP)_[A-Z0-9_]+|goodput_[a-z0-9_]+|goodput:[a-z0-9_:]+)")
# Panels that are empty by nature until something happens (a filter on events).
EVENT_ONLY = {"Last XID per GPU"}
# Fed by the simulator alone (its dcgm endpoints and the recording rules over them).
SIM_FED = ("DCGM_", "goodput:dcgm_", "goodput:node_gpus")
# A panel whose inputs exist but that reads a rate over a counter scraped once waits this long
# for the next scrapes (scrape interval 2 s, rate windows 1 m).
SECOND_SCRAPE_S = 30


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def simulator(local_stack, prometheus_url):
    """The simulator feeding Prometheus: the running one, or one started here."""
    proc = None
    if not _port_open(19400):
        proc = subprocess.Popen(
            # a scenario with running jobs, so the job_id variable and per-job panels have data
            [sys.executable, "-m", "goodput.cli", "sim", "serve",
             "--scenario", "scenarios/healthy-short.yaml"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy(),
        )  # fmt: skip
    try:
        wait_until(
            lambda: prom_query(prometheus_url, 'count(up{job="dcgm"} == 1) >= 1'),
            45,
            what="the simulator's dcgm endpoints scraped by Prometheus",
        )
        wait_until(
            lambda: prom_query(prometheus_url, 'goodput:dcgm_gpu_util:by_gpu{job_id!=""}'),
            45,
            what="recording rules over the simulator's metrics, with a job on the GPUs",
        )
        yield
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=15)


def _substitute(expr: str, job_id: str) -> str:
    return expr.replace("$job_id", job_id).replace("$node", ".*").replace("$__rate_interval", "1m")


def _query(prometheus_url: str, expr: str) -> dict:
    r = requests.get(f"{prometheus_url}/api/v1/query", params={"query": expr}, timeout=10)
    return r.json()


def test_every_panel_query_parses_and_returns_data(prometheus_url, simulator):
    jobs = prom_query(prometheus_url, "count by (job_id) (goodput_job_anomaly_score)")
    job_id = jobs[0]["metric"]["job_id"] if jobs else ".*"
    parsed, with_data, skipped = 0, 0, []
    for file, model in build.build_all().items():
        for title, ds, expr in build.queries(model):
            if ds == "loki":
                continue  # no Loki server on this machine (see the local-stack notes)
            e = _substitute(expr, job_id)
            if ds == "prometheus-variable":
                m = re.fullmatch(r"label_values\((.*), *(\w+)\)", e)
                assert m, f"{file}: variable query {expr!r}"
                r = requests.get(
                    f"{prometheus_url}/api/v1/series", params={"match[]": m.group(1)}, timeout=10
                )
                assert r.json()["status"] == "success", (file, title, r.text)
                assert any(m.group(2) in s for s in r.json()["data"]), (file, title)
                parsed += 1
                continue
            answer = _query(prometheus_url, e)
            assert answer["status"] == "success", (file, title, e, answer.get("error"))
            parsed += 1
            if title in EVENT_ONLY or "ALERTS" in e:
                skipped.append(f"{file}: {title} (event-driven)")
                continue
            inputs = {n for n in NAME.findall(e) if not n.endswith("_")}
            absent = [n for n in inputs if not prom_query(prometheus_url, f"count({n})")]
            sim_fed = [n for n in absent if n.startswith(SIM_FED)]
            assert not sim_fed, f"{file}: {title}: the simulator runs, yet no {sim_fed}"
            if absent:
                skipped.append(f"{file}: {title} (no series yet for {', '.join(absent)})")
                continue
            if not answer["data"]["result"]:
                # inputs exist, but rate()/increase() need two samples of a counter: wait for them
                wait_until(
                    lambda e=e: _query(prometheus_url, e)["data"]["result"],
                    SECOND_SCRAPE_S,
                    what=f"{file}: {title}: series for {e}",
                )
            with_data += 1
    print(f"\n[dashboards] {parsed} queries parsed, {with_data} returned data, skipped:")
    for s in skipped:
        print(f"  {s}")
    assert with_data >= 8  # at least the simulator-fed panels


GOODPUT_PORTS = {
    "simulator": 19400,
    "slurm-exporter": 19410,
    "log-exporter": 19411,
    "nvml-exporter": 19412,
    "detector": 19420,
    "receiver": 19430,
    "dcgm-sim-node1": 19501,
}


def test_goodput_exporters_pass_promtool_check_metrics(simulator):
    promtool = shutil.which("promtool")
    assert promtool, "promtool not installed (the local stack installs Debian's prometheus)"
    checked, down = [], []
    for name, port in GOODPUT_PORTS.items():
        try:
            r = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        except requests.RequestException:
            down.append(name)
            continue
        out = subprocess.run(
            [promtool, "check", "metrics"], input=r.text, capture_output=True, text=True,
            timeout=30,
        )  # fmt: skip
        problems = [
            line
            for line in (out.stdout + out.stderr).splitlines()
            # dcgm-exporter's names and labels (UUID, modelName, Hostname; counters without
            # _total, "COUNTER" in a name) are its contract, kept verbatim so that real
            # dcgm-exporter is a drop-in: only Goodput's own names must pass the lint
            if line.strip() and not line.startswith("DCGM_")
        ]
        assert not problems, f"{name} (:{port}): {problems[:5]}"
        checked.append(name)
        time.sleep(0)
    print(f"\n[promtool check metrics] clean: {checked}; not running: {down}")
    assert "dcgm-sim-node1" in checked and "simulator" in checked

"""`goodput sim check NODE`, the local stack's stand-in for `dcgmi diag`: fails while an injected
fault blames the node, passes after the node is repaired, and says so when it cannot ask."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import uvicorn
from typer.testing import CliRunner

from exporters.sim import Simulation, parse_scenario
from exporters.sim.api import build_app
from goodput.commands.sim import app as sim_cli


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def sim_url():
    jobs = [{"name": "a", "nodes": 2, "start_s": 0}]
    sim = Simulation(parse_scenario({"name": "t", "duration_s": 600, "nodes": 4, "jobs": jobs}), 1)
    sim.step(5)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(sim), port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}", sim
    server.should_exit = True
    thread.join(5)


def test_check_fails_while_the_fault_is_active_and_passes_after_repair(sim_url):
    url, sim = sim_url
    import requests

    job = next(iter(sim.cluster.jobs.values()))
    r = requests.post(
        f"{url}/api/v1/faults", json={"kind": "xid79_off_bus", "job": job.name, "gpu": 3}
    )
    assert r.status_code == 201, r.text
    bad = r.json()["nodes"][0]
    cli = CliRunner()
    env = {"GOODPUT_SIM_URL": url}
    failed = cli.invoke(sim_cli, ["check", bad], env=env)
    assert failed.exit_code == 1 and "FAIL xid79_off_bus on GPU [3]" in failed.output
    other = next(n for n in ("node1", "node2", "node3", "node4") if n != bad)
    assert cli.invoke(sim_cli, ["check", other], env=env).exit_code == 0
    requests.post(f"{url}/api/v1/nodes/{bad}/repair").raise_for_status()
    passed = cli.invoke(sim_cli, ["check", bad], env=env)
    assert passed.exit_code == 0 and "PASS" in passed.output


def test_check_without_a_simulator_exits_3():
    out = CliRunner().invoke(
        sim_cli, ["check", "node1"], env={"GOODPUT_SIM_URL": f"http://127.0.0.1:{_free_port()}"}
    )
    assert out.exit_code == 3 and "did not answer" in out.output

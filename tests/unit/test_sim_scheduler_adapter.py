"""The simulated scheduler adapter against the simulator's real control API (in-process)."""

from __future__ import annotations

import warnings

import pytest

from exporters.sim import Simulation, load_scenario
from exporters.sim.api import build_app
from recovery.scheduler.simulated import SimulatedScheduler

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def sched_sim():
    from fastapi.testclient import TestClient

    sim = Simulation(load_scenario("scenarios/healthy-short.yaml"))
    for _ in range(12):
        sim.step(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        client = TestClient(build_app(sim))
    return SimulatedScheduler("http://sim", session=client), sim


def test_drain_and_requeue_excluding_a_node(sched_sim):
    sched, sim = sched_sim
    assert sched.job_state("1001").state == "RUNNING"
    assert sched.drain("node2", "test").changed
    res = sched.requeue("1001", ("node2",), expected_restarts=0)
    assert res.changed, res.detail
    job = sched.job_state("1001")
    assert job.state == "PENDING" and job.restarts == 1 and "node2" in job.excluded
    sim.step(5)
    assert "node2" not in sim.cluster.jobs["1001"].nodes


def test_stop_holds_a_running_job(sched_sim):
    sched, _ = sched_sim
    assert sched.stop("1001").changed
    job = sched.job_state("1001")
    assert job.held and job.state == "PENDING"


def test_requeue_with_backoff_starts_the_job_only_after_the_delay(sched_sim):
    sched, sim = sched_sim
    res = sched.requeue("1001", (), expected_restarts=0, delay_s=20)
    assert res.changed, res.detail
    sim.step(5)
    assert sim.cluster.jobs["1001"].state == "PENDING"
    for _ in range(4):
        sim.step(5)
    assert sim.cluster.jobs["1001"].state == "RUNNING"

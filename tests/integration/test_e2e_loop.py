"""The whole loop on the real stack, reduced: one GPU falls off the bus in act mode.

Simulator (real time, real Slurm jobs) → Prometheus → alert rule → Alertmanager → receiver →
diagnosis → drain + requeue excluding the node in real Slurm → the job runs again elsewhere →
the node's health check fails, the GPU is replaced, the check passes → the node is resumed.
"""

from __future__ import annotations

import pytest

from bench import e2e
from goodput import demo, demo_clients, stack
from tests.helpers import forget_faults


@pytest.fixture()
def loop(local_stack):
    slurm = demo_clients.Slurm(local_stack)
    yield slurm
    slurm.cancel_demo_jobs()
    demo.stop_services()
    slurm.resume_drained()
    forget_faults(local_stack["GOODPUT_PROMETHEUS_URL"], local_stack["GOODPUT_LOG_DIR"])


def test_gpu_off_the_bus_is_drained_and_the_job_restarts_elsewhere(loop):
    said: list[str] = []
    report = e2e.run(said.append, faults=demo.FAULTS[:1], out=None, warmup_s=15)
    row = report["faults"][0]
    assert row["outcome"] == "gpu_hardware_fault", said
    assert row["culprits"] == [row["node"]], said
    assert row["handled"], said
    assert row["to_alert_s"] is not None and row["to_alert_s"] < 60
    assert loop.running_on(row["job_id"], 1) not in (None, row["node"])
    # the drained node failed its check while the GPU was broken, passed it after the repair
    assert any("health check [bold]failed[/]" in s for s in said), said
    assert row["to_node_back_s"] is not None, said
    assert loop.reason(row["node"]) == ""  # resumed by Goodput after the passed check
    assert stack.stack_env()  # the stack kept running for the other tests

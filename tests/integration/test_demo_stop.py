"""`goodput demo stop --keep-stack` on the real stack: what a demo leaves behind (its act-mode
services, its jobs, its drains and Prolog holds, its fault series and logs) is undone, and the
shared stack keeps running. Without it a finished demo's receiver went on acting on other
people's jobs (it drained a node for another test's job) and `make demo-stop` stopped the stack."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from goodput import demo, demo_clients, stack
from recovery import slurm_hooks
from tests.conftest import wait_until
from tests.helpers import forget_faults, prom_query, slurm

NODE = "node4"
SERIES = 'count(count_over_time(DCGM_FI_DEV_GPU_TEMP{job="dcgm"}[15m]))'


@pytest.fixture()
def leftovers(local_stack):
    """What `goodput demo` leaves: the simulator scraped by Prometheus, a demo job, a node
    Goodput drained and holds, an XID in a kernel log."""
    env = local_stack
    stack.start_service(
        "sim", demo.goodput_argv("sim", "serve", "--scheduler", "slurm"), demo.SIM_URL
    )
    job = slurm(
        "sbatch", "--parsable", "--job-name=gpt-a", "-N1", "--output=/dev/null",
        "--wrap", "sleep 600",
    ).strip()  # fmt: skip
    slurm("scontrol", "update", f"NodeName={NODE}", "State=DRAIN", "Reason=goodput: demo test")
    holds = Path(env["GOODPUT_HOLD_DIR"])
    slurm_hooks.hold(holds, NODE, "demo test")
    kernel_log = Path(env["GOODPUT_LOG_DIR"]) / "kernel" / f"{NODE}.log"
    kernel_log.parent.mkdir(parents=True, exist_ok=True)
    kernel_log.write_text(f"2026-01-01T00:00:00+0000 {NODE} kernel: NVRM: Xid (PCI:0): 79, x\n")
    wait_until(
        lambda: prom_query(env["GOODPUT_PROMETHEUS_URL"], SERIES), 60, what="GPU series scraped"
    )
    yield env, job, holds, kernel_log
    # whatever the command under test left (the primitives it is made of)
    demo.stop_services()
    s = demo_clients.Slurm(env)
    s.cancel_demo_jobs()
    slurm_hooks.release(holds, NODE)
    s.resume_drained()
    forget_faults(env["GOODPUT_PROMETHEUS_URL"], env["GOODPUT_LOG_DIR"])


def test_demo_stop_keep_stack_undoes_the_demo_and_leaves_the_stack_running(leftovers):
    env, job, holds, kernel_log = leftovers
    run = subprocess.run(
        [sys.executable, "-m", "goodput.cli", "demo", "stop", "--keep-stack"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"returned {NODE} to service" in run.stdout
    # the demo is gone: services, job, drain, hold, series, logs
    assert not (stack.state_dir() / "run" / "sim.pid").exists()
    assert not demo_clients.wait(lambda: demo_clients.http_ok(f"{demo.SIM_URL}/api/v1/cluster"), 1)
    active = ("squeue", "-h", "-o", "%i", "-t", "pending,running,completing,suspended")
    wait_until(lambda: job not in slurm(*active).split(), 30, what="the demo job ended")
    assert demo_clients.Slurm(env).reason(NODE) == ""
    assert slurm_hooks.held(holds, NODE) is None
    assert not kernel_log.exists()
    assert prom_query(env["GOODPUT_PROMETHEUS_URL"], SERIES) == []
    # the stack is not: Slurm and Prometheus still answer
    assert "UP" in slurm("scontrol", "ping")
    assert prom_query(env["GOODPUT_PROMETHEUS_URL"], "up")

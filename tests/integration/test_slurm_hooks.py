"""Goodput's Prolog/Epilog in the local stack's real Slurm: a held node refuses the job (Slurm
drains it and requeues the job elsewhere), and the per-GPU job mapping follows a job's life."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from recovery import slurm_hooks
from tests.conftest import wait_until
from tests.helpers import scontrol_show, slurm

NODE = "node4"


@pytest.fixture
def stack_dirs(local_stack):
    conf = Path(local_stack["SLURM_CONF"]).read_text()
    assert "Prolog=" in conf, "the stack's slurm.conf has no Prolog (restart the stack)"
    return Path(os.environ["GOODPUT_HOLD_DIR"]), Path(os.environ["DCGM_HPC_JOB_MAPPING_DIR"])


def _submit(*extra: str) -> str:
    return slurm(
        "sbatch", "--parsable", "--requeue", f"--job-name=gp-hook-{uuid.uuid4().hex[:6]}",
        "--output=/dev/null", "--gpus=1", *extra, "--wrap", "sleep 300",
    ).strip()  # fmt: skip


def test_a_held_node_refuses_the_job_and_slurm_runs_it_elsewhere(stack_dirs):
    hold_dir, _ = stack_dirs
    slurm_hooks.hold(hold_dir, NODE, "goodput: checking (test)")
    job = None
    try:
        job = _submit(f"--nodelist={NODE}")
        node = wait_until(
            lambda: (s := scontrol_show("node", NODE)).get("State", "").find("DRAIN") >= 0 and s,
            timeout=30,
            what=f"{NODE} drained by Slurm after the Prolog refused job {job}",
        )
        assert "Prolog" in node.get("Reason", ""), node
        info = scontrol_show("job", job)
        assert info.get("JobState") != "RUNNING" or info.get("NodeList") != NODE, info
    finally:
        slurm_hooks.release(hold_dir, NODE)
        if job:
            slurm("scancel", job, check=False)
        slurm("scontrol", "update", f"NodeName={NODE}", "State=RESUME", check=False)
        wait_until(
            lambda: "DRAIN" not in scontrol_show("node", NODE).get("State", "DRAIN"),
            timeout=20,
            what=f"{NODE} resumed after the test",
        )


def test_the_gpu_job_mapping_follows_a_job(stack_dirs):
    _, mapping = stack_dirs
    job = _submit()
    try:
        files = wait_until(
            lambda: [p for p in mapping.glob("[0-9]*") if job in p.read_text().split()],
            timeout=30,
            what=f"job {job} in dcgm-exporter's job mapping",
        )
        assert len(files) == 1  # --gpus=1
    finally:
        slurm("scancel", job)
    wait_until(
        lambda: not [p for p in mapping.glob("[0-9]*") if job in p.read_text().split()],
        timeout=30,
        what=f"job {job} gone from the job mapping after it ended",
    )

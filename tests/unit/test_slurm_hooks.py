"""Slurm Prolog/Epilog hooks: a held node refuses jobs, the GPU job mapping follows jobs, and
nothing about our own inputs ever fails a Prolog (which would drain a healthy node)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from recovery import slurm_hooks as hooks

ENV = {"SLURMD_NODENAME": "node3", "SLURM_JOB_ID": "4242", "SLURM_JOB_GPUS": "0,2"}


def test_a_held_node_refuses_the_job_and_a_released_one_runs_it(tmp_path):
    hold_dir = tmp_path / "holds"
    hooks.hold(hold_dir, "node3", "failed dcgmi diag -r 2")
    out = hooks.prolog(ENV, hold_dir, None)
    assert out.code == hooks.HELD
    assert "goodput: failed dcgmi diag -r 2" in out.message and "4242" in out.message
    assert hooks.prolog({**ENV, "SLURMD_NODENAME": "node1"}, hold_dir, None).code == hooks.OK
    assert hooks.release(hold_dir, "node3") is True
    assert hooks.release(hold_dir, "node3") is False
    assert hooks.prolog(ENV, hold_dir, None).code == hooks.OK


def test_the_mapping_follows_jobs_per_gpu(tmp_path):
    m = tmp_path / "map"
    hooks.prolog(ENV, None, m)
    hooks.prolog({**ENV, "SLURM_JOB_ID": "77", "SLURM_JOB_GPUS": "2"}, None, m)
    assert (m / "0").read_text() == "4242\n"
    assert (m / "2").read_text() == "4242\n77\n"
    hooks.prolog(ENV, None, m)  # a Prolog run twice (per step) lists the job once
    assert (m / "2").read_text() == "77\n4242\n"
    # the Epilog cleans every GPU's file, even when its environment names no GPUs
    hooks.epilog({k: v for k, v in ENV.items() if k != "SLURM_JOB_GPUS"}, m)
    assert not (m / "0").exists() and (m / "2").read_text() == "77\n"


def test_cuda_visible_devices_and_mig_indices_are_read_and_uuids_left_out():
    assert hooks.job_gpus({"CUDA_VISIBLE_DEVICES": "1,3.1,GPU-aa-bb"}) == ["1", "3.1"]
    assert hooks.job_gpus({"SLURM_JOB_GPUS": "5", "CUDA_VISIBLE_DEVICES": "0"}) == ["5"]
    assert hooks.job_gpus({}) == []


@pytest.mark.parametrize(
    "env",
    [{}, {"SLURMD_NODENAME": "node3"}, {**ENV, "SLURM_JOB_ID": "1;rm -rf /"},
     {**ENV, "SLURMD_NODENAME": "../etc"}],
)  # fmt: skip
def test_bad_environment_never_fails_the_prolog_or_writes_outside(tmp_path, env):
    hooks.hold(tmp_path / "holds", "node3", "x")
    out = hooks.prolog(env, tmp_path / "holds", tmp_path / "map")
    assert out.code == hooks.OK and "nothing done" in out.message
    assert not (tmp_path / "map").exists()
    assert hooks.epilog(env, tmp_path / "map").code == hooks.OK


def test_an_unwritable_mapping_dir_does_not_fail_the_prolog(tmp_path):
    (tmp_path / "map").write_text("a file, not a directory")
    out = hooks.prolog(ENV, None, tmp_path / "map")
    assert out.code == hooks.OK and "not written" in out.message


def test_hold_validates_the_node_name(tmp_path):
    with pytest.raises(ValueError):
        hooks.hold(tmp_path, "../../etc/passwd", "x")


def test_concurrent_job_starts_on_one_gpu_lose_no_job(tmp_path):
    m = tmp_path / "map"
    jobs = [str(j) for j in range(100, 140)]
    threads = [
        threading.Thread(target=hooks.prolog, args=({**ENV, "SLURM_JOB_ID": j}, None, m))
        for j in jobs
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted((m / "0").read_text().split()) == sorted(jobs)


def test_the_command_exits_as_slurm_expects(tmp_path):
    hold_dir = tmp_path / "holds"
    cmd = [sys.executable, "-m", "goodput.entry", "slurm"]
    env = {**os.environ, **ENV, "GOODPUT_HOLD_DIR": str(hold_dir)}
    run = lambda *a: subprocess.run([*cmd, *a], env=env, capture_output=True, text=True)  # noqa: E731
    assert run("hold", "node3", "--reason", "checking").returncode == 0
    refused = run("prolog")
    assert refused.returncode == 1 and "held by Goodput" in refused.stderr
    assert run("epilog").returncode == 0
    assert run("release", "node3").returncode == 0
    assert run("prolog").returncode == 0
    assert run("release", "node3").returncode == 1
    assert run("hold", "bad/name").returncode == 2

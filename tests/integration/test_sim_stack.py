"""The simulator against the real stack: Prometheus scrapes it; real Slurm runs sim jobs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import requests

from exporters.sim import FIELD_NAMES
from tests.conftest import wait_until
from tests.helpers import prom_query, slurm

ROOT = Path(__file__).resolve().parents[2]


def _start(tmp_path, *args):
    log = open(tmp_path / "sim.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "goodput.cli", "sim", "serve", *args],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={
            **os.environ,
            "GOODPUT_LOG_DIR": os.environ.get("GOODPUT_LOG_DIR", str(tmp_path / "logs")),
        },
    )
    return proc


def _stop(proc):
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def _up(url):
    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.RequestException:
        return False


def test_prometheus_scrapes_every_dcgm_family(local_stack, prometheus_url, tmp_path):
    control, base = 19397, 19750
    proc = _start(
        tmp_path,
        "--nodes",
        "2",
        "--control-port",
        str(control),
        "--node-base-port",
        str(base),
        "--tick",
        "1",
    )
    tag = f"simtest{uuid.uuid4().hex[:6]}"
    targets = Path(os.environ["GOODPUT_STACK_DIR"]) / "prometheus" / "targets"
    tfile = targets / f"extra-{tag}.json"
    try:
        wait_until(lambda: _up(f"http://127.0.0.1:{control}/metrics"), 20, what="simulator")
        sub = requests.post(
            f"http://127.0.0.1:{control}/api/v1/scheduler/jobs", json={"name": tag, "nodes": 1}
        ).json()
        tfile.write_text(
            json.dumps(
                [
                    {
                        "targets": [f"127.0.0.1:{base + 1}", f"127.0.0.1:{base + 2}"],
                        "labels": {"test": tag},
                    }
                ]
            )
        )
        sel = f'{{test="{tag}",hpc_job="{sub["job_id"]}"}}'
        wait_until(
            lambda: prom_query(prometheus_url, f"DCGM_FI_DEV_GPU_UTIL{sel}"),
            30,
            what="first scrape with hpc_job",
        )
        got = prom_query(
            prometheus_url, f'count by (__name__) ({{test="{tag}",__name__=~"DCGM_.*"}})'
        )
        names = {r["metric"]["__name__"] for r in got}
        assert names == {n for n in FIELD_NAMES if n.startswith("DCGM_")}
        # beside them the NVML exporter's host-side counter, on the GPUs a process holds
        own = f'{{test="{tag}",job_id="{sub["job_id"]}"}}'  # Goodput's label names
        assert prom_query(prometheus_url, f"goodput_gpu_process_cpu_seconds_total{own}")
        row = prom_query(prometheus_url, f"DCGM_FI_DEV_POWER_USAGE{sel}")[0]["metric"]
        for label in (
            "gpu",
            "UUID",
            "device",
            "modelName",
            "pci_bus_id",
            "Hostname",
            "DCGM_FI_DRIVER_VERSION",
        ):
            assert label in row
        assert row["Hostname"] == "node1"
        # a lost node's endpoint stops answering
        tfile.unlink()
        requests.post(
            f"http://127.0.0.1:{control}/api/v1/faults", json={"kind": "node_lost", "node": "node2"}
        ).raise_for_status()

        def refused():
            try:
                socket.create_connection(("127.0.0.1", base + 2), timeout=1).close()
                return False
            except OSError:
                return True

        wait_until(refused, 10, what="node2 listener closed")
    finally:
        tfile.unlink(missing_ok=True)
        _stop(proc)


def _job_field(job_id, key):
    out = slurm("scontrol", "show", "job", "-o", job_id, check=False)
    for tok in out.split():
        if tok.startswith(key + "="):
            return tok.split("=", 1)[1]
    return None


@pytest.mark.parametrize(
    "kind,text",
    [
        ("xid79_off_bus", "CUDA error: unspecified launch failure"),
        ("cuda_oom", "torch.cuda.OutOfMemoryError: CUDA out of memory"),
    ],
)
def test_real_slurm_job_fails_as_injected(local_stack, tmp_path, kind, text):
    control, base = 19396, 19760
    proc = _start(
        tmp_path,
        "--scheduler",
        "slurm",
        "--control-port",
        str(control),
        "--node-base-port",
        str(base),
        "--tick",
        "0.5",
    )
    logdir = Path(os.environ["GOODPUT_LOG_DIR"])
    name = f"simtest-{kind}-{uuid.uuid4().hex[:6]}"
    script = tmp_path / "job.sh"
    script.write_text(
        f"#!/bin/bash\nexec {sys.executable} -m goodput.cli sim job "
        f"--sim-url http://127.0.0.1:{control} --init 1\n"  # start-up lines before the fault
    )
    job_id = None
    try:
        wait_until(lambda: _up(f"http://127.0.0.1:{control}/metrics"), 20, what="simulator")
        out = slurm(
            "sbatch",
            "--parsable",
            "-N1",
            "--gres=gpu:2",
            "--no-requeue",
            f"--job-name={name}",
            f"--output={logdir}/jobs/slurm-%j.out",
            f"--chdir={ROOT}",
            str(script),
        )
        job_id = out.strip().split(";")[0]
        api = f"http://127.0.0.1:{control}/api/v1"

        def registered():
            r = requests.get(f"{api}/jobs/{job_id}", timeout=2)
            return r.status_code == 200 and r.json()["state"] == "RUNNING" and r.json()

        job = wait_until(registered, 40, what="sim job registered")
        node = job["nodes"][0]
        r = requests.post(
            f"{api}/faults", json={"kind": kind, "job_id": job_id, "params": {"crash_after_s": 2}}
        )
        assert r.status_code == 201, r.text
        wait_until(lambda: _job_field(job_id, "JobState") == "FAILED", 30, what="job FAILED")
        assert _job_field(job_id, "ExitCode") == "1:0"
        assert _job_field(job_id, "NodeList") == node
        log = (logdir / "jobs" / f"slurm-{job_id}.out").read_text()
        assert text in log and "ChildFailedError" in log and "NCCL INFO" in log
        if kind == "xid79_off_bus":
            kernel = (logdir / "kernel" / f"{node}.log").read_text()
            assert "): 79, " in kernel
    finally:
        if job_id:
            slurm("scancel", job_id, check=False)
        _stop(proc)

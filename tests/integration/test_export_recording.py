"""`goodput export-recording` against the stack's real Prometheus, fed by a test target that
speaks dcgm-exporter's and Goodput's metric names."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from detector.replay import load
from tests.conftest import wait_until
from tests.helpers import add_scrape_target, prom_query

ROOT = Path(__file__).resolve().parents[2]
UID = f"{os.getpid() % 100000}"
JOB = f"77{UID}"
NODES = (f"exp{UID}-a", f"exp{UID}-b")  # a: hpc_job label; b: placed via Slurm's node info
OTHER = f"exp{UID}-z"  # not the job's: must not be exported


MODEL = "NVIDIA H100 80GB HBM3"


class _Target:
    """Collects at scrape time: 4 GPUs per node, the job's node info and progress metrics."""

    def __init__(self) -> None:
        self.t0 = time.time()

    def collect(self):
        it = int((time.time() - self.t0) * 2)
        names = ["gpu", "Hostname", "hpc_job", "UUID", "modelName"]
        util = GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "util", labels=names)
        power = GaugeMetricFamily("DCGM_FI_DEV_POWER_USAGE", "power", labels=names)
        for node in (*NODES, OTHER):
            for gpu in range(4):
                job = JOB if node == NODES[0] else ""
                labels = [str(gpu), node, job, f"GPU-{node}-{gpu}", MODEL]
                util.add_metric(labels, 99.0 - gpu)
                power.add_metric(labels, 650.0 + 10 * gpu)
        yield util
        yield power
        # the NVML exporter's host-side counter: GPU 0's processes burn a core, the others rest
        own = ["node", "gpu", "model_name", "job_id"]  # Goodput's label names
        cpu = CounterMetricFamily("goodput_gpu_process_cpu_seconds", "cpu", labels=own)
        for node in NODES:
            for gpu in range(4):
                busy = time.time() - self.t0 if gpu == 0 else 0.001 * gpu
                cpu.add_metric([node, str(gpu), MODEL, JOB if node == NODES[0] else ""], busy)
        yield cpu
        info = GaugeMetricFamily(
            "goodput_slurm_job_node_info", "job->node", labels=["job_id", "job_name", "node"]
        )
        for node in NODES:
            info.add_metric([JOB, "export-test", node], 1.0)
        yield info
        iteration = GaugeMetricFamily("goodput_job_iteration", "it", labels=["job_id"])
        iteration.add_metric([JOB], float(it))
        yield iteration
        last = GaugeMetricFamily(
            "goodput_job_last_progress_timestamp_seconds", "last", labels=["job_id", "rank"]
        )
        for rank in range(2):
            last.add_metric([JOB, str(rank)], time.time() - rank)
        yield last


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def target(prometheus_url):
    registry = CollectorRegistry()
    registry.register(_Target())
    port = _free_port()
    server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    path = add_scrape_target(f"export-{UID}", port)
    start = time.time()
    try:
        expr = f'count(goodput_job_iteration{{job_id="{JOB}"}}[60s])'
        wait_until(
            lambda: (
                (r := prom_query(prometheus_url, f"count_over_time({expr[6:-1]})"))
                and float(r[0]["value"][1]) >= 4
            ),
            40,
            what="four scrapes of the test target",
        )
        yield start - 2, time.time()
    finally:
        path.unlink(missing_ok=True)
        server.shutdown()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "goodput.cli", "export-recording", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_export_writes_a_recording_replay_can_read(prometheus_url, target, tmp_path):
    start, end = target
    out = tmp_path / "rec"
    res = _cli(
        "--prometheus", prometheus_url, "--job-id", JOB, "--start", f"{start:.3f}",
        "--end", f"{end:.3f}", "--out", str(out), "--step", "2",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["format"] == "goodput-recording/1"
    assert meta["nodes"] == sorted(NODES)
    assert meta["jobs"][0]["name"] == "export-test" and meta["jobs"][0]["job_id"] == JOB
    with gzip.open(out / "gpu_metrics.csv.gz", "rt") as fh:
        gpu = pd.read_csv(fh, dtype={"job_id": str, "node": str})
    assert set(gpu.node) == set(NODES)  # the other node is left out
    assert set(gpu.gpu) == {0, 1, 2, 3}
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE"} <= set(gpu.columns)
    on_b = gpu[gpu.node == NODES[1]]
    assert (on_b.job_id == JOB).all()  # from goodput_slurm_job_node_info, no hpc_job label
    assert (gpu[gpu.node == NODES[0]].job_id == JOB).all()
    assert (gpu.groupby("gpu").DCGM_FI_DEV_GPU_UTIL.first() == [99.0, 98.0, 97.0, 96.0]).all()
    with gzip.open(out / "job_metrics.csv.gz", "rt") as fh:
        jobs = pd.read_csv(fh, dtype={"job_id": str})
    assert len(jobs) >= 3 and jobs.goodput_job_iteration.is_monotonic_increasing
    lag = jobs.timestamp - jobs.goodput_job_last_progress_timestamp_seconds
    assert lag.abs().max() < 10  # unix seconds kept at full precision (max over ranks)
    # the GPUs' processes on the host, in cores, as the detector reads them (irate)
    host = gpu.dropna(subset=["goodput_gpu_process_cpu_cores"])
    assert len(host) and host[host.gpu == 0].goodput_gpu_process_cpu_cores.between(0.8, 1.2).all()
    assert (host[host.gpu > 0].goodput_gpu_process_cpu_cores < 0.01).all()
    frame, names, interval = load(out)
    assert set(frame.job) == {JOB} and names == {JOB: "export-test"} and interval == 2.0
    assert set(frame.models) == {MODEL}  # dcgm's label kept: replay uses the model's priors
    cores = frame.col("goodput_gpu_process_cpu_cores")
    assert np.nanmin(cores[frame.gpu == 0]) > 0.8  # replay reads the column


def test_export_errors_are_clear(prometheus_url, tmp_path):
    res = _cli("--prometheus", prometheus_url, "--job-id", "1;rm", "--start", "0", "--end", "10",
               "--out", str(tmp_path / "x"))  # fmt: skip
    assert res.returncode == 2 and "job id" in res.stderr
    now = time.time()
    res = _cli("--prometheus", prometheus_url, "--job-id", "99999999", "--start",
               f"{now - 60:.0f}", "--end", f"{now:.0f}", "--out", str(tmp_path / "y"))  # fmt: skip
    assert res.returncode == 2 and "no nodes found" in res.stderr
    assert not (tmp_path / "y").exists()

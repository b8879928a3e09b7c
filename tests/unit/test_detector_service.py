"""The service against a stub Prometheus: fixed query count, join by node, staleness on errors."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from detector.baselines import BaselineStore
from detector.promclient import PromError
from detector.service import Service, ServiceConfig


class StubProm:
    def __init__(self, jobs: int, down: bool = False):
        self.jobs, self.down, self.calls = jobs, down, 0

    def query(self, expr):
        self.calls += 1
        if self.down:
            raise PromError("connection refused")
        if expr.startswith("{__name__"):
            out = []
            for j in range(self.jobs):
                for g in range(8):
                    base = {"Hostname": f"node{j + 1}", "gpu": str(g)}
                    out.append(({**base, "__name__": "DCGM_FI_DEV_GPU_UTIL"}, 99.0))
                    power = 125.0 if (j, g) == (0, 3) else 690.0
                    out.append(({**base, "__name__": "DCGM_FI_DEV_POWER_USAGE"}, power))
            out.append(
                ({"__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": "bad host!", "gpu": "0"}, 1.0)
            )
            return out
        if expr == "goodput_slurm_job_node_info":
            return [
                ({"job_id": str(100 + j), "job_name": f"train{j}", "node": f"node{j + 1}"}, 1.0)
                for j in range(self.jobs)
            ]
        return []


def make(tmp_path, stub):
    svc = Service(ServiceConfig(), store=BaselineStore(tmp_path), registry=CollectorRegistry())
    svc.client = stub
    return svc


def test_query_count_does_not_grow_with_jobs(tmp_path):
    counts = []
    for jobs in (1, 5):
        stub = StubProm(jobs)
        assert make(tmp_path, stub).cycle(now=1000.0)
        counts.append(stub.calls)
    assert counts[0] == counts[1] == 5


def test_scores_exposed_and_joined_by_node(tmp_path):
    svc = make(tmp_path, StubProm(3))
    for t in (1000.0, 1005.0, 1010.0):
        assert svc.cycle(now=t)
    text = generate_latest(svc.registry).decode()
    assert 'goodput_gpu_anomaly_score{detector="peer",gpu="3",job_id="100",node="node1"}' in text
    assert 'goodput_job_anomaly_score{detector="combined",job_id="101"}' in text
    assert "goodput_detector_series_scored 24.0" in text  # the invalid host label was dropped
    peer = [
        ln for ln in text.splitlines() if ln.startswith('goodput_node_suspect_score{job_id="100"')
    ]
    assert peer and float(peer[0].split()[-1]) > 1.0


def test_prometheus_down_goes_stale_and_counts_errors(tmp_path):
    stub = StubProm(2)
    svc = make(tmp_path, stub)
    assert svc.cycle(now=1000.0)
    stub.down = True
    assert not svc.cycle(now=1005.0)
    assert not svc.cycle(now=1010.0)
    text = generate_latest(svc.registry).decode()
    assert "goodput_detector_query_errors_total 2.0" in text
    assert "goodput_gpu_anomaly_score{" not in text
    stub.down = False
    assert svc.cycle(now=1015.0)


class OneGpuJob(StubProm):
    """A 1-GPU job on node1 with dcgm's job mapping on: only GPU 0 carries hpc_job."""

    def query(self, expr):
        self.calls += 1
        if expr.startswith("{__name__"):
            out = []
            for g in range(8):
                lab = {"Hostname": "node1", "gpu": str(g), "modelName": "NVIDIA H200"}
                if g == 0:
                    lab["hpc_job"] = "100"
                util = 99.0 if g == 0 else 0.0
                out.append(({**lab, "__name__": "DCGM_FI_DEV_GPU_UTIL"}, util))
            return out
        if expr == "goodput_slurm_job_node_info":
            return [({"job_id": "100", "job_name": "solo", "node": "node1"}, 1.0)]
        return []


def test_a_nodes_unmapped_gpus_are_not_its_one_jobs_peers(tmp_path):
    """With job mapping on, the node join must not hand a 1-GPU job the node's 7 idle GPUs
    (they were its 'peers': the one busy GPU scored as an outlier). Fails on the old join."""
    from detector.service import fetch

    frame, _ = fetch(OneGpuJob(1), now=1000.0)
    assert list(frame.job[frame.gpu == 0]) == ["100"]
    assert set(frame.job[frame.gpu != 0]) == {""}
    assert set(frame.models) == {"NVIDIA H200"}

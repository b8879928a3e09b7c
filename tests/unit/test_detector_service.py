"""The service on recorded Prometheus answers (the shape the real Prometheus gives for its
queries, bench/scale_data.py): fixed query count, join by node, bounded exposition, shards,
staleness on errors. The real Prometheus runs in tests/integration/test_detector_shards.py."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from bench.scale_data import Cluster, answers
from clients.prometheus import PromClient, PromError
from detector import fields as F
from detector import ingest
from detector.baselines import BaselineStore
from detector.ingest import KEY, Shard, fetch, queries
from detector.service import Service, ServiceConfig
from detector.thresholds import level


class Recorded(PromClient):
    """Answers each query from recorded answer bytes (decoded as from the wire)."""

    def __init__(self, recorded: dict[str, bytes]):
        super().__init__("http://127.0.0.1:9")
        self.recorded, self.down, self.calls = recorded, False, 0

    def _post(self, path, form):
        self.calls += 1
        if self.down:
            raise PromError("connection refused")
        empty = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
        return 200, self.recorded.get(form["query"], empty), self.url + path


def cluster(jobs: int, slow: tuple[int, int] | None = None) -> Cluster:
    c = Cluster.make(16 * jobs, seed=1)
    if slow is not None:  # one GPU at a quarter of its power: its peers see it
        i = slow[0] * 8 + slow[1]
        c.values[i, F.DCGM_FIELDS.index("DCGM_FI_DEV_POWER_USAGE")] = 125.0
    return c


def make(tmp_path, recorded, shard=None):
    svc = Service(ServiceConfig(shard=shard), store=BaselineStore(tmp_path))
    svc.client = Recorded(recorded)
    return svc


def series(text: str, name: str) -> list[tuple[str, float]]:
    return [
        (ln.split(" ")[0], float(ln.split(" ")[1]))
        for ln in text.splitlines()
        if ln.startswith(name + "{")
    ]


def test_query_count_does_not_grow_with_jobs_or_gpus(tmp_path):
    counts = []
    for jobs in (1, 20):
        svc = make(tmp_path, answers(cluster(jobs), None, 1000.0))
        assert svc.cycle(now=1000.0)
        counts.append(svc.client.calls)
    assert counts[0] == counts[1] == len(ingest.GPU_COLUMNS) + 4  # + node info, 3 per-job values


def test_scores_exposed_bounded_and_joined_by_node(tmp_path):
    """dcgm without hpc_job: jobs come from the node info; one slow GPU drives its score over
    the alert level, and only that GPU gets a driver series (naming the detector)."""
    rec = answers(cluster(3, slow=(0, 3)), None, 1000.0, hpc_job=False)
    bad = orjson.loads(rec[queries()["DCGM_FI_DEV_GPU_UTIL"]])
    bad["data"]["result"].append({"metric": {KEY: 'node1",evil="x,,0,,'}, "value": [0, "1"]})
    bad["data"]["result"].append({"metric": {KEY: "node1,,9999,,"}, "value": [0, "1"]})
    bad["data"]["result"].append({"metric": {KEY: "node1,,\u00b2,,"}, "value": [0, "1"]})  # ²
    rec[queries()["DCGM_FI_DEV_GPU_UTIL"]] = orjson.dumps(bad)
    svc = make(tmp_path, rec)
    for t in (1000.0, 1005.0, 1010.0, 1015.0):
        assert svc.cycle(now=t)
    text = svc.exposition().decode()
    assert "evil" not in text and 'gpu="9999"' not in text
    assert "goodput_detector_series_scored 48.0" in text  # the invalid rows were dropped
    gpu = dict(series(text, "goodput_gpu_anomaly_score"))
    assert len(gpu) == 48  # one series per GPU
    slow = 'goodput_gpu_anomaly_score{job_id="100000",node="node1",gpu="3"}'
    assert gpu[slow] >= level("gpu")
    driver = series(text, "goodput_gpu_anomaly_driver_score")
    assert [d for d, _ in driver] == [
        'goodput_gpu_anomaly_driver_score{job_id="100000",node="node1",gpu="3",detector="peer"}'
    ]
    assert driver[0][1] == gpu[slow]
    nodes = dict(series(text, "goodput_node_anomaly_score"))
    assert nodes['goodput_node_anomaly_score{job_id="100000",node="node1",detector="peer"}'] > 1
    assert len(nodes) == 6 * 8  # 3 jobs x 2 nodes x 8 detectors
    assert 'goodput_job_anomaly_score{job_id="100001",detector="combined"}' in text
    suspect = dict(series(text, "goodput_node_suspect_score"))
    assert suspect['goodput_node_suspect_score{job_id="100000",node="node1"}'] > 1.0


def test_join_by_node_only_where_the_node_has_no_job_mapping(tmp_path):
    """A 1-GPU job with hpc_job on its GPU: the node's 7 unlabelled GPUs stay idle (they were
    its 'peers'); a node without any hpc_job still gets its one job by the Slurm join."""
    c = Cluster.make(16, seed=2)
    c.job = ["7"] + [""] * 7 + [""] * 8  # node1: job 7 on GPU 0 (mapped); node2: no mapping
    rec = answers(c, None, 1000.0)
    info = queries()["goodput_slurm_job_node_info"]
    rows = [("7", "node1"), ("8", "node2")]
    rec[info] = orjson.dumps(
        {
            "status": "success",
            "data": {
                "resultType": "vector",
                "result": [
                    {"metric": {"job_id": j, "node": n}, "value": [1000.0, "1"]} for j, n in rows
                ],
            },
        }
    )
    frame, _ = fetch(Recorded(rec), now=1000.0)
    got = {(n, int(g)): j for n, g, j in zip(frame.node, frame.gpu, frame.job, strict=True)}
    assert got[("node1", 0)] == "7"
    assert all(got[("node1", g)] == "" for g in range(1, 8))
    assert all(got[("node2", g)] == "8" for g in range(8))


def test_cardinality_per_1000_healthy_gpus(tmp_path):
    """At most 2 series per GPU plus per-job and per-node series (docs/contracts.md)."""
    svc = make(tmp_path, answers(Cluster.make(1000, idle=0.04), None, 1000.0))
    for t in (1000.0, 1005.0):
        assert svc.cycle(now=t)
    text = svc.exposition().decode()
    on_job = 960
    assert len(series(text, "goodput_gpu_anomaly_score")) == on_job
    assert len(series(text, "goodput_gpu_anomaly_driver_score")) == 0
    per_node = len(series(text, "goodput_node_anomaly_score"))
    per_job = len(series(text, "goodput_job_anomaly_score"))
    assert per_node == 120 * 8 and per_job == 60 * 9  # 8 detectors (+ combined per job)
    assert len(series(text, "goodput_node_suspect_score")) == 120
    assert not series(text, "goodput_job_pause_allowance_seconds")  # only while a job pauses


def test_a_gpu_first_seen_with_two_series_keeps_the_service_scoring(tmp_path):
    """A GPU that first shows with two series (two jobs sharing it, two exporters) gets one
    slot; two slots with one key failed every later cycle, withdrawing every score."""
    rec = answers(cluster(2), None, 1000.0)
    for name in ingest.GPU_COLUMNS:
        answer = orjson.loads(rec[queries()[name]])
        rows = answer["data"]["result"]
        if not rows:
            continue
        twin = orjson.loads(orjson.dumps(rows[0]))
        parts = twin["metric"][KEY].split(",")
        parts[3] = "777"  # the same node and GPU, another job
        twin["metric"][KEY] = ",".join(parts)
        rows.append(twin)
        rec[queries()[name]] = orjson.dumps(answer)
    svc = make(tmp_path, rec)
    for t in (1000.0, 1005.0, 1010.0):
        assert svc.cycle(now=t)
    assert len(svc.engine.slot_key) == len(set(svc.engine.slot_key.tolist())) == 32
    assert series(svc.exposition().decode(), "goodput_gpu_anomaly_score")


def test_prometheus_down_goes_stale_and_counts_errors(tmp_path):
    svc = make(tmp_path, answers(cluster(2), None, 1000.0))
    assert svc.cycle(now=1000.0)
    svc.client.down = True
    assert not svc.cycle(now=1005.0)
    assert not svc.cycle(now=1010.0)
    text = svc.exposition().decode()
    assert "goodput_detector_query_errors_total 2.0" in text
    assert "goodput_detector_baseline_errors_total 0.0" in text
    assert "goodput_gpu_anomaly_score{" not in text
    svc.client.down = False
    assert svc.cycle(now=1015.0)


def test_an_unexpected_error_also_leaves_no_scores_exposed(tmp_path, monkeypatch):
    svc = make(tmp_path, answers(cluster(2), None, 1000.0))
    assert svc.guarded_cycle()
    assert "goodput_gpu_anomaly_score{" in svc.exposition().decode()

    def broken(*_a, **_k):
        raise RuntimeError("a defect")

    monkeypatch.setattr(svc.engine, "step", broken)
    assert not svc.guarded_cycle()
    text = svc.exposition().decode()
    assert (
        "goodput_gpu_anomaly_score{" not in text
        and "goodput_detector_query_errors_total 1.0" in text
    )


@pytest.mark.parametrize("bad", ["", "1", "2/2", "-1/2", "a/b", "0/0", "0/5000", "1/2/3"])
def test_shard_spec_is_validated(bad):
    with pytest.raises(ValueError):
        Shard.parse(bad)


def test_sharded_queries_select_the_shard():
    qs = queries(Shard.parse("3/8"))
    for name in F.DCGM_FIELDS:  # its jobs' GPUs and GPUs with no job (label absent)
        assert 'goodput_shard=~"|3"}' in qs[name] and name in qs[name]
    assert qs["goodput_slurm_job_node_info"] == 'goodput_slurm_job_node_info{goodput_shard="3"}'
    assert all("goodput_shard" not in q for q in queries(None).values())


def test_two_shards_partition_the_jobs_and_restart_keeps_baselines(tmp_path):
    c = cluster(12)
    now = 1000.0
    seen = []
    for k in range(2):
        shard = Shard(k, 2)
        svc = make(tmp_path, answers(c, shard, now), shard)
        assert svc.cycle(now=now)
        seen.append(set(svc.engine.base.jobs))
        job = sorted(svc.engine.base.jobs)[0]
        info = svc.engine.base.jobs[job]
        info.rows, info.seen = np.ones((4, len(F.ALL_FIELDS)), dtype=np.float32), 4
        svc.engine.base.fit_job(job, now)  # saved under the job's name in the shared store
        again = make(tmp_path, answers(c, shard, now), shard)  # the replica restarts
        assert again.cycle(now=now + 5)
        assert again.engine.base.jobs[job].loaded
    assert seen[0] and seen[1] and not seen[0] & seen[1]
    assert seen[0] | seen[1] == set(c.job) - {""}


def test_the_gpu_model_reaches_the_frame(tmp_path):
    """modelName rides in the per-GPU key (the priors read it per model)."""
    frame, _ = fetch(Recorded(answers(cluster(1), None, 1000.0)), now=1000.0)
    assert set(frame.models) == {"NVIDIA H200"} and len(frame.take(np.arange(3)).models) == 3


def test_the_gpus_processes_on_the_host_reach_the_frame():
    """The host-side counter's irate (one query, keyed per GPU like the fields) becomes the
    frame's column: a core on every GPU that runs a job (scale_data's answer), none else."""
    assert "irate(goodput_gpu_process_cpu_seconds_total" in queries()[F.HOST_CPU]
    c = Cluster.make(16, idle=0.5, seed=3)
    frame, _ = fetch(Recorded(answers(c, None, 1000.0)), now=1000.0)
    host = frame.col(F.HOST_CPU)
    assert (host[frame.job != ""] == 1.0).all() and np.isnan(host[frame.job == ""]).all()
    # the NVML exporter beside dcgm-exporter: its labels differ (no hpc_job, `hostname`), and
    # it reports a GPU dcgm-exporter does not: joined by (node, GPU), the stray one dropped
    rec = answers(c, None, 1000.0)
    q = queries()[F.HOST_CPU]
    doc = orjson.loads(rec[q])
    for r in doc["data"]["result"]:
        node, _, gpu, _, model = r["metric"][KEY].split(",")
        r["metric"][KEY] = f",{node},{gpu},,{model}"
    doc["data"]["result"].append({"metric": {KEY: "node9,,0,,x"}, "value": [1000.0, "1.0"]})
    rec[q] = orjson.dumps(doc)
    joined, _ = fetch(Recorded(rec), now=1000.0)
    assert len(joined) == len(frame) and "node9" not in set(joined.node)
    assert np.array_equal(joined.col(F.HOST_CPU), host, equal_nan=True)


def test_fetch_follows_a_new_join_or_new_gpus_from_one_cycle_to_the_next():
    """The label split is reused between cycles only while nothing it reads changed: the same
    GPUs with another job -> node join, or other GPUs, give the frame of a first fetch."""
    c = Cluster.make(16, seed=3)
    rec = answers(c, None, 1000.0, hpc_job=False)
    first, _ = fetch(Recorded(rec), now=1000.0)
    assert set(first.job) == {"100000"}
    info = queries()["goodput_slurm_job_node_info"]
    rec[info] = rec[info].replace(b'"100000"', b'"100009"').replace(b"train-100000", b"t")
    again, _ = fetch(Recorded(rec), now=1005.0)
    assert set(again.job) == {"100009"}
    c.node = [n.replace("node", "host") for n in c.node]
    moved, _ = fetch(Recorded(answers(c, None, 1010.0, hpc_job=False)), now=1010.0)
    assert set(moved.node) == {"host1", "host2"} and set(moved.job) == {"100000"}
    fresh, _ = fetch(Recorded(answers(c, None, 1010.0, hpc_job=False)), now=1010.0)
    for a, b in ((moved.node, fresh.node), (moved.job, fresh.job), (moved.gpu, fresh.gpu)):
        assert a.tolist() == b.tolist()
    assert np.array_equal(moved.values, fresh.values, equal_nan=True)

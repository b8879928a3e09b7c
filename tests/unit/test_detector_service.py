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
    # + node info, 3 per-job values and the GPUs' sample times
    assert counts[0] == counts[1] == len(ingest.GPU_COLUMNS) + 5


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


def _set(rec: dict[str, bytes], name: str, change) -> None:
    """Apply `change` to the result list of the recorded answer to field `name`'s query."""
    answer = orjson.loads(rec[queries()[name]])
    change(answer["data"]["result"])
    rec[queries()[name]] = orjson.dumps(answer)


def _value(frame, node: str, gpu: int, name: str) -> float:
    (i,) = np.flatnonzero((frame.node == node) & (frame.gpu == gpu))
    return float(frame.col(name)[i])


def test_infinite_values_read_as_no_reading(tmp_path):
    """+Inf and -Inf (a broken exporter, a division by zero in a recording rule) are no
    reading: before, they became +Inf peer scores, the job's combined score and the GPU's
    anomaly score exposed as +Inf (every alert on them firing)."""
    rec = answers(cluster(1), None, 1000.0)
    _set(rec, "DCGM_FI_DEV_POWER_USAGE", lambda rows: rows[3]["value"].__setitem__(1, "+Inf"))
    _set(rec, "DCGM_FI_DEV_GPU_UTIL", lambda rows: rows[5]["value"].__setitem__(1, "-Inf"))
    frame, _ = fetch(Recorded(rec), now=1000.0)
    assert np.isfinite(frame.values[~np.isnan(frame.values)]).all()
    svc = make(tmp_path, rec)
    for t in (1000.0, 1005.0, 1010.0, 1015.0):
        assert svc.cycle(now=t)
    text = svc.exposition().decode()
    scores = series(text, "goodput_gpu_anomaly_score") + series(text, "goodput_job_anomaly_score")
    assert scores and all(np.isfinite(v) and v < level("gpu") for _, v in scores)


@pytest.mark.parametrize(
    "blank",
    [
        "9223372036854775794",  # DCGM_INT64_BLANK + 2 (not supported): a GPU without the sensor
        "9223372036854775792",  # DCGM_INT64_BLANK
        "140737488355328",  # DCGM_FP64_BLANK (2**47)
        "140737488355330",  # DCGM_FP64_BLANK + 2
        "2147483632",  # DCGM_INT32_BLANK
    ],
)
def test_dcgm_blank_values_read_as_no_reading(tmp_path, blank):
    """DCGM's blanks (dcgm_structs.h) as dcgm-exporter writes them are no reading: before, one
    GPU's blank memory temperature scored 6.7e17 and fired its job's alerts, and a node
    whose GPUs all reported the blank made its peers on the other node the outliers."""
    rec = answers(cluster(1), None, 1000.0)
    name = "DCGM_FI_DEV_MEMORY_TEMP"

    def node2_blank(rows):
        for row in rows:
            if row["metric"][KEY].startswith("node2,"):
                row["value"][1] = blank

    _set(rec, name, lambda rows: rows[3]["value"].__setitem__(1, blank))
    _set(rec, "DCGM_FI_DEV_GPU_TEMP", node2_blank)
    frame, _ = fetch(Recorded(rec), now=1000.0)
    assert np.isnan(_value(frame, "node1", 3, name))
    assert np.isnan(frame.col("DCGM_FI_DEV_GPU_TEMP")[frame.node == "node2"]).all()
    assert np.isfinite(frame.col(name)).sum() == len(frame) - 1
    svc = make(tmp_path, rec)
    for t in (1000.0, 1005.0, 1010.0, 1015.0):
        assert svc.cycle(now=t)
    scores = series(svc.exposition().decode(), "goodput_gpu_anomaly_score")
    assert len(scores) == 16 and max(v for _, v in scores) < level("gpu")


def _spelled_twice(rec: dict[str, bytes], now: float, newer: str | None) -> None:
    """node1's GPU 3 also answered under the `hostname` spelling, its values halved; with
    sample times (`ingest.SAMPLED`) where `newer` names the series scraped last."""

    def twin(rows):
        (row,) = [r for r in rows if r["metric"][KEY].startswith("node1,,3,")]
        other = orjson.loads(orjson.dumps(row))
        host, _, rest = row["metric"][KEY].split(",", 2)
        other["metric"][KEY] = f",{host},{rest}"  # Hostname empty, hostname node1
        other["value"][1] = str(float(row["value"][1]) * 0.5)
        rows.append(other)

    for name in F.DCGM_FIELDS:
        if queries()[name] in rec:
            _set(rec, name, twin)
    if newer is None:
        return
    keys = [r["metric"][KEY] for r in orjson.loads(rec[queries()[F.UTIL]])["data"]["result"]]
    stamps = {k: now - 3.0 for k in keys}
    (spelled,) = [k for k in keys if k.startswith(",node1,3,")]
    stamps[spelled if newer == "hostname" else keys[3]] = now - 1.0
    rec[queries()[ingest.SAMPLED]] = orjson.dumps(
        {
            "status": "success",
            "data": {
                "resultType": "vector",
                "result": [{"metric": {KEY: k}, "value": [now, str(t)]} for k, t in stamps.items()],
            },
        }
    )


def test_one_gpu_under_two_host_spellings_is_one_row_the_newest(tmp_path):
    """dcgm-exporter spells the host label `Hostname`, newer releases `hostname`: one GPU
    answered under both (an upgrade on one node, two exporters) is one row, the values of the
    series scraped last. Before, it was two rows of one GPU: two lines of each of its series
    on /metrics (a scrape Prometheus rejects) and, its twin's values apart, a peer alert."""
    c = cluster(1)
    assert c.node[3] == "node1" and c.gpu[3] == 3  # the GPU `_spelled_twice` doubles
    util = _value(fetch(Recorded(answers(c, None, 1000.0)), now=1000.0)[0], "node1", 3, F.UTIL)
    for newer, want in (("Hostname", util), ("hostname", util * 0.5)):
        rec = answers(c, None, 1000.0)
        _spelled_twice(rec, 1000.0, newer)
        frame, _ = fetch(Recorded(rec), now=1000.0)
        assert len(frame) == 16 and _value(frame, "node1", 3, F.UTIL) == pytest.approx(want)
    svc = make(tmp_path / "svc", {})
    for t in (1000.0, 1005.0, 1010.0, 1015.0):
        rec = answers(c, None, t)
        _spelled_twice(rec, t, "Hostname")
        svc.client = Recorded(rec)
        assert svc.cycle(now=t)
    lines = [
        ln.rsplit(" ", 1)[0]
        for ln in svc.exposition().decode().splitlines()
        if ln.startswith("goodput_") and not ln.startswith("goodput_detector")
    ]
    assert len(lines) == len(set(lines))
    scores = series(svc.exposition().decode(), "goodput_gpu_anomaly_score")
    assert len(scores) == 16 and max(v for _, v in scores) < level("gpu")


def test_two_series_of_one_gpu_without_sample_times_keep_the_newer_spelling(tmp_path):
    """Without sample times the `hostname` spelling (newer dcgm-exporter releases: the one
    an upgrade leaves) stands for the GPU; still one row, one line per series on /metrics."""
    rec = answers(cluster(1), None, 1000.0)
    _spelled_twice(rec, 1000.0, None)
    frame, _ = fetch(Recorded(rec), now=1000.0)
    assert len(frame) == 16
    util = _value(frame, "node1", 3, F.UTIL)
    assert util == pytest.approx(
        0.5
        * _value(
            fetch(Recorded(answers(cluster(1), None, 1000.0)), now=1000.0)[0], "node1", 3, F.UTIL
        )
    )
    svc = make(tmp_path, rec)
    assert svc.cycle(now=1000.0)
    lines = [
        ln.rsplit(" ", 1)[0]
        for ln in svc.exposition().decode().splitlines()
        if ln.startswith("goodput_") and not ln.startswith("goodput_detector")
    ]
    assert len(lines) == len(set(lines))

"""Each fault kind's metric, log and scheduler signature in an accelerated recording."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from exporters.sim import FAULT_KINDS, run_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
ONSET = 420  # every per-kind scenario injects at 7 minutes on job gpt-a (1001)


@pytest.fixture(scope="module")
def recs(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = run_scenario(
                SCENARIOS / f"{name}.yaml", out=tmp_path_factory.mktemp(name)
            )
        return cache[name]

    return get


def window(rec, node, gpu, start, end):
    g = rec.gpu_frame()
    t0 = rec.meta["start"]
    sel = g[
        (g.node == node) & (g.gpu == gpu) & (g.timestamp >= t0 + start) & (g.timestamp < t0 + end)
    ]
    assert len(sel), f"no samples for {node}/{gpu} in [{start},{end})"
    return sel


def job_log(rec, job_id="1001"):
    return (rec.path / "logs" / "jobs" / f"slurm-{job_id}.out").read_text()


def job_meta(rec, job_id="1001"):
    return next(j for j in rec.meta["jobs"] if j["job_id"] == job_id)


def test_every_kind_has_a_scenario():
    names = {p.stem.replace("-", "_") for p in SCENARIOS.glob("*.yaml")}
    assert set(FAULT_KINDS) <= names
    assert "healthy_long" in names


def test_spin_hang_signature(recs):
    rec = recs("spin-hang")
    stuck = window(rec, "node2", 3, ONSET + 30, ONSET + 500)
    peer = window(rec, "node1", 0, ONSET + 30, ONSET + 500)
    assert stuck.DCGM_FI_DEV_GPU_UTIL.max() == 0
    assert peer.DCGM_FI_DEV_GPU_UTIL.min() >= 99
    assert peer.DCGM_FI_DEV_POWER_USAGE.max() < 160
    assert peer.DCGM_FI_PROF_SM_ACTIVE.max() < 0.03
    log = job_log(rec)
    assert "Watchdog caught collective operation timeout" in log
    assert "[rank11]:" not in log.split("Watchdog")[0].split("training ...")[-1]
    assert job_meta(rec)["state"] == "FAILED"
    truth = rec.truth["faults"][0]
    assert truth["outcome"] == "workload_hang" and truth["nodes"] == ["node2"]
    assert truth["action"] == "requeue"


def test_dataloader_stall_all_ranks_idle_on_host(recs):
    rec = recs("dataloader-stall")
    for node, gpu in [("node1", 0), ("node2", 5)]:
        w = window(rec, node, gpu, ONSET + 15, ONSET + 400)
        assert w.DCGM_FI_DEV_GPU_UTIL.max() == 0
        assert 110 < w.DCGM_FI_DEV_POWER_USAGE.mean() < 140
        assert w.DCGM_FI_DEV_FB_USED.min() > 50_000  # memory still held
    assert rec.truth["faults"][0]["nodes"] == []


def test_nan_divergence_looks_healthy_on_metrics(recs):
    rec = recs("nan-divergence")
    w = window(rec, "node1", 0, ONSET + 60, ONSET + 200)
    assert w.DCGM_FI_DEV_GPU_UTIL.min() >= 95
    assert w.DCGM_FI_DEV_POWER_USAGE.min() > 500
    assert "lm loss: nan" in job_log(rec)
    jm = rec.job_frame()
    assert jm[jm.job_id == "1001"].goodput_job_nan_iterations_total.max() > 0


def test_thermal_straggler_culprit_hot_and_slow(recs):
    rec = recs("thermal-straggler")
    hot = window(rec, "node2", 7, ONSET + 120, ONSET + 300)
    peer = window(rec, "node1", 1, ONSET + 120, ONSET + 300)
    assert hot.DCGM_FI_DEV_GPU_TEMP.mean() > peer.DCGM_FI_DEV_GPU_TEMP.mean() + 15
    assert ((hot.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS.astype(int) & 0x40) > 0).mean() > 0.8
    assert hot.DCGM_FI_DEV_POWER_USAGE.mean() < peer.DCGM_FI_DEV_POWER_USAGE.mean()
    jm = rec.job_frame()
    a = jm[jm.job_id == "1001"]
    t0 = rec.meta["start"]
    before = a[(a.timestamp > t0 + 200) & (a.timestamp < t0 + ONSET)]
    after = a[a.timestamp > t0 + ONSET + 60]
    assert (
        after.goodput_job_iteration_seconds.median()
        > 1.3 * before.goodput_job_iteration_seconds.median()
    )


def test_host_straggler_culprit_lower_util_and_power(recs):
    rec = recs("host-straggler")
    slow = window(rec, "node2", 0, ONSET + 60, ONSET + 300)
    peer = window(rec, "node1", 0, ONSET + 60, ONSET + 300)
    assert slow.DCGM_FI_DEV_GPU_UTIL.mean() < peer.DCGM_FI_DEV_GPU_UTIL.mean() - 20
    assert slow.DCGM_FI_DEV_POWER_USAGE.mean() < peer.DCGM_FI_DEV_POWER_USAGE.mean()
    assert slow.DCGM_FI_PROF_SM_ACTIVE.mean() < peer.DCGM_FI_PROF_SM_ACTIVE.mean()


@pytest.mark.parametrize(
    "name,xid,exit_code,text",
    [
        ("xid79-off-bus", 79, 1, "GPU has fallen off the bus"),
        ("ecc-dbe", 48, 1, "uncorrectable ECC error encountered"),
        ("gsp-timeout", 119, 1, "GSP"),
        ("nvlink-error", 74, 1, "NVLink"),
        ("app-fault", 13, 134, "an illegal memory access was encountered"),
    ],
)
def test_xid_faults(
    recs,
    name,
    xid,
    exit_code,
    text,
):
    rec = recs(name)
    f = rec.truth["faults"][0]
    node, gpu = f["target"]["node"], f["target"]["gpu"]
    w = window(rec, node, gpu, ONSET + 5, ONSET + 60)
    assert (w.DCGM_FI_DEV_XID_ERRORS == xid).all()
    kernel = (rec.path / "logs" / "kernel" / f"{node}.log").read_text()
    assert "NVRM: Xid (PCI:" in kernel and f"): {xid}, " in kernel
    assert text in kernel + job_log(rec)
    assert job_meta(rec)["state"] == "FAILED" and job_meta(rec)["exit_code"] == exit_code
    assert "ChildFailedError" in job_log(rec)
    if name == "xid79-off-bus":
        assert w.DCGM_FI_DEV_GPU_UTIL.isna().all()  # a GPU off the bus reports only its XID


def test_degradation_counters_rise_without_job_impact(recs):
    rec = recs("degradation")
    w = window(rec, "node2", 2, ONSET, 1200)
    assert w.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL.iloc[-1] > w.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL.iloc[0] + 50
    assert w.DCGM_FI_DEV_PCIE_REPLAY_COUNTER.iloc[-1] > 0
    assert w.DCGM_FI_DEV_ROW_REMAP_PENDING.iloc[-1] == 1
    assert job_meta(rec)["state"] == "RUNNING"
    assert rec.truth["faults"][0]["action"] == "drain"


def test_ib_flap_nccl_timeouts_on_all_ranks(recs):
    rec = recs("ib-flap")
    log = job_log(rec)
    assert "NET/IB : Got async event : port error" in log
    for r in range(16):
        assert f"[Rank {r}] Watchdog caught collective operation timeout" in log
    assert "ib0: Link DOWN" in (rec.path / "logs" / "kernel" / "node2.log").read_text()
    assert job_meta(rec)["state"] == "FAILED"


def test_node_lost(recs):
    rec = recs("node-lost")
    g = rec.gpu_frame()
    t0 = rec.meta["start"]
    assert g[(g.node == "node2") & (g.timestamp > t0 + ONSET + 5)].empty
    assert "DUE TO NODE FAILURE" in job_log(rec)
    job = job_meta(rec)
    assert job["restarts"] == 1 and job["state"] in ("PENDING", "RUNNING")


def test_fs_stall_all_jobs_then_recovers(recs):
    rec = recs("fs-stall")
    for node in ("node1", "node3"):
        w = window(rec, node, 0, ONSET + 15, ONSET + 400)
        assert w.DCGM_FI_DEV_GPU_UTIL.max() == 0
        assert "LustreError" in (rec.path / "logs" / "kernel" / f"{node}.log").read_text()
    after = window(rec, "node1", 0, ONSET + 480, 1200)
    assert after.DCGM_FI_DEV_GPU_UTIL.max() > 90
    assert rec.truth["faults"][0]["action"] == "hold_for_person"
    assert set(rec.truth["faults"][0]["job_ids"]) == {"1001", "1002"}


@pytest.mark.parametrize(
    "name,exit_code,text",
    [
        ("cuda-oom", 1, "torch.cuda.OutOfMemoryError: CUDA out of memory"),
        ("segfault", 139, "Segmentation fault"),
    ],
)
def test_workload_crashes(recs, name, exit_code, text):
    rec = recs(name)
    assert text in job_log(rec)
    assert job_meta(rec)["exit_code"] == exit_code
    assert job_meta(rec)["state"] == "FAILED"
    assert rec.truth["faults"][0]["nodes"] == []


def test_healthy_has_benign_dips_and_no_failures(recs):
    rec = recs("healthy-short")
    assert all(j["state"] in ("RUNNING", "COMPLETED") for j in rec.meta["jobs"])
    log = job_log(rec)
    assert "successfully saved checkpoint" in log and "validation loss" in log
    w = window(rec, "node1", 0, 100, 1200)
    assert w.DCGM_FI_DEV_GPU_UTIL.min() < 10  # checkpoint dips
    assert (w.DCGM_FI_DEV_XID_ERRORS == 0).all()
    assert rec.truth["faults"] == [] and rec.truth["expect"] == "healthy"


def test_same_seed_same_recording(tmp_path):
    a = run_scenario(SCENARIOS / "spin-hang.yaml", seed=3, out=tmp_path / "a")
    b = run_scenario(SCENARIOS / "spin-hang.yaml", seed=3, out=tmp_path / "b")
    for name in ("gpu_metrics.csv.gz", "job_metrics.csv.gz"):
        assert gzip.open(a.path / name).read() == gzip.open(b.path / name).read()
    assert json.loads((a.path / "truth.json").read_text()) == b.truth
    c = run_scenario(SCENARIOS / "spin-hang.yaml", seed=4, out=tmp_path / "c")
    assert (
        gzip.open(a.path / "gpu_metrics.csv.gz").read()
        != gzip.open(c.path / "gpu_metrics.csv.gz").read()
    )


def test_recording_keeps_timestamps_to_the_millisecond():
    from exporters.sim.recording import _num

    assert _num(1735689612.3456) == "1735689612.346"
    assert _num(57.123456789) == "57.1235"
    assert _num(float("nan")) == "nan"


def test_a_persistent_cause_fails_every_restart_the_same_way(tmp_path):
    """A missing file (log-signature.yaml: `persists: 1`) is still missing after a requeue:
    the next run fails the same way once its start-up is over, on the same rank. Before, the
    requeued job ran on as if the file had come back, so a wrong requeue looked like a cure."""
    from exporters.sim import Simulation, load_scenario
    from exporters.sim.logs import LogSink

    for d in ("jobs", "kernel"):
        (tmp_path / d).mkdir()
    sink = LogSink(tmp_path)
    sim = Simulation(load_scenario(SCENARIOS / "log-signature.yaml"), sink=sink)
    c = sim.cluster
    while sim.elapsed < ONSET + 10:
        sim.step(5.0)
    job = c.jobs["1001"]
    assert job.state == "FAILED"
    c.requeue("1001")  # Goodput's requeue for a workload_crash: the file is still missing
    while sim.elapsed < ONSET + 120:
        sim.step(5.0)
    sink.close()
    assert job.restarts == 1 and job.state == "FAILED" and job.exit_code == 1
    assert job.end_t - job.start_t == pytest.approx(job.startup_s + 1.0)
    assert job.last_progress_t < job.start_t  # it never stepped
    (fault,) = c.faults.values()
    assert fault["relapses"] == [job.start_t]
    log = (tmp_path / "jobs" / "slurm-1001.out").read_text()
    assert log.count("FileNotFoundError: [Errno 2] No such file or directory") == 2
    assert log.count("ChildFailedError") == 2
    # a cause that does not persist (the default) is gone after a restart
    sc = load_scenario(SCENARIOS / "log-signature.yaml").model_dump()
    sc["faults"][0]["params"] = {"pattern": "missing_file"}
    from exporters.sim import parse_scenario

    sim = Simulation(parse_scenario(sc))
    while sim.elapsed < ONSET + 10:
        sim.step(5.0)
    sim.cluster.requeue("1001")
    while sim.elapsed < ONSET + 120:
        sim.step(5.0)
    assert sim.cluster.jobs["1001"].state == "RUNNING"


def test_healthy_gpus_show_a_benign_background(tmp_path):
    """Real fleets show a trickle of correctable ECC errors, PCIe replays and NVLink CRC
    flits on healthy GPUs, and an application XID an earlier job left on a GPU's gauge.
    Before, every error counter of a healthy GPU stayed at 0 and every XID gauge at 0: a
    detector that acted on any movement at all could not be caught. The rates stay far below
    what the alerts and the detector call degradation (exporters/sim/background.py)."""
    import numpy as np

    from detector import fields as DF
    from exporters.sim import FIELD_NAMES, Simulation, load_scenario

    sc = load_scenario(SCENARIOS / "healthy-short.yaml")
    counters = (
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    )
    idx = [FIELD_NAMES.index(f) for f in counters]
    xid = FIELD_NAMES.index("DCGM_FI_DEV_XID_ERRORS")
    sim = Simulation(sc)
    gpus = [g for n in sim.cluster.nodes.values() for g in n.gpus]
    stale = sim.cluster.nodes["node3"].gpus[5]
    rows = []
    hours = 8.0  # as long as healthy-long: the trickle accumulates over a GPU's first sight
    while sim.elapsed < hours * 3600:
        sim.step(60.0)  # the trickle does not depend on the step
        rows.append([[g.values[i] for i in idx] for g in gpus])
        if sim.elapsed == 600:
            assert stale.job_id  # a healthy job runs on the GPU with the stale XID
            assert stale.values[xid] == 13
    a = np.array(rows)  # time, GPU, counter
    rise = a[-1] - a[0]
    for k, name in enumerate(counters):
        assert (rise[:, k] > 0).any(), f"{name}: no healthy GPU ever moved"
        assert (rise[:, k] > 0).mean() < 0.5, f"{name}: most GPUs should stay clean"
        # far below the detector's allowance over the whole run ...
        assert rise[:, k].max() <= DF.COUNTERS[name] / 2
    # ... and never near GoodputGPUDegradation's > 10 in 5 minutes
    assert (a[5:, :, :2] - a[:-5, :, :2]).max() <= 5
    assert (a[0] > 0).any()  # counters start where a fleet's do (since boot, lifetime)
    assert {g.xid for g in gpus} == {0, 13}
    # the background has its own random stream: the rest of the simulation is unchanged
    off = sc.model_copy(update={"background": sc.background.model_copy(update={"scale": 0.0})})
    a1, a0 = Simulation(sc), Simulation(off)
    for _ in range(40):
        a1.step(5.0)
        a0.step(5.0)
    power = FIELD_NAMES.index("DCGM_FI_DEV_POWER_USAGE")
    g1 = [g.values[power] for n in a1.cluster.nodes.values() for g in n.gpus]
    g0 = [g.values[power] for n in a0.cluster.nodes.values() for g in n.gpus]
    assert g1 == g0
    c0 = [g.values[idx[0]] for n in a0.cluster.nodes.values() for g in n.gpus]
    assert set(c0) == {0.0}

"""The engine on synthetic scenarios: quiet through checkpoints, culprit node highest on faults,
baselines kept per job name across a requeue, replay inputs."""

from __future__ import annotations

import io
import json

import numpy as np
import pandas as pd
import pytest

from detector import fields as F
from detector.baselines import BaselineStore
from detector.frame import Frame, FrameError
from detector.pipeline import Config, Engine
from detector.replay import load, replay
from detector.synthetic import healthy_frame

COL = {n: i for i, n in enumerate(F.ALL_FIELDS)}
CFG = dict(warmup_s=60.0, fit_after_s=300.0, refit_s=600.0)


def scenario(steps=240, checkpoints=True, seed=0):
    """One job on 3 nodes x 8 GPUs, 5 s samples; a 40 s checkpoint every 300 s."""
    f = healthy_frame(jobs=1, nodes=3, steps=steps, seed=seed)
    if checkpoints:
        phase = f.time % 300.0
        ck = (phase >= 200) & (phase < 240) & (f.time > 0)
        v = f.values
        v[ck, COL["DCGM_FI_DEV_GPU_UTIL"]] = 0.0
        v[ck, COL["DCGM_FI_DEV_POWER_USAGE"]] = 124.0
        for c in (
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "DCGM_FI_PROF_SM_ACTIVE",
            "DCGM_FI_PROF_DRAM_ACTIVE",
        ):
            v[ck, COL[c]] = 0.0
        v[ck, COL[F.STALL_SECONDS]] = phase[ck] - 200.0
    return f


def run(frame, store=None, names=None, engine=None):
    eng = engine or Engine(Config(**CFG), store)
    results = [eng.step(frame.take(r), float(frame.time[r[0]]), names) for r in frame.instants()]
    return eng, results


def peak(results, t0=0.0):
    job = max(
        (
            r.jobs[r.jobs.detector == "combined"].score.max()
            for r in results
            if r.frame.time[0] >= t0
        ),
        default=0.0,
    )
    nodes = pd.concat([r.nodes for r in results if r.frame.time[0] >= t0])
    return job, nodes.groupby("node").score.max()


def test_healthy_with_checkpoints_stays_quiet():
    _, results = run(scenario())
    job, nodes = peak(results)
    assert job < 1.0 and nodes.max() < 1.0


def test_spin_hang_flags_job_and_culprit_node():
    f = scenario()
    hang = f.time >= 900
    f.values[hang, COL["DCGM_FI_DEV_GPU_UTIL"]] = 100.0
    f.values[hang, COL["DCGM_FI_DEV_POWER_USAGE"]] = 125.0
    f.values[hang, COL["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]] = 0.008
    f.values[hang, COL["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]] = 0.0
    f.values[hang, COL[F.STALL_SECONDS]] = f.time[hang] - 900
    stuck = hang & (f.node == "node2") & (f.gpu == 5)
    f.values[stuck, COL["DCGM_FI_DEV_GPU_UTIL"]] = 0.0
    _, results = run(f)
    before, _ = peak([r for r in results if r.frame.time[0] < 900])
    job, nodes = peak(results, 900)
    assert before < 1.0
    assert job > 1.0
    assert nodes.idxmax() == "node2" and nodes["node2"] > 1.0
    assert nodes.drop("node2").max() < 1.0


def test_thermal_straggler_localised():
    f = scenario(checkpoints=False)
    hot = (f.time >= 900) & (f.node == "node3") & (f.gpu == 1)
    f.values[hot, COL["DCGM_FI_DEV_SM_CLOCK"]] = 1100.0
    f.values[hot, COL["DCGM_FI_DEV_GPU_TEMP"]] = 88.0
    f.values[f.time >= 900, COL[F.ITER_SECONDS]] *= 1.35
    _, results = run(f)
    job, nodes = peak(results, 900)
    assert job > 1.0 and nodes.idxmax() == "node3" and nodes["node3"] > 1.0


SAVE_AT = 401.0  # a 3 s save between the cycles at 400 s and 405 s: no cycle sees it open
IDLE = {  # an H200 during a save: idle, its memory held (failures.md)
    "DCGM_FI_DEV_GPU_UTIL": 0.0,
    "DCGM_FI_DEV_POWER_USAGE": 130.0,
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.0,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.0,
    "DCGM_FI_PROF_SM_ACTIVE": 0.0,
    "DCGM_FI_PROF_DRAM_ACTIVE": 0.0,
}


def _short_save(steps: int = 120) -> Frame:
    """One job on 2 nodes x 4 GPUs, 5 s cycles; its log says a save began at `SAVE_AT` and
    progress went on 3 s later (every cycle from 405 s sees the pause closed)."""
    f = healthy_frame(jobs=1, nodes=2, gpus=4, steps=steps, seed=2)
    after = f.time > SAVE_AT
    f.values[after, COL[F.SINCE_PAUSE]] = f.time[after] - SAVE_AT
    f.values[after, COL[F.STALL_SECONDS]] = 0.1
    return f


def test_a_save_no_cycle_saw_held_on_one_node_for_a_scrape_raises_nothing():
    """node2 was scraped during the save (idle) and scraped again 30 s later: its reading from
    the save is its latest for six cycles, bit for bit, while node1 works. Before, the save
    was never seen open and nothing was capped: peer and shift flagged the job's GPUs (the
    reviewer's 2-node replay of the real H200 trace: 74 firing episodes in 20 minutes)."""
    f = _short_save()
    held = (f.node == "node2") & (f.time >= 405.0) & (f.time < 435.0)
    for name, v in IDLE.items():
        f.values[held, COL[name]] = v
    first = np.flatnonzero(held)[:4]  # each GPU's reading as scraped, held until 435 s
    f.values[held] = np.tile(f.values[first], (int(held.sum()) // 4, 1))
    _, results = run(f)
    job, nodes = peak(results, 300.0)
    gpu = max(float(r.gpu.max()) for r in results if r.frame.time[0] >= 300.0)
    assert job < 1.0 and nodes.max() < 1.0 and gpu < 1.0, (job, nodes.to_dict(), gpu)


def test_a_gpu_that_stays_off_after_a_save_is_still_flagged():
    """The cover lasts while a reading may be from the save: a GPU of node2 that works at half
    its power and activity from the save on (fresh readings each cycle) is flagged as ever."""
    f = _short_save()
    slow = (f.node == "node2") & (f.gpu == 1) & (f.time >= 405.0)
    f.values[slow, COL["DCGM_FI_DEV_GPU_UTIL"]] = 55.0
    f.values[slow, COL["DCGM_FI_DEV_POWER_USAGE"]] -= 300.0
    f.values[slow, COL["DCGM_FI_PROF_SM_ACTIVE"]] = 0.5
    _, results = run(f)
    flagged = [
        float(r.frame.time[0])
        for r in results
        if r.frame.time[0] >= 405.0 and (r.nodes.score >= 1.0).any()
    ]
    assert flagged and flagged[0] <= 405.0 + 25.0, flagged[:3]
    _, nodes = peak(results, 405.0)
    assert nodes.idxmax() == "node2"


def test_node_lost_marks_missing_node():
    f = scenario(checkpoints=False)
    f = f.take(np.flatnonzero(~((f.time >= 900) & (f.node == "node1"))))
    _, results = run(f)
    _, nodes = peak(results, 900)
    assert nodes.idxmax() == "node1" and nodes["node1"] >= 2.0


@pytest.mark.parametrize("silent", [("node1", "node2", "node3"), ("node1", "node2")])
def test_more_nodes_silent_than_answering_is_the_way_to_them_not_lost_nodes(silent):
    """A scrape-side outage (Prometheus answers, the exporters' series are gone) must not
    score every job and node at twice the alert level: that restarts a whole cluster."""
    f = scenario(checkpoints=False)
    f = f.take(np.flatnonzero(~((f.time >= 900) & np.isin(f.node, silent))))
    eng, _ = run(f.take(np.flatnonzero(f.time < 900)))
    later = f.take(np.flatnonzero(f.time >= 900))
    at = [later.take(np.flatnonzero(later.time == t)) for t in range(900, 1100, 5)]
    results = [eng.step(x, t) for x, t in zip(at, range(900, 1100, 5), strict=True)]
    assert all("missing" not in set(r.jobs.detector) for r in results)
    assert max((r.nodes.score.max() for r in results if len(r.nodes)), default=0.0) < 1.0


def test_baseline_kept_by_job_name_across_requeue(tmp_path):
    store = BaselineStore(tmp_path)
    eng, _ = run(scenario(checkpoints=False), store, {"100": "llama-70b"})
    assert store.path("llama-70b").exists()
    # the requeued job (same name, new id) has its baseline from its first cycle
    again = healthy_frame(jobs=1, nodes=3, steps=1, seed=9, first_job=200)
    eng2 = Engine(Config(**CFG), BaselineStore(tmp_path))
    eng2.step(again, 0.0, {"200": "llama-70b"})
    assert eng2.base.jobs["200"].loaded and "200" in eng2.det["deviation"].jobs()
    again.values[0, COL["DCGM_FI_DEV_POWER_USAGE"]] = 125.0
    assert eng2.det["deviation"].score(again)[0] > 1.0


def test_bad_baseline_file_is_ignored(tmp_path):
    store = BaselineStore(tmp_path)
    store.path("x").parent.mkdir(parents=True, exist_ok=True)
    store.path("x").write_text(
        json.dumps({"format": "goodput-baseline/1", "job_name": "x", "detectors": {"evil": {}}})
    )
    assert store.load("x", {"deviation"}) is None and "unknown detectors" in store.errors[0]
    store.path("x").write_text("not json")
    assert store.load("x", {"deviation"}) is None


def test_online_state_is_small():
    eng, _ = run(healthy_frame(jobs=4, nodes=2, steps=5, seed=1))
    assert eng.state_bytes_per_gpu() <= 2048


def _csv(frame: Frame) -> pd.DataFrame:
    df = pd.DataFrame(frame.values[:, : len(F.DCGM_FIELDS)], columns=F.DCGM_FIELDS)
    df.insert(0, "timestamp", frame.time)
    df.insert(1, "hostname", frame.node)
    df.insert(2, "gpu", frame.gpu)
    df.insert(3, "hpc_job", frame.job)
    return df


def test_replay_csv_writes_detections(tmp_path):
    f = scenario(checkpoints=False)
    f.values[(f.time >= 900) & (f.node == "node2"), COL[F.XID_FIELD]] = 79
    path = tmp_path / "dcgm.csv"
    _csv(f).to_csv(path, index=False)
    out = io.StringIO()
    summary = replay(path, out)
    rows = [json.loads(x) for x in out.getvalue().splitlines()]
    assert summary["detections"] == len(rows) > 0
    assert {"time", "job_id", "node", "gpu", "detector", "score", "reason"} <= set(rows[0])
    hw = [r for r in rows if r["detector"] == "hardware" and r["gpu"] is not None]
    assert hw and all(r["node"] == "node2" and r["time"] >= 900 for r in hw)
    from detector.thresholds import level

    assert hw[0]["reason"] == f"XID 79 >= alert level {level('gpu'):g} (GoodputGPUAnomaly)"


def test_replay_recording_dir_and_prometheus_json(tmp_path):
    f = healthy_frame(jobs=1, nodes=1, steps=4, seed=2)
    df = _csv(f).rename(columns={"hostname": "node", "hpc_job": "job_id"})
    df.to_csv(tmp_path / "gpu_metrics.csv.gz", index=False)
    jobs = pd.DataFrame(
        {
            "timestamp": [0.0, 10.0],
            "job_id": ["100", "100"],
            F.ITER_SECONDS: [0.5, 0.5],
            F.LAST_PROGRESS: [0.0, 9.0],
        }
    )
    jobs.to_csv(tmp_path / "job_metrics.csv.gz", index=False)
    (tmp_path / "meta.json").write_text(
        json.dumps(
            {
                "format": "goodput-recording/1",
                "interval_s": 5,
                "jobs": [{"job_id": "100", "name": "bert", "nodes": ["node1"]}],
            }
        )
    )
    frame, names, interval = load(tmp_path)
    assert names == {"100": "bert"} and interval == 5.0 and len(frame) == len(f)
    stall = frame.col(F.STALL_SECONDS)
    assert stall[frame.time == 15.0][0] == pytest.approx(6.0)
    prom = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {
                    "metric": {
                        "__name__": "DCGM_FI_DEV_GPU_UTIL",
                        "Hostname": "node1",
                        "gpu": "0",
                        "hpc_job": "7",
                    },
                    "values": [[1.0, "99"], [2.0, "98"]],
                },
                {
                    "metric": {
                        "__name__": "DCGM_FI_DEV_POWER_USAGE",
                        "Hostname": "node1",
                        "gpu": "0",
                        "hpc_job": "7",
                    },
                    "values": [[1.0, "690"], [2.0, "680"]],
                },
            ],
        },
    }
    (tmp_path / "q.json").write_text(json.dumps(prom))
    pf, _, _ = load(tmp_path / "q.json")
    assert len(pf) == 2 and pf.col("DCGM_FI_DEV_POWER_USAGE").tolist() == [690.0, 680.0]


def test_a_recordings_infinite_and_dcgm_blank_values_are_no_reading():
    """A recording exported from Prometheus carries what the exporter wrote: +Inf, -Inf and
    DCGM's blanks (9223372036854775794: a GPU without a memory temperature sensor) read as no
    reading in replay too, as the service reads them; before, replay scored them."""
    df = _csv(healthy_frame(jobs=1, nodes=1, gpus=4, steps=1, seed=3))
    df.loc[0, "DCGM_FI_DEV_MEMORY_TEMP"] = 9223372036854775794
    df.loc[1, "DCGM_FI_DEV_POWER_USAGE"] = np.inf
    df.loc[2, "DCGM_FI_DEV_GPU_UTIL"] = -np.inf
    df.loc[3, "DCGM_FI_DEV_SM_CLOCK"] = 140737488355328.0  # DCGM_FP64_BLANK
    f = Frame.from_dataframe(df)
    for row, name in enumerate(
        ("DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL")
        + ("DCGM_FI_DEV_SM_CLOCK",)
    ):
        assert np.isnan(f.col(name)[row]) and np.isfinite(np.delete(f.col(name), row)).all()
    res = Engine(Config(**CFG)).step(f, float(f.time[0]), None)
    assert np.isfinite(res.gpu).all() and res.gpu.max() < 1.0


def test_bad_inputs_give_clear_errors(tmp_path):
    (tmp_path / "a.csv").write_text("timestamp,gpu\n1,0\n")
    with pytest.raises(FrameError, match=r"a.csv: no node column \(accepted: node, Hostname"):
        load(tmp_path / "a.csv")
    (tmp_path / "b.csv").write_text("timestamp,Hostname,gpu,hpc_job\n1,node1,0,$(reboot)\n")
    with pytest.raises(FrameError, match="column 'job_id'.* not Slurm job ids"):
        load(tmp_path / "b.csv")
    with pytest.raises(FrameError, match="no such"):
        load(tmp_path / "missing.csv")


def test_alert_levels_come_from_alerts_yaml(tmp_path, monkeypatch):
    import yaml

    from alertdsl import spec as A
    from detector import thresholds
    from detector.replay import detections

    assert thresholds.level("job") == A.threshold("GoodputJobAnomaly")
    straggler = A.threshold("GoodputJobStraggler")
    doc = yaml.safe_load(A.DEFAULT_PATH.read_text())
    for alert in doc["alerts"]:
        if alert["name"] == "GoodputJobAnomaly":
            alert["conditions"][0]["threshold"] = 3.0
    path = tmp_path / "alerts.yaml"
    path.write_text(yaml.safe_dump(doc))
    f = scenario(checkpoints=False, steps=4)
    eng = Engine(Config(**CFG))
    res = eng.step(f.take(f.instants()[0]), 0.0)
    res.jobs.loc[res.jobs.detector == "combined", "score"] = 2.0
    default = [d for d in detections(res, eng.det) if d["detector"] == "combined"]
    assert default and "GoodputJobAnomaly" in default[0]["reason"]
    monkeypatch.setenv("GOODPUT_ALERTS_FILE", str(path))
    assert thresholds.level("job") == 3.0 and thresholds.level("node") == straggler
    assert not [d for d in detections(res, eng.det) if d["detector"] == "combined"]


def test_ended_jobs_are_forgotten_and_codes_compacted():
    eng = Engine(Config(**CFG))
    for i in range(6):  # 6 generations of 400 one-GPU jobs on the same 400 GPUs
        f = healthy_frame(jobs=400, nodes=1, gpus=1, steps=1, seed=i, first_job=1000 * (i + 1))
        train = healthy_frame(jobs=400, nodes=1, gpus=1, steps=25, seed=i, first_job=1000 * (i + 1))
        eng.step(f, 10.0 * i)
        eng.det["deviation"].fit(train)
        eng.end_jobs(set(f.job))
    assert len(eng.base.jobs) == 400 and set(eng.det["deviation"].jobs()) == set(f.job)
    assert len(eng.base.ids) < 6 * 400  # dead codes were compacted away
    assert [eng.base.ids[i.code] for i in eng.base.jobs.values()] == list(eng.base.jobs)
    res = eng.step(f, 60.0)  # the live jobs still score, under their remapped codes
    assert set(res.jobs.job_id) == set(f.job) and res.jobs.score.max() < 1.0


def test_a_job_absent_from_one_scrape_keeps_what_it_learned():
    """The service's end of a cycle (`end_jobs(running, now)`): a job none of whose GPUs
    answered (a missed scrape, a lost node) is kept for missing_after_s + hold_s; one whose
    GPUs answered without it (it ended, or was requeued) is forgotten at once."""
    f = scenario(steps=100, checkpoints=False)
    eng, _ = run(f)
    job = str(f.job[0])
    seen = eng.base.jobs[job].first_seen
    eng.step(f.take(np.zeros(0, dtype=int)), 505.0)  # nothing answered
    eng.end_jobs(set(), 505.0)
    assert eng.base.jobs[job].first_seen == seen
    eng.end_jobs(set(), 505.0 + eng.cfg.missing_after_s + eng.cfg.hold_s)  # silent too long
    assert job not in eng.base.jobs
    eng, _ = run(f)
    unlabelled = f.take(np.flatnonzero(f.time == f.time.max()))
    unlabelled.job[:] = ""  # the GPUs answer, without the job: it ended
    eng.step(unlabelled, 505.0)
    eng.end_jobs(set(), 505.0)
    assert job not in eng.base.jobs


def test_absent_jobs_are_judged_each_by_its_own_gpus():
    """Three jobs absent in one cycle: one whose GPUs went silent with it is kept, one whose
    GPUs answered without it is forgotten, one silent too long is forgotten."""
    f = healthy_frame(jobs=3, nodes=1, steps=100, seed=1)
    eng, _ = run(f)
    silent, ended, old = (str(j) for j in sorted(set(f.job)))
    t = float(f.time.max()) + 5.0
    last = f.take(np.flatnonzero((f.time == f.time.max()) & (f.job.astype(str) == ended)))
    last.job[:] = ""  # the GPUs answer, without the job
    eng.step(last, t)
    eng.slot_job_seen[eng.slot_job == eng.base.code[old]] -= 10_000.0  # silent long since
    eng.end_jobs(set(), t)
    assert silent in eng.base.jobs
    assert ended not in eng.base.jobs and old not in eng.base.jobs


def test_a_job_back_on_other_nodes_is_one_series():
    """A job requeued onto other GPUs under its id: the GPUs it left (held for it for hold_s)
    and its new ones are one job, one series per detector (two were exposed, the stale run's
    first, so Prometheus kept that one)."""
    f = scenario(steps=100, checkpoints=False)
    eng, _ = run(f)
    left = f.take(np.flatnonzero(f.time == f.time.max()))
    left.job[:] = ""
    eng.step(left, 505.0)
    eng.end_jobs(set(), 505.0)
    back = healthy_frame(jobs=1, nodes=1, steps=1, start=510.0, first_job=int(f.job[0]))
    back.node[:] = "node9"
    res = eng.step(back, 510.0)
    assert not res.jobs.duplicated(["job_id", "detector"]).any()


def test_a_counter_reset_moves_the_hardware_baseline_down():
    """Volatile ECC counters go back to 0 on a GPU reset (the slot is kept): two new
    double-bit errors after it must score, though they stay under the count first seen."""
    f = healthy_frame(jobs=1, nodes=1, steps=40, seed=0)
    dbe = COL["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]
    g0 = f.gpu == 0
    f.values[:, dbe] = 0.0
    f.values[g0, dbe] = 3.0  # at first sight
    f.values[g0 & (f.time >= 50), dbe] = 0.0  # reset
    f.values[g0 & (f.time >= 100), dbe] = 2.0  # two new errors
    eng, results = run(f)
    hw = eng.names.index("hardware")
    late = [r.gpu[r.frame.gpu == 0, hw].max() for r in results if r.frame.time[0] >= 100]
    early = [r.gpu[:, hw].max() for r in results if r.frame.time[0] < 100]
    assert max(early) == 0.0 and min(late) >= 1.0

"""Control API and scheduler verbs (Slurm semantics), bad input, exposition conventions."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from exporters.sim import FIELDS, ScenarioError, Simulation, parse_scenario, render_node
from exporters.sim.api import build_app
from exporters.sim.jobmode import expand_nodelist, job_env


def make(nodes=4, jobs=None):
    sc = parse_scenario({"name": "t", "duration_s": 3600, "nodes": nodes, "jobs": jobs or []})
    sim = Simulation(sc, seed=1)
    return sim, TestClient(build_app(sim))


def test_submit_place_drain_requeue_excluding_hold_release_cancel():
    sim, api = make()
    j = api.post("/api/v1/scheduler/jobs", json={"name": "a", "nodes": 2, "comment": "{}"})
    assert j.status_code == 201 and j.json()["state"] == "PENDING"
    jid = j.json()["job_id"]
    sim.step(5)
    job = api.get(f"/api/v1/scheduler/jobs/{jid}").json()
    assert job["state"] == "RUNNING" and job["nodes"] == ["node1", "node2"]
    states = {n["node"]: n["state"] for n in api.get("/api/v1/scheduler/nodes").json()}
    assert states == {"node1": "ALLOCATED", "node2": "ALLOCATED", "node3": "IDLE", "node4": "IDLE"}
    r = api.post("/api/v1/scheduler/nodes/node2/drain", json={"reason": "xid 79"})
    assert r.json() == {"node": "node2", "state": "DRAIN", "reason": "xid 79"}
    r = api.post(f"/api/v1/scheduler/jobs/{jid}/requeue", json={"exclude": ["node2"], "hold": True})
    assert r.json()["state"] == "PENDING" and r.json()["held"] and r.json()["restarts"] == 1
    assert r.json()["excluded"] == ["node2"]
    sim.step(5)
    assert api.get(f"/api/v1/scheduler/jobs/{jid}").json()["state"] == "PENDING"  # held
    assert {n["node"]: n["state"] for n in api.get("/api/v1/scheduler/nodes").json()}[
        "node2"
    ] == "DRAINED"
    api.post(f"/api/v1/scheduler/jobs/{jid}/release")
    sim.step(5)
    job = api.get(f"/api/v1/scheduler/jobs/{jid}").json()
    assert job["state"] == "RUNNING" and "node2" not in job["nodes"]
    assert api.post(f"/api/v1/scheduler/jobs/{jid}/hold").status_code == 409  # running
    assert api.post(f"/api/v1/scheduler/jobs/{jid}/cancel").json()["state"] == "CANCELLED"
    assert api.post(f"/api/v1/scheduler/jobs/{jid}/cancel").status_code == 409
    assert api.post("/api/v1/scheduler/nodes/node2/resume").json()["state"] == "IDLE"
    assert api.post("/api/v1/scheduler/nodes/node2/resume").status_code == 409
    assert api.get("/api/v1/scheduler/jobs/999").status_code == 404


def test_fault_injection_errors_name_the_field():
    sim, api = make(jobs=[{"name": "a", "nodes": 2}])
    sim.step(5)
    cases = [
        ({"kind": "nope", "node": "node1"}, "kind"),
        ({"kind": "xid79_off_bus"}, "node"),
        ({"kind": "xid79_off_bus", "node": "node9"}, "node"),
        ({"kind": "xid79_off_bus", "node": "node1", "gpu": 9}, "gpu"),
        ({"kind": "cuda_oom", "node": "node3"}, "job_id"),
        ({"kind": "spin_hang", "node": "node1", "params": {"timeout_s": "x"}}, "params.timeout_s"),
        ({"kind": "spin_hang", "node": "bad name;rm"}, "node"),
        ({"kind": "spin_hang", "job_id": "abc"}, "job_id"),
        ({"kind": "spin_hang", "node": "node1", "color": 1}, "color"),
    ]
    for body, field in cases:
        r = api.post("/api/v1/faults", json=body)
        assert r.status_code in (404, 409, 422), (body, r.text)
        assert field in r.text, (body, r.text)
    assert api.post("/api/v1/faults", content=b"{not json").status_code == 422
    ok = api.post("/api/v1/faults", json={"kind": "spin_hang", "job_id": "1001"})
    assert ok.status_code == 201 and ok.json()["nodes"] == ["node1"]
    assert api.delete(f"/api/v1/faults/{ok.json()['fault_id']}").json()["active"] is False
    assert api.delete("/api/v1/faults/f99").status_code == 404


def test_node_lost_closes_exposition_and_fails_job_then_repair():
    sim, api = make(jobs=[{"name": "a", "nodes": 2, "requeue": False}])
    sim.step(5)
    api.post("/api/v1/faults", json={"kind": "node_lost", "node": "node2"})
    sim.step(5)
    assert not sim.cluster.nodes["node2"].alive
    sim.step(10)
    nodes = {n["node"]: n for n in api.get("/api/v1/scheduler/nodes").json()}
    assert nodes["node2"]["state"] == "DOWN" and nodes["node2"]["reason"] == "Not responding"
    assert api.get("/api/v1/scheduler/jobs/1001").json()["state"] == "NODE_FAIL"
    api.post("/api/v1/nodes/node2/repair")
    assert {n["node"]: n["state"] for n in api.get("/api/v1/scheduler/nodes").json()}[
        "node2"
    ] == "IDLE"


def test_bad_scenarios_name_the_field():
    bad = [
        ({"name": "x"}, "duration_s"),
        ({"name": "x", "duration_s": 10, "jobs": [{"name": "a", "nodes": 9}]}, "jobs.0.nodes"),
        ({"name": "x", "duration_s": 10, "faults": [{"kind": "zap", "at_s": 1}]}, "faults.0.kind"),
        (
            {
                "name": "x",
                "duration_s": 10,
                "faults": [{"kind": "cuda_oom", "at_s": 1, "job": "q"}],
            },
            "faults.0.job",
        ),
        (
            {"name": "x", "duration_s": 10, "jobs": [{"name": "a", "step_time_s": -1}]},
            "jobs.0.step_time_s",
        ),
        ({"name": "x", "duration_s": 10, "extra": 1}, "extra"),
    ]
    for data, field in bad:
        with pytest.raises(ScenarioError, match=re.escape(field)):
            parse_scenario(data)
    with pytest.raises(ScenarioError, match="mapping"):
        parse_scenario(["not", "a", "mapping"])


def test_scenario_fault_on_a_job_that_is_not_running_is_an_error_not_a_crash():
    sc = parse_scenario(
        {
            "name": "x",
            "duration_s": 60,
            "nodes": 1,
            "jobs": [{"name": "a", "nodes": 1}, {"name": "b", "nodes": 1}],
            "faults": [{"kind": "cuda_oom", "at_s": 10, "job": "b"}],
        }
    )
    sim = Simulation(sc)
    for _ in range(4):
        sim.step(5)
    assert sim.errors and "not RUNNING" in sim.errors[0]["error"]


LINE = re.compile(
    r"^(DCGM_FI_[A-Z0-9_]+|goodput_gpu_process_cpu_seconds_total)\{([^}]*)\} (-?[0-9.e+]+)$"
)


def test_exposition_follows_dcgm_exporter_conventions():
    sim, _ = make(jobs=[{"name": "a", "nodes": 1}])
    sim.step(30)
    text = render_node(sim.cluster.nodes["node1"]).decode()
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    assert set(types) == {f[0] for f in FIELDS}
    assert types["DCGM_FI_DEV_GPU_UTIL"] == "gauge"
    assert types["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"
    assert types["DCGM_FI_DEV_XID_ERRORS"] == "gauge"
    assert types["goodput_gpu_process_cpu_seconds_total"] == "counter"  # the NVML exporter's
    for needed in (
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    ):
        assert needed in types
    samples = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert len(samples) == 8 * len(FIELDS)
    for ln in samples:
        m = LINE.match(ln)
        assert m, ln
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if not m.group(1).startswith("DCGM_"):  # the NVML exporter's own: Goodput's labels
            assert labels == {"node": "node1", "gpu": labels["gpu"], "model_name": "NVIDIA H200",
                              "job_id": "1001"}  # fmt: skip
            continue
        assert list(labels)[:7] == [
            "gpu",
            "UUID",
            "pci_bus_id",
            "device",
            "modelName",
            "Hostname",
            "DCGM_FI_DRIVER_VERSION",
        ]
        assert labels["hpc_job"] == "1001" and labels["Hostname"] == "node1"
        assert labels["device"] == f"nvidia{labels['gpu']}"
        assert re.match(
            r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", labels["UUID"]
        )
    idle = render_node(sim.cluster.nodes["node2"], host_label="hostname").decode()
    assert 'hostname="node2"' in idle and "hpc_job" not in idle
    util = [float(ln.rsplit(" ", 1)[1]) for ln in samples if ln.startswith("DCGM_FI_DEV_GPU_UTIL")]
    assert all(0 <= u <= 100 for u in util)


def test_job_env_from_slurm():
    assert expand_nodelist("node[1-3,5],gpu07") == ["node1", "node2", "node3", "node5", "gpu07"]
    assert expand_nodelist("node[08-10]") == ["node08", "node09", "node10"]
    info = job_env(
        {
            "SLURM_JOB_ID": "42",
            "SLURM_JOB_NAME": "x",
            "SLURM_JOB_NODELIST": "node2",
            "CUDA_VISIBLE_DEVICES": "0,1",
            "SLURM_RESTART_COUNT": "1",
        }
    )
    assert info["nodes"] == ["node2"] and info["gpus"] == [0, 1] and info["restarts"] == 1
    with pytest.raises(ValueError, match="SLURM_JOB_ID"):
        job_env({"SLURM_JOB_ID": "1; rm -rf /"})


def test_register_real_slurm_job_marks_gpus():
    sc = parse_scenario({"name": "t", "duration_s": 3600, "nodes": 4})
    sim = Simulation(sc, scheduler="slurm")
    api = TestClient(build_app(sim))
    r = api.post(
        "/api/v1/register", json={"job_id": "77", "name": "x", "nodes": ["node3"], "gpus": [0, 1]}
    )
    assert r.status_code == 200 and r.json()["state"] == "RUNNING"
    sim.step(5)
    text = render_node(sim.cluster.nodes["node3"]).decode()
    dcgm = sum(n.startswith("DCGM_") for n, _, _ in FIELDS)
    assert text.count('hpc_job="77"') == 2 * dcgm and text.count('job_id="77"') == 2  # + own
    assert api.post("/api/v1/scheduler/nodes/node3/drain").status_code == 409
    log = api.get("/api/v1/jobs/77/log").json()
    assert not any("NCCL INFO" in ln for ln in log["lines"])  # processes still starting
    sim.step(15)  # the start-up lines come just before the first iteration (init_s 20 s)
    log = api.get("/api/v1/jobs/77/log").json()
    assert any("NCCL INFO" in ln for ln in log["lines"])

    def register(**over):
        body = {"job_id": "78", "name": "x", "nodes": ["node4"], "gpus": [0], **over}
        return api.post("/api/v1/register", json=body).status_code

    assert register(nodes=["zz"]) == 422
    # a GPU the node lacks answered 500; a pid past Linux's limit was taken, then froze the
    # simulation's tick (os.kill overflowed)
    for over in ({"gpus": [99]}, {"gpus": [-1]}, {"gpus": [1, 1]}, {"pid": 10**30}):
        assert register(**over) == 422, over
    sim.step(5)
    assert register() == 200

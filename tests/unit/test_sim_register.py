"""Real-Slurm registration: the job's own process is watched (and killed with a lost node)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from fastapi.testclient import TestClient

from exporters.sim import Simulation, parse_scenario
from exporters.sim.api import build_app


def _sim() -> tuple[Simulation, TestClient]:
    sc = parse_scenario({"name": "t", "duration_s": 3600, "nodes": 2})
    sim = Simulation(sc, scheduler="slurm")
    return sim, TestClient(build_app(sim))


def test_registered_job_whose_process_ends_is_cancelled():
    sim, api = _sim()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        body = {"job_id": "91", "name": "x", "nodes": ["node1"], "gpus": [0], "pid": proc.pid}
        assert api.post("/api/v1/register", json=body).status_code == 200
        assert sim.cluster.jobs["91"].os_pid == proc.pid
        sim.step(1)
        assert api.get("/api/v1/jobs/91").json()["state"] == "RUNNING"
    finally:
        proc.kill()
        proc.wait()
    sim.step(1)
    assert api.get("/api/v1/jobs/91").json()["state"] == "CANCELLED"
    assert sim.cluster.nodes["node1"].jobs == []


def test_node_lost_hook_gets_the_registered_process():
    sim, api = _sim()
    seen: list[tuple[str, list[int]]] = []
    sim.cluster.on_node_lost = lambda node, jobs: seen.append((node, [j.os_pid for j in jobs]))
    body = {"job_id": "92", "name": "x", "nodes": ["node2"], "gpus": [0, 1], "pid": 4242}
    api.post("/api/v1/register", json=body)
    r = api.post("/api/v1/faults", json={"kind": "node_lost", "node": "node2"})
    assert r.status_code == 201, r.text
    assert seen == [("node2", [4242])]


def test_register_takes_job_timing():
    sim, api = _sim()
    body = {
        "job_id": "93",
        "name": "fast",
        "nodes": ["node1"],
        "gpus": [0],
        "step_time_s": 0.5,
        "init_s": 0,
        "warmup_s": 0,
        "log_interval": 2,
    }
    assert api.post("/api/v1/register", json=body).status_code == 200
    for _ in range(10):
        sim.step(0.5)
    lines = [ln for ln in api.get("/api/v1/jobs/93/log").json()["lines"] if " iteration " in ln]
    assert len(lines) >= 4
    ms = [float(re.search(r"per iteration \(ms\): ([0-9.]+)", ln).group(1)) for ln in lines]
    assert all(450 < m < 550 for m in ms), ms
    bad = {**body, "job_id": "94", "step_time_s": 0}
    r = api.post("/api/v1/register", json=bad)
    assert r.status_code == 422 and "step_time_s" in r.text


def test_node_lost_kills_the_jobs_slurmstepd_before_the_job(tmp_path, monkeypatch):
    """A power loss leaves nobody to report the job's end: its slurmstepd dies with it."""
    from exporters.sim import slurmctl
    from exporters.sim.jobs import Job

    monkeypatch.setenv("GOODPUT_STACK_DIR", str(tmp_path))  # no slurmd pidfile here
    stepd = tmp_path / "slurmstepd"
    stepd.symlink_to("/bin/sh")  # a process whose comm is "slurmstepd"
    parent = subprocess.Popen(
        [str(stepd), "-c", "sleep 30 & echo $!; wait"], stdout=subprocess.PIPE
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert slurmctl._stepd_of(child) == parent.pid
    slurmctl.kill_node("node1", [Job("95", "x", 1, os_pid=child)])
    assert parent.wait(5) == -9
    for _ in range(50):  # the orphaned child was killed too (gone, or a zombie)
        try:
            if Path(f"/proc/{child}/stat").read_text().rpartition(")")[2].split()[0] == "Z":
                break
        except OSError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the job's process survived")

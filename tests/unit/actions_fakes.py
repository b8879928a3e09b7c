"""A tiny fake of the simulator's scheduler control API (the shapes in the contracts), for
testing the simulated adapter and the action orchestration without a simulator."""

from __future__ import annotations

import time

from fastapi import FastAPI, HTTPException
from fastapi.testclient import TestClient


def make_fake_sim(nodes=("node1", "node2", "node3", "node4")):
    app = FastAPI()
    st = {
        "nodes": {n: {"node": n, "state": "IDLE", "reason": ""} for n in nodes},
        "jobs": {},
        "calls": [],
    }

    def place(job):
        for n, s in st["nodes"].items():
            if n not in job["excluded"] and s["state"] == "IDLE":
                job.update(
                    state="RUNNING", nodes=[n], start_time=time.time(), held=False, reason=""
                )
                s["state"] = "ALLOCATED"
                return
        job.update(state="PENDING", nodes=[], reason="Resources")

    def free(job):
        for n in job["nodes"]:
            s = st["nodes"][n]
            s["state"] = "DRAINED" if s["state"].startswith("DRAIN") else "IDLE"
        job["nodes"] = []

    def get_job(job_id):
        if job_id not in st["jobs"]:
            raise HTTPException(404, "no such job")
        return st["jobs"][job_id]

    @app.get("/api/v1/scheduler/nodes")
    def nodes_():
        return list(st["nodes"].values())

    @app.get("/api/v1/scheduler/jobs/{job_id}")
    def job_(job_id: str):
        return get_job(job_id)

    @app.post("/api/v1/scheduler/nodes/{node}/drain")
    def drain(node: str, body: dict):
        st["calls"].append(("drain", node))
        s = st["nodes"][node]
        s.update(state="DRAIN" if s["state"] == "ALLOCATED" else "DRAINED", reason=body["reason"])
        return s

    @app.post("/api/v1/scheduler/nodes/{node}/resume")
    def resume(node: str):
        st["calls"].append(("resume", node))
        s = st["nodes"][node]
        busy = any(node in j["nodes"] for j in st["jobs"].values())
        s.update(state="ALLOCATED" if busy else "IDLE", reason="")
        return s

    @app.post("/api/v1/scheduler/jobs/{job_id}/requeue")
    def requeue(job_id: str, body: dict):
        st["calls"].append(("requeue", job_id))
        j = get_job(job_id)
        free(j)
        j.update(
            restarts=j["restarts"] + 1,
            excluded=list(body.get("exclude", j["excluded"])),
            held=bool(body.get("hold")),
            state="PENDING",
            reason="requeued",
        )
        if not j["held"]:
            place(j)
        return j

    @app.post("/api/v1/scheduler/jobs/{job_id}/hold")
    def hold(job_id: str):
        st["calls"].append(("hold", job_id))
        j = get_job(job_id)
        j["held"] = True
        return j

    @app.post("/api/v1/scheduler/jobs/{job_id}/release")
    def release(job_id: str):
        st["calls"].append(("release", job_id))
        j = get_job(job_id)
        j["held"] = False
        if j["state"] == "PENDING":
            place(j)
        return j

    @app.post("/api/v1/scheduler/jobs/{job_id}/cancel")
    def cancel(job_id: str):
        st["calls"].append(("cancel", job_id))
        j = get_job(job_id)
        free(j)
        j["state"] = "CANCELLED"
        return j

    def submit(job_id, node="node2", comment="", state="RUNNING", exit_code=None):
        j = {
            "job_id": job_id,
            "name": f"train-{job_id}",
            "state": state,
            "nodes": [node],
            "restarts": 0,
            "exit_code": exit_code,
            "comment": comment,
            "excluded": [],
            "held": False,
            "reason": "",
            "start_time": time.time() - 100,
            "gpus": 8,
        }
        if state == "RUNNING":
            st["nodes"][node]["state"] = "ALLOCATED"
        else:
            j["nodes"] = []
        st["jobs"][job_id] = j
        return j

    client = TestClient(app)
    return client, st, submit

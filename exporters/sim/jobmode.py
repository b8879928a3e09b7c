"""`goodput sim job`: the body of a real Slurm batch job. Registers with the simulator, prints
the job's log to stdout (Slurm's output file) and exits, hangs or crashes as the simulator says."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Mapping
from typing import Any

import requests

from catalogue import names
from exporters.sim.scenario import JOB_ID_RE


def expand_nodelist(text: str) -> list[str]:
    """Slurm hostlist -> names: `node[1-3,5],gpu7` -> node1 node2 node3 node5 gpu7."""
    return names.expand_hostlist(text)


def job_env(env: Mapping[str, str]) -> dict[str, Any]:
    job_id = env.get("SLURM_JOB_ID", "")
    if not JOB_ID_RE.match(job_id):
        raise ValueError(f"SLURM_JOB_ID: not a Slurm job id: {job_id!r}")
    gpus = [int(g) for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip().isdigit()]
    return {
        "job_id": job_id,
        "name": env.get("SLURM_JOB_NAME", "sim-job")[:128] or "sim-job",
        "nodes": expand_nodelist(env.get("SLURM_JOB_NODELIST", "")),
        "gpus": gpus or list(range(8)),
        "restarts": int(env.get("SLURM_RESTART_COUNT", "0") or 0),
        "pid": os.getpid(),
    }


def run(
    sim_url: str,
    env: Mapping[str, str] | None = None,
    poll_s: float = 0.5,
    timing: Mapping[str, float] | None = None,
) -> int:
    """Register, stream the log, and end like the simulated job ends. Returns an exit status
    (SIGABRT-style endings abort the process instead). `timing`: the register body's optional
    step_time_s, init_s, warmup_s, log_interval, checkpoint_every_s."""
    info = {**job_env(env if env is not None else os.environ), **(timing or {})}
    base = sim_url.rstrip("/")
    r = requests.post(f"{base}/api/v1/register", json=info, timeout=10)
    if r.status_code >= 400:
        print(f"goodput sim job: register failed: {r.text}", file=sys.stderr)
        return 2
    offset = int(r.json()["offset"])
    job_id = info["job_id"]

    def on_term(signum: int, _frame: Any) -> None:
        try:
            requests.post(
                f"{base}/api/v1/jobs/{job_id}/exit",
                json={"state": "CANCELLED", "exit_code": 0},
                timeout=2,
            )
        finally:
            os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    while True:
        try:
            r = requests.get(
                f"{base}/api/v1/jobs/{job_id}/log", params={"offset": offset}, timeout=10
            )
            data = r.json()
        except (requests.RequestException, ValueError):
            time.sleep(poll_s)
            continue
        for line in data.get("lines", []):
            print(line)
        sys.stdout.flush()
        offset = data.get("offset", offset)
        state = data.get("state")
        if state != "RUNNING":
            code = int(data.get("exit_code", 0))
            if code == 134:
                os.abort()
            return code
        time.sleep(poll_s)

"""The demo's clients: the few Slurm calls it makes (argv lists, never a shell), the
receiver's API it reads, and polling."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from catalogue import names
from recovery import slurm_hooks

RECEIVER_URL = "http://127.0.0.1:19430"
JOBS = ("gpt-a", "gpt-b", "gpt-c")


def wait(predicate: Callable[[], Any], timeout: float, interval: float = 0.5) -> Any:
    """Poll until `predicate` returns something truthy; None on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = predicate()
        except (requests.RequestException, subprocess.SubprocessError, OSError, ValueError):
            got = None
        if got:
            return got
        time.sleep(interval)
    return None


def http_ok(url: str) -> bool:
    return requests.get(url, timeout=2).status_code < 500


class Slurm:
    """The few Slurm client calls the demo makes (argv lists, never a shell)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = {**os.environ, **env}

    def run(self, *argv: str) -> str:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=self.env)
        if out.returncode != 0:
            raise subprocess.SubprocessError(f"{' '.join(argv)}: {out.stderr.strip()}")
        return out.stdout

    def submit(self, name: str, script: Path, log_dir: str) -> str:
        comment = json.dumps({"goodput": {"max_requeues": 3}}, separators=(",", ":"))
        return self.run(
            "sbatch", "--parsable", "--requeue", "-N1", "--gpus-per-node=8",
            f"--job-name={name}", f"--comment={comment}",
            f"--output={log_dir}/jobs/slurm-%j.out", str(script),
        ).strip().split(";")[0]  # fmt: skip

    def job(self, job_id: str) -> dict[str, str]:
        line = self.run("scontrol", "show", "job", "-o", job_id).strip()
        return dict(kv.split("=", 1) for kv in line.split() if "=" in kv)

    def running_on(self, job_id: str, min_restarts: int = 0) -> str | None:
        """The job's node list while it runs (restarted at least `min_restarts` times)."""
        job = self.job(job_id)
        running = job.get("JobState") == "RUNNING"
        return (
            job.get("NodeList") if running and int(job.get("Restarts", 0)) >= min_restarts else None
        )

    def cancel_demo_jobs(self) -> None:
        for name in JOBS:
            subprocess.run(
                ["scancel", f"--name={name}"], env=self.env, capture_output=True, timeout=30
            )

    def reason(self, node: str) -> str:
        """The node's drain reason ('' when it is not drained)."""
        for line in self.run("sinfo", "-h", "-N", "-n", node, "-o", "%N|%T|%E").splitlines():
            name, state, reason = (line.split("|", 2) + ["", ""])[:3]
            if name == node and "drain" in state.lower():
                return reason.strip()
        return ""

    def resume_drained(self) -> list[str]:
        """Return nodes Goodput drained in an earlier demo to service (only `goodput:` ones),
        lift the demo's Prolog holds, and resume a node the Prolog refused because of one."""
        holds = Path(self.env.get("GOODPUT_HOLD_DIR") or "/nonexistent")
        nodes = [p.name for p in holds.glob("*") if names.valid_node(p.name)]
        held = {n for n in nodes if slurm_hooks.release(holds, n)}
        resumed = []
        for line in self.run("sinfo", "-h", "-N", "-R", "-o", "%N|%E").splitlines():
            node, _, reason = line.partition("|")
            if reason.startswith("goodput:") or (node in held and reason == "Prolog error"):
                self.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
                resumed.append(node)
        return resumed


class Receiver:
    """Reads incidents and actions from the receiver's API."""

    def __init__(self, token_file: str) -> None:
        token = Path(token_file).read_text().strip()
        self.headers = {"Authorization": f"Bearer {token}"}

    def get(self, path: str, **params: Any) -> Any:
        r = requests.get(f"{RECEIVER_URL}{path}", headers=self.headers, params=params, timeout=5)
        r.raise_for_status()
        return r.json()

    def incident_since(self, job_id: str, since: float) -> dict[str, Any] | None:
        """The job's incident holding an alert that began after `since` (the fault's onset)."""
        for item in self.get("/api/v1/incidents", job_id=job_id)["items"]:
            incident = self.get(f"/api/v1/incidents/{item['id']}")
            if any((a.get("starts_at") or 0) >= since - 1 for a in incident.get("alerts", [])):
                return incident
        return None

    def action_for(self, incident_id: Any, since: float) -> dict[str, Any] | None:
        """The incident's latest action planned after `since` (newest first in the API)."""
        for action in self.get("/api/v1/actions")["actions"]:
            if str(action.get("incident_id")) == str(incident_id):
                return action if action["created_at"] >= since else None
        return None

"""Small helpers for tests that talk to the real stack."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import requests


def incident_and_diagnosis(
    iid: str,
    job: str,
    nodes: tuple[str, ...] | list[str],
    outcome: str,
    cause: str,
    confidence: float,
    onset: float,
    opened_at: float,
) -> tuple[dict, dict]:
    """(incident, diagnosis) for `actions.on_diagnosis`, every field given."""
    inc = {"id": iid, "job_id": job, "state": "open", "opened_at": opened_at}
    d = {
        "schema_version": 1,
        "incident_id": iid,
        "job_id": job,
        "outcome": outcome,
        "root_cause": cause,
        "affected_nodes": list(nodes),
        "confidence": confidence,
        "onset": onset,
    }
    return inc, d


def diagnosis(
    tag: str,
    job: str,
    node: str | None,
    outcome: str = "gpu_hardware_fault",
    cause: str = "xid79",
    confidence: float = 0.95,
    onset: float | None = None,
) -> tuple[dict, dict]:
    """(incident, diagnosis) for `actions.on_diagnosis`: `outcome` naming `node`, its onset
    half a second ago unless given; the incident id starts with `tag` (the test's jobs)."""
    now = time.time()
    return incident_and_diagnosis(
        f"{tag}{uuid.uuid4().hex[:4]}",
        job,
        [node] if node else [],
        outcome,
        cause,
        confidence,
        onset if onset is not None else now - 0.5,
        now,
    )


def slurm(*argv: str, check: bool = True) -> str:
    """Run a Slurm client command (argv list) against the local stack; returns stdout."""
    out = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=30, env=os.environ.copy()
    )
    if check and out.returncode != 0:
        raise AssertionError(f"{argv} failed: {out.stderr.strip()}")
    return out.stdout


def prom_query(url: str, expr: str) -> list[dict]:
    r = requests.get(f"{url}/api/v1/query", params={"query": expr}, timeout=5)
    r.raise_for_status()
    return r.json()["data"]["result"]


def add_scrape_target(name: str, port: int) -> Path:
    """Ask the stack's Prometheus to scrape 127.0.0.1:PORT (file_sd, picked up within ~2 s)."""
    targets = Path(os.environ["GOODPUT_STACK_DIR"]) / "prometheus" / "targets"
    path = targets / f"extra-{name}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([{"targets": [f"127.0.0.1:{port}"], "labels": {"test": name}}]))
    tmp.rename(path)
    return path


def scontrol_show(entity: str, name: str) -> dict[str, str]:
    """`scontrol show <job|node> <name> -o` as a dict ({} when Slurm does not know it)."""
    out = slurm("scontrol", "show", entity, "-o", name, check=False)
    return dict(tok.split("=", 1) for tok in out.split() if "=" in tok)


def forget_faults(prometheus_url: str, log_dir: str) -> None:
    """Leave no fault behind for later tests (the demo's own clean-up: series and logs)."""
    from goodput import demo

    demo.forget_faults(prometheus_url, Path(log_dir))


def terminate(proc: subprocess.Popen) -> None:
    """SIGTERM a process we started, then SIGKILL it if it is still there after 15 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def stop_daemon(pid_file: str | Path, sig: int = signal.SIGTERM, timeout: float = 60) -> None:
    """Signal a stack daemon by its pid file and wait until the process is gone, so that
    what the test does next meets the daemon down, not stopping."""
    pid = int(Path(pid_file).read_text())
    os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"pid {pid} still there {timeout:.0f} s after signal {sig}")
        time.sleep(0.05)


class SlurmJobs:
    """Test jobs (`sleep 600`, one GPU per node, requeueable) on the local stack's real Slurm,
    named `<prefix>-<tag>`; `close` cancels them and resumes the nodes drained with the tag in
    their reason. `settings(mode)` is what the action executor reads, on this scheduler."""

    POLICY = {
        "blast_radius": {
            "max_drains_per_hour": 100,
            "max_partition_unavailable_fraction": 0.75,
            "min_healthy_nodes": 1,
        }
    }

    def __init__(self, prefix: str) -> None:
        import uuid

        from recovery.scheduler.slurm import SlurmScheduler

        self.sched = SlurmScheduler()
        self.tag = uuid.uuid4().hex[:8]
        self.name = f"{prefix}-{self.tag}"
        self.jobs: list[str] = []

    def submit(self, *extra: str, nodes: int = 1) -> str:
        job = slurm(
            "sbatch", "--parsable", "--requeue", f"--nodes={nodes}", f"--job-name={self.name}",
            "--output=/dev/null", "--gpus-per-node=1", *extra, "--wrap", "sleep 600",
        ).strip()  # fmt: skip
        self.jobs.append(job)
        return job

    def settings(self, mode: str, **policy: object) -> SimpleNamespace:
        from recovery.policy import parse_policy

        return SimpleNamespace(
            policy=parse_policy({"mode": mode, **self.POLICY, **policy}, env={}),
            scheduler_adapter=self.sched,
            alertmanager_url=None,
            prometheus_url=None,
        )

    def close(self) -> None:
        for job in self.jobs:
            slurm("scancel", job, check=False)
        for n in self.sched.node_states():
            if n.drained and self.tag in n.reason:
                slurm("scontrol", "update", f"NodeName={n.node}", "State=RESUME", check=False)

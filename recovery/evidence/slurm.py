"""Slurm evidence: job state, exit code, restarts, comment directives, node states and reasons.

Every command is an argv list with a timeout, never a shell; every id in an argv was validated
first (`recovery.validate`). The job is read as the scheduler adapter reads it (`squeue
--json` for live and recently ended jobs, `sacct` after slurmctld has forgotten the job).
"""

from __future__ import annotations

import subprocess
from typing import Any

from recovery import validate
from recovery.evidence import Bundle, Context, Report, SlurmFacts
from recovery.scheduler.base import SchedulerError
from recovery.scheduler.slurm import SlurmScheduler
from recovery.settings import Settings


def run(argv: list[str], timeout: float) -> str:
    """Run a Slurm client (argv list, no shell); raises on a non-zero exit or timeout."""
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {out.returncode}: {out.stderr.strip()[:300]}")
    return out.stdout


def job_facts(job_id: str, timeout: float) -> dict[str, Any]:
    """The job as Slurm's structured output describes it: `squeue --json` while slurmctld
    knows it, else the accounting (`sacct`, its free text read apart). Never `scontrol show
    job -o`: its Key=value text cannot be split where a job's name or comment holds
    ` NodeList=…`, and a job's owner writes both."""
    validate.job_id(job_id)
    adapter = SlurmScheduler(timeout_s=timeout, retries=0)
    try:
        job = adapter.job_state(job_id)
    except SchedulerError as exc:
        raise RuntimeError(str(exc)) from None
    if job is None:
        return {}
    return {
        "job_id": job_id,
        "name": job.name,
        "state": job.state,
        "reason": job.reason,
        "exit_code": job.exit_code,
        "signal": job.signal,
        "restarts": job.restarts,
        "nodes": list(job.nodes),
        "comment": job.comment,
        "user": job.user,
        "start_time": job.start_time,  # the current run's start
        "end_time": job.end_time,
        "argv": f"squeue --json -j {job_id} (else sacct -j {job_id} -X -o {adapter.SACCT_FIELDS})",
    }


def node_facts(nodes: list[str], timeout: float) -> dict[str, dict[str, str]]:
    """node → {state, reason} from sinfo."""
    nodes = [validate.node(n) for n in nodes]
    if not nodes:
        return {}
    text = run(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N|%T|%E"], timeout)
    out: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        name, _, rest = line.partition("|")
        state, _, reason = rest.partition("|")
        if name in nodes:
            out[name] = {"state": state.strip(), "reason": reason.strip()}
    return out


def jobs_on_node(node: str, timeout: float = 5.0) -> list[str]:
    """Ids of the jobs running (or completing) on `node`."""
    validate.node(node)
    text = run(
        ["squeue", "-h", "-w", node, "-t", "RUNNING,COMPLETING,CONFIGURING,SUSPENDED", "-o", "%i"],
        timeout,
    )
    return [j.strip() for j in text.split() if validate.JOB_ID.fullmatch(j.strip())]


def collect(ctx: Context, settings: Settings) -> Bundle:
    timeout = settings.slurm_timeout_s
    facts = SlurmFacts()
    problem = ""
    if ctx.job_id:
        try:
            facts.job = job_facts(ctx.job_id, timeout)
        except RuntimeError as exc:  # the job's facts are lost, not the nodes'
            problem = f"job {ctx.job_id}: {exc}"[:300]
        facts.query = facts.job.get("argv", "")
    nodes = sorted(set(ctx.nodes) | set(facts.job.get("nodes") or []))
    facts.nodes = node_facts(nodes, timeout) if nodes else {}
    if not facts.job and not facts.nodes:
        status = "error" if problem else "empty"
        return Bundle(
            slurm=facts, reports=[Report("slurm", status, problem or "no job or node facts")]
        )
    return Bundle(slurm=facts, reports=[Report("slurm", "ok", problem)])

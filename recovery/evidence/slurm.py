"""Slurm evidence: job state, exit code, restarts, comment directives, node states and reasons.

Every command is an argv list with a timeout, never a shell; every id in an argv was validated
first (`recovery.validate`). `scontrol` answers for live and recently ended jobs; `sacct`
answers after slurmctld has forgotten the job.
"""

from __future__ import annotations

import re
import subprocess
from typing import Any

from catalogue import names
from recovery import validate
from recovery.evidence import Bundle, Context, Report, SlurmFacts
from recovery.scheduler.base import ACTIVE
from recovery.settings import Settings

_KV = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=(\S*)")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}")
_COMMENT = re.compile(r"\sComment=(.*?)\s+(?:StdErr|StdIn|StdOut|Power|[A-Z][A-Za-z]+)=")


def run(argv: list[str], timeout: float) -> str:
    """Run a Slurm client (argv list, no shell); raises on a non-zero exit or timeout."""
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {out.returncode}: {out.stderr.strip()[:300]}")
    return out.stdout


def parse_kv(line: str) -> dict[str, str]:
    """`scontrol show -o` output → dict (Comment is read whole, it may hold spaces)."""
    out = {k: v for k, v in _KV.findall(line)}
    m = _COMMENT.search(line + " End=")
    if m:
        out["Comment"] = m.group(1).strip()
    return out


def expand_hostlist(expr: str) -> list[str]:
    """Slurm hostlist (`node[1-3,7]`) → the valid node names in it (pure, no `scontrol`)."""
    return names.expand_hostlist(expr, skip_invalid=True)


slurm_time = names.slurm_time


def _ended_at(state: str, end: str | None) -> float | None:
    """When the job ended; None while it is active (Slurm's EndTime is then the time limit)."""
    state = (state or "").split()[0].upper() if (state or "").strip() else ""
    return None if not state or state in ACTIVE else slurm_time(end)


def _user(raw: str) -> str | None:
    """`alice(1000)` (scontrol's UserId) or `alice` (sacct's User) → `alice`; junk → None."""
    name = raw.split("(", 1)[0].strip()
    return name if _USER.fullmatch(name) else None


def job_facts(job_id: str, timeout: float) -> dict[str, Any]:
    """The job as scontrol (or, once forgotten, sacct) describes it."""
    validate.job_id(job_id)
    try:
        kv = parse_kv(run(["scontrol", "show", "job", "-o", job_id], timeout).strip())
        state = kv.get("JobState", "")
        code, sig = names.slurm_exit(kv.get("ExitCode", ""))
        return {
            "job_id": job_id,
            "name": kv.get("JobName"),
            "state": state,
            "reason": kv.get("Reason", ""),
            "exit_code": code,
            "signal": sig,
            "restarts": int(kv.get("Restarts", "0") or 0),
            "nodes": expand_hostlist(kv.get("NodeList", "")),
            "comment": kv.get("Comment", ""),
            "user": _user(kv.get("UserId", "")),
            "start": kv.get("StartTime"),
            "start_time": slurm_time(kv.get("StartTime")),  # the current run's start
            "end": kv.get("EndTime"),
            "end_time": _ended_at(state, kv.get("EndTime")),
            "argv": f"scontrol show job -o {job_id}",
        }
    except RuntimeError:
        pass
    fields = "JobID,JobName,State,ExitCode,NodeList,Start,End,User,Comment"
    text = run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", fields], timeout)
    for line in text.splitlines():
        parts = line.split("|", 8)
        if len(parts) < 9 or parts[0] != job_id:
            continue
        code, sig = names.slurm_exit(parts[3])
        return {
            "job_id": job_id,
            "name": parts[1],
            "state": parts[2],
            "reason": "",
            "exit_code": code,
            "signal": sig,
            "restarts": None,
            "nodes": expand_hostlist(parts[4]),
            "comment": parts[8],
            "user": _user(parts[7]),
            "start": parts[5],
            "start_time": slurm_time(parts[5]),
            "end": parts[6],
            "end_time": _ended_at(parts[2], parts[6]),
            "argv": f"sacct -j {job_id} -X -n -P -o {fields}",
        }
    return {}


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
    if ctx.job_id:
        facts.job = job_facts(ctx.job_id, timeout)
        facts.query = facts.job.get("argv", "")
    nodes = sorted(set(ctx.nodes) | set(facts.job.get("nodes") or []))
    facts.nodes = node_facts(nodes, timeout) if nodes else {}
    empty = not facts.job and not facts.nodes
    report = Report("slurm", "empty" if empty else "ok", "no job or node facts" if empty else "")
    return Bundle(slurm=facts, reports=[report])

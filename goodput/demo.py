"""The quickstart loop: real Slurm, Prometheus and Alertmanager, simulated GPUs, Goodput's
services in act mode; faults are injected one after another and followed to their end."""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import requests
from rich.markup import escape

from clients.prometheus import PromClient
from goodput import stack
from goodput.demo_clients import JOBS, RECEIVER_URL, Receiver, Slurm, http_ok, wait
from recovery.attribution.model import clip

SIM_URL = "http://127.0.0.1:19400"
REPO = stack.REPO
DEMO_POLICY = REPO / "compose" / "local" / "demo-policy.yaml"
SERVICES = ("sim", "log-exporter", "slurm-exporter", "detector", "receiver")


@dataclass(frozen=True)
class Fault:
    """One injected fault and what the demo expects Goodput to do about it."""

    kind: str
    job: str  # demo job name
    gpu: int | None
    expect_action: str
    note: str
    repair: bool = False  # after the drain: check fails, the GPU is replaced, check passes


FAULTS = (
    Fault("xid79_off_bus", "gpt-a", 3, "drain_and_requeue", "a GPU falls off the bus", True),
    Fault("spin_hang", "gpt-b", 5, "requeue", "a rank hangs in a collective"),
    Fault("cuda_oom", "gpt-c", 0, "stop", "the job runs out of GPU memory"),
    Fault("thermal_straggler", "gpt-b", 2, "drain_and_requeue", "one GPU throttles and drags"),
)


@dataclass
class Outcome:
    """What happened to one fault, for the summary table."""

    fault: Fault
    job_id: str
    node: str
    onset: float
    detected: float | None = None  # the first alert reached the receiver
    diagnosed: float | None = None
    acted: float | None = None
    recovered: float | None = None  # the job runs again (restarts) or is held (stop)
    outcome: str = "-"
    culprits: list[str] = field(default_factory=list)
    action: str = "-"
    action_state: str = "-"
    result: str = "-"
    back_in_service: float | None = None  # the drained node passed its check and was resumed


def goodput_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "goodput.cli", *args]


def start_services(db_url: str, since: float) -> None:
    """Start the simulator (real-Slurm mode), exporters, detector and receiver in act mode; the
    Slurm exporter reports no job that ended before `since` (the receiver's database is new)."""
    env = {"GOODPUT_SIM_URL": SIM_URL}
    stack.start_service("sim", goodput_argv("sim", "serve", "--scheduler", "slurm"), SIM_URL, env)
    stack.start_service(  # its read state lives and goes with the stack (and its job ids)
        "log-exporter",
        goodput_argv("exporter", "logs"),
        "http://127.0.0.1:19411/metrics",
        {"GOODPUT_STATE_DIR": str(stack.state_dir() / "state")},
    )
    stack.start_service(
        "slurm-exporter",
        goodput_argv("exporter", "slurm", "--since", f"{since:.0f}"),
        "http://127.0.0.1:19410/metrics",
    )
    stack.start_service(
        "detector",
        goodput_argv("detector", "serve", "--interval", "2"),
        "http://127.0.0.1:19420/metrics",
    )
    stack.start_service(
        "receiver",
        goodput_argv("receiver", "serve"),
        RECEIVER_URL,
        {
            "GOODPUT_MODE": "act",
            "GOODPUT_POLICY_FILE": str(DEMO_POLICY),
            "GOODPUT_RECEIVER_DB_URL": db_url,
            "GOODPUT_SCHEDULER": "slurm",
            # the return-to-service check in the demo policy runs `goodput sim check NODE`
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        },
    )


def demo_db() -> Path:
    """The demo receiver's own SQLite database (each demo starts it afresh)."""
    return stack.state_dir() / "demo" / "goodput.db"


def stop_services() -> None:
    for name in SERVICES:
        stack.stop_service(name)


def ettr(prometheus_url: str) -> dict[str, float]:
    """ETTR over the last hour from Prometheus' recording rules: 'cluster' and each job id."""
    out: dict[str, float] = {}
    for rule, key in (("goodput:cluster_ettr:1h", None), ("goodput:job_ettr:1h", "job_id")):
        for labels, value in PromClient(prometheus_url, timeout=5).query(rule):
            out[labels.get(key, "") if key else "cluster"] = value
    return out


def archive_logs(log_dir: Path, archive: Path) -> None:
    """Move an earlier run's job and kernel logs aside, so old XIDs are not evidence today."""
    target = archive / time.strftime("%Y%m%d-%H%M%S")
    for sub in ("jobs", "kernel"):
        if (log_dir / sub).exists():
            target.mkdir(parents=True, exist_ok=True)
            (log_dir / sub).rename(target / sub)
        (log_dir / sub).mkdir(parents=True, exist_ok=True)


def forget_faults(prometheus_url: str, log_dir: Path) -> None:
    """Leave no fault behind for later work on the stack: drop the simulated GPUs' series from
    Prometheus (admin API) and move the job and kernel logs aside."""
    requests.post(
        f"{prometheus_url}/api/v1/admin/tsdb/delete_series",
        params={"match[]": '{job="dcgm"}'},
        timeout=10,
    ).raise_for_status()
    archive_logs(log_dir, log_dir.parent / "archive")


def stop(env: dict[str, str], say: Callable[[str], None]) -> None:
    """Undo the demo and leave the stack running: stop its services (first, so nothing acts
    any more), cancel its jobs, return the nodes it drained, lift its Prolog holds and forget
    its faults."""
    stop_services()
    if not env:  # the stack never ran: nothing in Slurm or Prometheus to undo
        return
    slurm = Slurm(env)
    slurm.cancel_demo_jobs()
    for node in slurm.resume_drained():
        say(f"returned {node} to service")
    forget_faults(env["GOODPUT_PROMETHEUS_URL"], Path(env["GOODPUT_LOG_DIR"]))


def job_script(state: Path) -> Path:
    """The sbatch body: a simulated training job that registers with the simulator."""
    path = state / "demo" / "sim-job.sh"
    path.parent.mkdir(parents=True, exist_ok=True)
    argv = " ".join(shlex.quote(a) for a in goodput_argv("sim", "job", "--sim-url", SIM_URL))
    path.write_text(f"#!/bin/bash\nexec {argv}\n")
    path.chmod(0o755)
    return path


def inject(fault: Fault, job_id: str, node: str) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": fault.kind, "node": node, "job_id": job_id}
    if fault.gpu is not None:
        body["gpu"] = fault.gpu
    r = requests.post(f"{SIM_URL}/api/v1/faults", json=body, timeout=10)
    r.raise_for_status()
    return r.json()


def follow(
    fault: Fault, job_id: str, node: str, slurm: Slurm, receiver: Receiver,
    say: Callable[[str], None], timeout: float = 150.0,
) -> Outcome:  # fmt: skip
    """Inject `fault` and follow it: alert → incident → diagnosis → action → job again."""
    injected = inject(fault, job_id, node)
    onset = float(injected.get("onset") or time.time())
    out = Outcome(fault, job_id, node, onset)
    say(f"[bold red]inject[/] {fault.kind} on {node} (job {fault.job} #{job_id}): {fault.note}")
    incident = wait(lambda: receiver.incident_since(job_id, onset), timeout)
    if not incident:
        say(f"  [yellow]no incident for job {job_id} within {timeout:.0f}s[/]")
        return out
    out.detected = time.time()  # polled every 0.5 s: the alert reached the receiver by now
    seen = min(a["starts_at"] for a in incident["alerts"] if (a["starts_at"] or 0) >= onset - 1)
    alerts = sorted({a.get("alertname", "?") for a in incident.get("alerts", [])})
    say(
        f"  alert → incident #{incident['id']} after {out.detected - onset:.1f}s "
        f"({', '.join(alerts)})"
    )

    def diagnosed() -> dict[str, Any] | None:
        """The final diagnosis: an inconclusive one is rechecked before anything is planned."""
        inc = receiver.get(f"/api/v1/incidents/{incident['id']}")
        diag = inc.get("diagnosis") or {}
        final = inc.get("diagnosis_state") == "done"
        return inc if final and (diag.get("diagnosed_at") or 0) >= seen else None

    incident = wait(diagnosed, 90) or incident
    diag = incident.get("diagnosis") or {}
    out.outcome = diag.get("outcome", "-")
    out.culprits = list(diag.get("affected_nodes") or [])
    out.diagnosed = float(diag.get("diagnosed_at") or time.time())
    say(
        f"  diagnosis: [bold]{out.outcome}[/]"
        + (f" on {', '.join(out.culprits)}" if out.culprits else ", no node implicated")
        + f" (confidence {diag.get('confidence', 0):.2f}): "
        + escape(clip(diag.get("root_cause", ""), 200))  # log text: `[rank3]:` is no markup
    )
    final = ("executed", "failed", "rejected", "skipped", "no_action", "planned_only", "expired")
    action = wait(
        lambda: (a := receiver.action_for(incident["id"], seen)) and a["state"] in final and a,
        60,
    )
    if not action:
        say("  [yellow]no action recorded[/]")
        return out
    out.action, out.action_state = action["kind"], action["state"]
    out.acted = float(action.get("updated_at") or time.time())
    say(
        f"  action: [bold]{out.action}[/] → {out.action_state} "
        f"({out.acted - onset:.1f}s after onset)"
    )
    if out.action in ("drain_and_requeue", "requeue") and out.action_state == "executed":
        where = wait(partial(slurm.running_on, job_id, 1), 90)
        out.recovered = time.time() if where else None
        out.result = f"running on {where}" if where else "not running again yet"
    elif out.action == "stop":
        state = slurm.job(job_id).get("JobState", "?")
        out.result = "ended, not requeued" if state != "PENDING" else "held for a person"
    else:
        out.result = out.action_state
    say(f"  result: {out.result}")
    if fault.repair and out.action_state == "executed" and out.culprits:
        back_to_service(out, out.culprits[0], slurm, say)
    return out


def back_to_service(out: Outcome, node: str, slurm: Slurm, say: Callable[[str], None]) -> None:
    """Follow the drained node: its health check fails while the GPU is broken, a technician
    replaces it (the simulator's repair), the next check passes and Goodput resumes it."""
    failed = wait(lambda: (r := slurm.reason(node)).startswith("goodput: failed") and r, 60)
    if not failed:
        say(f"  [yellow]{node}: no health check verdict within 60 s[/]")
        return
    say(f"  {node}: health check [bold]failed[/] → stays drained ({escape(failed)})")
    requests.post(f"{SIM_URL}/api/v1/nodes/{node}/repair", timeout=10).raise_for_status()
    say(f"  {node}: a technician replaces GPU {out.fault.gpu} (simulator: repair)")
    if wait(lambda: slurm.reason(node) == "", 90):
        out.back_in_service = time.time()
        say(f"  {node}: health check [bold green]passed[/] → back in service")
    else:
        say(f"  [yellow]{node}: not back in service within 90 s[/]")


def run(
    say: Callable[[str], None],
    faults: tuple[Fault, ...] = FAULTS,
    fresh: bool = True,
    warmup_s: float = 45.0,
) -> list[Outcome]:
    """The whole demo; returns one Outcome per injected fault."""
    if stack.run_stack("start") != 0:
        raise RuntimeError("the local stack did not start (see the messages above)")
    env = stack.stack_env()
    os.environ.update(env)
    slurm = Slurm(env)
    state = stack.state_dir()
    slurm.cancel_demo_jobs()
    for node in slurm.resume_drained():
        say(f"returned {node} (drained by an earlier demo) to service")
    db = demo_db()
    db.parent.mkdir(parents=True, exist_ok=True)
    if fresh:
        stop_services()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        archive_logs(Path(env["GOODPUT_LOG_DIR"]), state / "logs" / "archive")
    start_services(f"sqlite:///{db}", time.time())
    for name, url in (
        ("simulator", f"{SIM_URL}/api/v1/cluster"),
        ("receiver", f"{RECEIVER_URL}/healthz"),
        ("detector", "http://127.0.0.1:19420/metrics"),
        ("log exporter", "http://127.0.0.1:19411/metrics"),
    ):
        if not wait(partial(http_ok, url), 60):
            raise RuntimeError(f"the {name} did not answer at {url} (logs: {state}/logs/)")
    say("services up: simulator, log and Slurm exporters, detector, receiver ([bold]act[/] mode)")

    script = job_script(state)
    jobs = {name: slurm.submit(name, script, env["GOODPUT_LOG_DIR"]) for name in JOBS}
    say("submitted " + ", ".join(f"{n} (#{j})" for n, j in jobs.items()) + " to real Slurm")
    for name, job_id in jobs.items():
        if not wait(partial(slurm.running_on, job_id), 60):
            raise RuntimeError(f"job {name} #{job_id} did not start")
    settle_s = 15.0  # healthy time before each fault (after a restart, too)
    say(
        "jobs running; letting them train and the detector learn them "
        f"({warmup_s + settle_s:.0f} s to the first fault)"
    )
    time.sleep(warmup_s)

    results = []
    for fault in faults:
        job_id = jobs[fault.job]
        node = wait(partial(slurm.running_on, job_id), 120)
        if not node:
            say(f"[yellow]skipping {fault.kind}: job {fault.job} is not running[/]")
            continue
        time.sleep(settle_s)
        results.append(
            follow(fault, job_id, node, slurm, Receiver(env["GOODPUT_RECEIVER_TOKEN_FILE"]), say)
        )
    return results

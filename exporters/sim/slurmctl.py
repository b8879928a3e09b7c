"""Side effects on the real local Slurm for `node_lost` in real-Slurm mode: stop a node's slurmd
(pidfile $GOODPUT_STACK_DIR/run/slurmd-<node>.pid) and kill its job steps; restart it on repair."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from exporters.sim.jobs import Job
from exporters.sim.scenario import NODE_RE


def _stack() -> Path:
    return Path(os.environ.get("GOODPUT_STACK_DIR", "/tmp/goodput-stack"))  # noqa: S108


def _pidfile(node: str) -> Path:
    if not NODE_RE.match(node):
        raise ValueError(f"node: invalid name {node!r}")
    return _stack() / "run" / f"slurmd-{node}.pid"


def _ppid(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = stat.rpartition(")")[2].split()  # after "pid (comm)": state ppid ...
    return int(fields[1]) if len(fields) > 1 else 0


def _stepd_of(pid: int) -> int:
    """The slurmstepd above a job's process (the manager of its batch step), or 0."""
    for _ in range(8):
        pid = _ppid(pid)
        if pid <= 1:
            return 0
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            return 0
        if comm.startswith("slurmstepd"):
            return pid
    return 0


def kill_node(node: str, jobs: list[Job]) -> None:
    """Power loss: stop the node's slurmd (and its process group), then the jobs' slurmstepd
    and the jobs' processes, stepd first, so that nothing reports the jobs' end to slurmctld
    and Slurm sees a node failure (NODE_FAIL after SlurmdTimeout) instead of a killed job."""
    stepds = [_stepd_of(job.os_pid) for job in jobs if job.os_pid > 1]
    pidfile = _pidfile(node)
    with contextlib.suppress(OSError, ValueError):
        pid = int(pidfile.read_text().strip())
        if pid > 1:
            if os.getpgid(pid) == pid and pid != os.getpgid(0):
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
    for stepd in stepds:
        if stepd > 1:
            with contextlib.suppress(OSError):
                os.kill(stepd, signal.SIGKILL)
    for job in jobs:
        if job.os_pid > 1:
            with contextlib.suppress(OSError):
                pgid = os.getpgid(job.os_pid)
                if pgid != os.getpgid(0):
                    os.killpg(pgid, signal.SIGKILL)
                else:
                    os.kill(job.os_pid, signal.SIGKILL)


def start_node(node: str) -> None:
    """Start `slurmd -D -N <node>` in its own session and rewrite its pidfile."""
    pidfile = _pidfile(node)
    logs = _stack() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"slurmd-{node}.log", "ab") as log:
        proc = subprocess.Popen(  # noqa: S603 - argv list
            ["slurmd", "-D", "-N", node],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=os.environ.copy(),
        )
    pidfile.parent.mkdir(parents=True, exist_ok=True)
    pidfile.write_text(str(proc.pid))

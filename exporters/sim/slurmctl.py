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


def kill_node(node: str, jobs: list[Job]) -> None:
    """Stop the node's slurmd (and, with it, its process group's steps) and the jobs' processes."""
    pidfile = _pidfile(node)
    with contextlib.suppress(OSError, ValueError):
        pid = int(pidfile.read_text().strip())
        if pid > 1:
            if os.getpgid(pid) == pid and pid != os.getpgid(0):
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
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

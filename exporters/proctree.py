"""CPU time of a process tree, read from /proc: what a GPU's processes do on the host.

A GPU that idles with its memory held is either waiting (a hang: the rank blocks in a
rendezvous, a data loader whose worker deadlocked, a read from a stalled file system) or its
processes are busy on the host (a silent `torch.compile`, a checkpoint being unpickled, rank 0
tokenising the data set). The processes that hold the GPU (NVML's compute processes) and their
descendants (compile workers, data-loader workers) tell which: `tree_cpu_seconds` is their
user + system time, the reaped children's included, in seconds since each started.

>>> import os
>>> tree_cpu_seconds([os.getpid()]) > 0
True
>>> tree_cpu_seconds([2**22 + 1]) is None  # no such process (or not in this PID namespace)
True
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

PROC = Path("/proc")
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int, proc: Path) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (field 3, state, is index 0)."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except (OSError, ValueError):  # gone, or not ours to read
        return None
    return text[text.rfind(")") + 2 :].split()  # the name may hold spaces and parentheses


def _children(proc: Path) -> dict[int, list[int]]:
    """Parent pid -> its children's pids, over every process visible in `proc`."""
    tree: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name), proc)):
            tree.setdefault(int(fields[1]), []).append(int(entry.name))
    return tree


def tree_cpu_seconds(pids: Iterable[int], proc: Path = PROC) -> float | None:
    """User + system seconds of `pids` and all their descendants (utime, stime, and cutime,
    cstime: children they reaped); None when none of `pids` is visible."""
    roots = [p for p in dict.fromkeys(pids) if _stat(p, proc) is not None]
    if not roots:
        return None
    tree, seen, todo, ticks = _children(proc), set(), list(roots), 0
    while todo:
        pid = todo.pop()
        if pid in seen or (fields := _stat(pid, proc)) is None:
            continue
        seen.add(pid)
        ticks += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
        todo.extend(tree.get(pid, ()))
    return ticks / TICK

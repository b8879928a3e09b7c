"""CPU time of process trees, read from /proc: what a GPU's processes do on the host.

A GPU that idles with its memory held is either waiting (a hang: the rank blocks in a
rendezvous, a data loader whose worker deadlocked, a read from a stalled file system) or its
processes are busy on the host (a silent `torch.compile`, a checkpoint being unpickled, rank 0
tokenising the data set). The processes that hold the GPU (NVML's compute processes) and their
descendants (compile workers, data-loader workers) tell which: `Snapshot.tree_seconds` is their
user + system time, the reaped children's included, in seconds. One snapshot of /proc serves
every GPU of a scrape; a tree stops at processes that belong to another GPU (a launcher whose
rank 0 is the parent of the node's other ranks).

>>> import os
>>> snap = Snapshot.take()
>>> snap.tree_seconds([os.getpid()]) > 0
True
>>> snap.tree_seconds([2**22 + 1]) is None  # no such process (or not in this PID namespace)
True
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(path: Path) -> tuple[int, int] | None:
    """(parent pid, utime + stime + cutime + cstime in ticks) from /proc/<pid>/stat; None when
    it is gone, unreadable or malformed. Fields are read after the command name's last ')'."""
    try:
        raw = path.read_bytes()
        fields = raw[raw.rindex(b")") + 2 :].split()
        return int(fields[1]), sum(int(v) for v in fields[11:15])
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Snapshot:
    """Every visible process at one moment: pid -> (parent pid, CPU ticks)."""

    procs: dict[int, tuple[int, int]]

    @staticmethod
    def take(proc: Path = PROC) -> Snapshot:
        out = {}
        for entry in proc.iterdir():
            if entry.name.isdigit() and (st := _stat(entry / "stat")) is not None:
                out[int(entry.name)] = st
        return Snapshot(out)

    def children(self) -> dict[int, list[int]]:
        tree: dict[int, list[int]] = {}
        for pid, (ppid, _) in self.procs.items():
            tree.setdefault(ppid, []).append(pid)
        return tree

    def tree_seconds(
        self,
        roots: Iterable[int],
        others: Iterable[int] = (),
        tree: dict[int, list[int]] | None = None,
    ) -> float | None:
        """CPU seconds of `roots` and their descendants, not descending into `others` (the
        roots of other trees); None when no root is visible."""
        roots = [p for p in dict.fromkeys(roots) if p in self.procs]
        if not roots:
            return None
        tree = self.children() if tree is None else tree
        seen, todo, ticks = set(others) - set(roots), list(roots), 0
        while todo:
            pid = todo.pop()
            if pid in seen or pid not in self.procs:
                continue
            seen.add(pid)
            ticks += self.procs[pid][1]
            todo.extend(tree.get(pid, ()))
        return ticks / TICK


def tree_cpu_seconds(pids: Iterable[int], proc: Path = PROC) -> float | None:
    """CPU seconds of `pids` and all their descendants, from a fresh snapshot."""
    return Snapshot.take(proc).tree_seconds(pids)

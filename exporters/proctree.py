"""CPU time of process trees, read from /proc: what a GPU's processes do on the host.

A GPU that idles with its memory held is either waiting (a hang: the rank blocks in a
rendezvous, a data loader whose worker deadlocked, a read from a stalled file system) or its
processes are busy on the host (a silent `torch.compile`, a checkpoint being unpickled, rank 0
tokenising the data set). The processes that hold the GPU (NVML's compute processes) and their
descendants (compile workers, data-loader workers) tell which. A `Snapshot` holds every
visible process's own user + system time and its reaped children's (a compile worker's short
`gcc` runs end before any scrape sees them); `Snapshot.tree` lists a GPU's processes, its tree
stopping at processes that belong to another GPU; `Gains` turns successive snapshots into what
each process gained since it was last seen: a process that joins brings no history, one that
leaves takes none away, and a child seen before and reaped since is not counted again in its
parent's children time (a rank 0 that reaps the node's other ranks gains nothing by it).

>>> import os
>>> snap = Snapshot.take()
>>> [key[0] for key in snap.tree([os.getpid()])][:1] == [os.getpid()]
True
>>> snap.tree([2**22 + 1])  # no such process (or not in this PID namespace)
[]
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
Key = tuple[int, int]  # (pid, start time in ticks since boot): one process, never reused


def _stat(path: Path) -> tuple[int, int, int, int] | None:
    """(parent pid, utime + stime, cutime + cstime (reaped children's) in ticks, start time)
    from /proc/<pid>/stat; None when it is gone, unreadable or malformed. Fields are read
    after the command name's last ')'."""
    try:
        raw = path.read_bytes()
        f = raw[raw.rindex(b")") + 2 :].split()
        return int(f[1]), int(f[11]) + int(f[12]), int(f[13]) + int(f[14]), int(f[19])
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Snapshot:
    """Every visible process at one moment: pid -> (parent pid, own CPU ticks, reaped
    children's CPU ticks, start time)."""

    procs: dict[int, tuple[int, int, int, int]]

    @staticmethod
    def take(proc: Path = PROC) -> Snapshot:
        out = {}
        try:
            entries = list(proc.iterdir())
        except OSError:  # no /proc here: nothing is visible
            entries = []
        for entry in entries:
            if entry.name.isdigit() and (st := _stat(entry / "stat")) is not None:
                out[int(entry.name)] = st
        return Snapshot(out)

    def children(self) -> dict[int, list[int]]:
        tree: dict[int, list[int]] = {}
        for pid, (ppid, *_) in self.procs.items():
            tree.setdefault(ppid, []).append(pid)
        return tree

    def tree(
        self,
        roots: Iterable[int],
        others: Iterable[int] = (),
        children: dict[int, list[int]] | None = None,
    ) -> list[Key]:
        """The processes of `roots` and their descendants, not descending into `others` (the
        roots of other trees); empty when no root is visible."""
        children = self.children() if children is None else children
        roots = [p for p in dict.fromkeys(roots) if p in self.procs]
        seen, todo, out = set(others) - set(roots), roots, []
        while todo:
            pid = todo.pop()
            if pid in seen or pid not in self.procs:
                continue
            seen.add(pid)
            out.append((pid, self.procs[pid][3]))
            todo.extend(children.get(pid, ()))
        return out

    def get(self, key: Key) -> tuple[int, int, int, int] | None:
        """The process `key` names, if it is the one alive now (not a reused pid)."""
        got = self.procs.get(key[0])
        return got if got is not None and got[3] == key[1] else None

    def key(self, pid: int) -> Key | None:
        got = self.procs.get(pid)
        return None if got is None else (pid, got[3])


@dataclass
class Gains:
    """Each process's CPU ticks (own, reaped children's) and parent when last seen, so each
    scrape counts only what it gained."""

    last: dict[Key, tuple[int, int, Key | None]] = field(default_factory=dict)

    def seconds(self, snap: Snapshot, trees: dict[int, list[Key]]) -> dict[int, float]:
        """tree id -> CPU seconds its processes gained since the last call (a process seen for
        the first time gains nothing yet); forgets the processes no tree holds any more."""
        now = {k: got for keys in trees.values() for k in keys if (got := snap.get(k))}
        reaped: dict[Key, int] = {}  # ancestor alive -> totals of its descendants seen and
        for key, (own, children, parent) in self.last.items():  # gone since (counted already)
            if snap.get(key) is None:
                for _ in range(len(self.last)):  # its parent gone too: the next one up
                    if parent is None or snap.get(parent) is not None:
                        break
                    parent = self.last[parent][2] if parent in self.last else None
                if parent is not None:
                    reaped[parent] = reaped.get(parent, 0) + own + children
        out = {}
        for tid, keys in trees.items():
            gained = 0
            for key in keys:
                if key in now and key in self.last:
                    own0, children0, _ = self.last[key]
                    _, own, children, _ = now[key]
                    gained += max(0, own - own0)
                    gained += max(0, children - children0 - reaped.get(key, 0))
            out[tid] = gained / TICK
        self.last = {k: (got[1], got[2], snap.key(got[0])) for k, got in now.items()}
        return out

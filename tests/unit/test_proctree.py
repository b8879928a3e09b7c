"""The NVML exporter's host-side reader on real processes and on a /proc of our own: a tree
counts its descendants' own time, stops at other trees, and each scrape counts what each
process gained (a process that joins brings no history, one that ends takes none away)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from exporters.proctree import TICK, Gains, Snapshot

BURN = "import time\nwhile time.process_time() < {s}: pass"  # {s} seconds of CPU


@contextmanager
def process(code: str) -> Iterator[subprocess.Popen]:
    p = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        time.sleep(0.5)  # up, its children too (a process first seen gains nothing yet)
        yield p
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # its children too
        p.wait()


def gained(pid: int, seconds: float) -> float:
    """CPU seconds the tree of `pid` gained over the next `seconds`, as a scrape reads it."""
    gains = Gains()
    for _ in range(2):
        snap = Snapshot.take()
        got = gains.seconds(snap, {0: snap.tree([pid])})[0]
        time.sleep(seconds)
    return got


def test_a_waiting_parent_counts_its_working_child():
    """The rank waits for its worker (a compile worker, a data-loader worker) that burns a core:
    the tree works, though the process NVML names does not."""
    code = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {BURN.format(s=30)!r}])"
    with process(code) as p:
        assert gained(p.pid, 1.5) > 0.3  # of 1.5 (a loaded machine shares its cores)


def test_a_waiting_process_gains_next_to_nothing():
    with process("import os\nr, w = os.pipe()\nos.read(r, 1)") as p:
        assert gained(p.pid, 1.5) < 0.05


def _proc(root: Path, procs: dict[int, tuple[int, int, int]]) -> None:
    """A /proc of `procs` (pid -> (parent, utime ticks, start time)); the rest is gone."""
    for d in root.iterdir():
        if d.name.isdigit():
            (d / "stat").unlink()
            d.rmdir()
    for pid, (ppid, ticks, start) in procs.items():
        (root / str(pid)).mkdir()
        rest = " ".join(["0"] * 9 + [str(ticks), "5", "999999", "999999", "20", "0", "1", "0"])
        (root / str(pid) / "stat").write_text(f"{pid} (py (x) y) S {ppid} {rest} {start}\n")


def test_gains_per_process_on_a_proc_of_our_own(tmp_path):
    """Odd command names (spaces, parentheses) read after the last ')'; utime + stime, never
    the reaped children's; a reused pid (another start time) is a new process; a process that
    ends, or a new one, moves nothing by itself."""
    (tmp_path / "self").mkdir()  # not a pid: skipped
    _proc(tmp_path, {1: (0, 100, 1), 2: (1, 30, 2)})
    snap = Snapshot.take(tmp_path)
    assert snap.tree([1]) == [(1, 1), (2, 2)] and snap.tree([1], others=[2]) == [(1, 1)]
    assert snap.tree([7]) == [] and snap.ticks((2, 2)) == 35
    gains = Gains()
    assert gains.seconds(snap, {0: snap.tree([1])}) == {0: 0.0}  # first sight
    _proc(tmp_path, {1: (0, 100 + TICK, 1), 2: (1, 30 + TICK, 2)})
    snap = Snapshot.take(tmp_path)
    assert gains.seconds(snap, {0: snap.tree([1])}) == {0: 2.0}
    _proc(tmp_path, {1: (0, 100 + 2 * TICK, 1), 2: (1, 10**6, 9)})  # 2 ended; its pid reused
    snap = Snapshot.take(tmp_path)
    assert gains.seconds(snap, {0: snap.tree([1])}) == {0: 1.0}
    assert Snapshot.take(tmp_path / "missing").procs == {}  # no /proc: nothing visible

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
    assert snap.tree([7]) == [] and snap.get((2, 2))[1:3] == (35, 1999998)
    gains = Gains()
    assert gains.seconds(snap, {0: snap.tree([1])}) == {0: 0.0}  # first sight
    _proc(tmp_path, {1: (0, 100 + TICK, 1), 2: (1, 30 + TICK, 2)})
    snap = Snapshot.take(tmp_path)
    assert gains.seconds(snap, {0: snap.tree([1])}) == {0: 2.0}
    _proc(tmp_path, {1: (0, 100 + 2 * TICK, 1), 2: (1, 10**6, 9)})  # 2 ended; its pid reused
    snap = Snapshot.take(tmp_path)
    assert gains.seconds(snap, {0: snap.tree([1])}) == {0: 1.0}
    assert Snapshot.take(tmp_path / "missing").procs == {}  # no /proc: nothing visible


def test_reaped_children_count_once(tmp_path):
    """A child's own time while seen, then, reaped, only what it used since (its total moves
    into the parent's cutime); a child never seen (a compile worker's short `gcc`) in full."""
    (tmp_path / "1").mkdir()

    def stat(parent_cutime: int, child: int | None) -> Snapshot:
        (tmp_path / "1" / "stat").write_text(
            f"1 (rank) S 0 {' '.join(['0'] * 9)} 100 0 {parent_cutime} 0 20 0 1 0 1\n"
        )
        (tmp_path / "2").mkdir(exist_ok=True)
        if child is None:
            (tmp_path / "2" / "stat").unlink(missing_ok=True)
            (tmp_path / "2").rmdir()
        else:
            (tmp_path / "2" / "stat").write_text(
                f"2 (w) S 1 {' '.join(['0'] * 9)} {child} 0 0 0 20 0 1 0 2\n"
            )
        return Snapshot.take(tmp_path)

    gains = Gains()
    for parent_cutime, child, want in [
        (0, 50, 0.0),  # first sight
        (0, 50 + TICK, 1.0),  # the child works
        (50 + TICK + TICK // 2, None, 0.5),  # reaped: the half second since it was seen
        (50 + TICK + TICK // 2 + 3 * TICK, None, 3.0),  # a child never seen, in full
    ]:
        snap = stat(parent_cutime, child)
        assert gains.seconds(snap, {0: snap.tree([1])}) == {0: want}

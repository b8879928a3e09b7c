"""The NVML exporter's host-side reader on real processes: a tree's CPU time counts its
descendants, alive and reaped; a waiting process counts next to nothing; /proc's odd names."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from exporters.proctree import TICK, tree_cpu_seconds

BURN = "import time\nwhile time.process_time() < {s}: pass"  # {s} seconds of CPU


@contextmanager
def process(code: str) -> Iterator[subprocess.Popen]:
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        yield p
    finally:
        p.kill()
        p.wait()


def used(pid: int, seconds: float) -> float:
    """CPU seconds the tree of `pid` used over the next `seconds`."""
    a = tree_cpu_seconds([pid])
    time.sleep(seconds)
    b = tree_cpu_seconds([pid])
    assert a is not None and b is not None
    return b - a


def test_a_waiting_parent_counts_its_working_child():
    """The rank waits for its worker (a compile worker, a data-loader worker) that burns a core:
    the tree works, though the process NVML names does not."""
    code = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {BURN.format(s=30)!r}])"
    with process(code) as p:
        time.sleep(0.5)
        assert used(p.pid, 1.5) > 0.3  # of 1.5 (a loaded machine shares its cores)


def test_a_child_that_ended_still_counts():
    burn = BURN.format(s=0.6)
    code = (
        f"import subprocess, sys, time\nsubprocess.run([sys.executable, '-c', {burn!r}])"
        "\nprint('reaped', flush=True)\ntime.sleep(30)"
    )
    with process(code) as p:
        assert p.stdout.readline().strip() == "reaped"
        assert tree_cpu_seconds([p.pid]) >= 0.6  # the child's time, in the parent's cutime


def test_a_waiting_process_uses_next_to_nothing():
    with process("import os\nr, w = os.pipe()\nos.read(r, 1)") as p:
        time.sleep(0.5)
        assert used(p.pid, 1.5) < 0.05


def test_unknown_pids_and_odd_names(tmp_path):
    assert tree_cpu_seconds([]) is None
    assert tree_cpu_seconds([999_999_999]) is None
    # a command name may hold spaces and parentheses: fields are read after the last ')'
    rows = {
        1: "1 (py (x) y) S 0 " + "0 " * 9 + "100 50 0 0",
        2: "2 (w) R 1 " + "0 " * 9 + "30 20 5 5",
    }
    for pid, stat in rows.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(stat + " 20 0 1\n")
    (tmp_path / "self").mkdir()  # not a pid: skipped
    assert tree_cpu_seconds([2], tmp_path) == 60 / TICK  # utime stime cutime cstime
    assert tree_cpu_seconds([1], tmp_path) == (150 + 60) / TICK  # its own and its child's
    assert tree_cpu_seconds([1, 2, 1], tmp_path) == (150 + 60) / TICK  # each process once

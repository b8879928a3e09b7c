"""The receiver's file evidence reads kernel times as `dmesg -T` and plain `dmesg` print them.

Old code: neither form was parsed, so such lines had no time and escaped the incident window.
Lines: leptonai/gpud#46 (`dmesg --ctime`), NVIDIA/NVSentinel#155 (plain dmesg).
"""

from __future__ import annotations

import calendar
import os
import time

import pytest

from recovery.evidence.logs import read_lines

T = calendar.timegm(time.strptime("2024-08-30 11:43:09", "%Y-%m-%d %H:%M:%S"))


def test_dmesg_ctime_and_monotonic_lines_get_times(tmp_path):
    ctime = tmp_path / "node1.log"
    ctime.write_text(
        "[Fri Aug 30 11:11:22 2024] nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected\n"
        "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>'\n"
    )
    got = read_lines(ctime, "kernel", "node1", start=T - 60, end=T + 60)
    assert [ln.time for ln in got] == [T]  # the 11:11 line is outside the window
    mono = tmp_path / "node2.log"
    mono.write_text(
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
        "[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).\n"
    )
    os.utime(mono, (T, T))  # the last line was written when the file last changed
    got = read_lines(mono, "kernel", "node2", start=T - 60, end=T + 60)
    assert [round(ln.time, 6) for ln in got] == [round(T - 0.131517, 6), T]


def test_a_date_in_a_path_does_not_move_a_line_out_of_the_window(tmp_path):
    log = tmp_path / "slurm-1.out"
    start = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(T))
    log.write_text(f"[{start}] saving\n  saved /ckpt/run-2023-01-01T00:00:00/iter_0000100\n")
    got = read_lines(log, "job", start=T - 60, end=T + 60)
    assert [ln.time for ln in got] == [T, T]


def test_a_gzipped_log_is_read_as_its_text(tmp_path):
    """A rotated log (`.gz`) reads as the plain one; a damaged one is a clear error, not lines
    of compressed bytes (which matched nothing: `unknown`, silently). A file not named .gz is
    read as it is whatever its first bytes (a job writes its own output)."""
    import gzip

    text = "[2025-01-01 00:00:01] torch.OutOfMemoryError: CUDA out of memory.\n"
    plain = tmp_path / "slurm-7.out"
    plain.write_text(text)
    (tmp_path / "slurm-7.out.gz").write_bytes(gzip.compress(text.encode()))
    got = read_lines(tmp_path / "slurm-7.out.gz", "job")
    assert [(ln.text, ln.time) for ln in got] == [
        (ln.text, ln.time) for ln in read_lines(plain, "job")
    ]
    (tmp_path / "slurm-8.out").write_bytes(b"\x1f\x8b" + text.encode())
    assert len(read_lines(tmp_path / "slurm-8.out", "job")) == 1  # read as is
    broken = tmp_path / "slurm-9.out.gz"
    broken.write_bytes(gzip.compress(text.encode())[:20])
    with pytest.raises(ValueError, match="not a readable gzip file"):
        read_lines(broken, "job")


def test_an_unreadable_job_log_costs_only_its_own_lines(tmp_path, monkeypatch):
    """One file that cannot be read (an I/O error, a log rotated to a bad .gz) no longer makes
    the whole log connector an error: the node's kernel log (its XID) is still evidence."""
    from recovery.evidence import Context
    from recovery.evidence import logs as L

    (tmp_path / "jobs").mkdir()
    (tmp_path / "kernel").mkdir()
    (tmp_path / "jobs" / "slurm-7.out").write_text("step 1\n")
    (tmp_path / "kernel" / "node1.log").write_text(
        "2024-08-30T11:43:09Z node1 kernel: NVRM: Xid (PCI:0000:cb:00): 79, pid=1\n"
    )
    real = L.read_lines

    def flaky(path, *args, **kwargs):
        if path.name.endswith(".out"):
            raise OSError(5, "Input/output error", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(L, "read_lines", flaky)
    bundle = L.collect_dir(Context(job_id="7", nodes=["node1"], start=T - 60, end=T + 60), tmp_path)
    assert [ln.kind for ln in bundle.lines] == ["kernel"]
    assert "slurm-7.out (OSError)" in bundle.reports[0].reason

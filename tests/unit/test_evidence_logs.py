"""The log collector keeps an incident's evidence to the job's current run."""

from __future__ import annotations

import calendar
import os
import time
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from recovery.evidence import Context
from recovery.evidence.logs import collect, collect_dir
from recovery.settings import Settings

T = calendar.timegm(time.strptime("2026-11-29 20:40:00", "%Y-%m-%d %H:%M:%S"))


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S+0000", time.gmtime(t))


def test_kernel_lines_from_before_the_jobs_run_are_not_evidence(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "kernel").mkdir()
    start = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(T))
    (tmp_path / "jobs" / "slurm-7.out").write_text(f"[{start}] SLURM_JOB_ID=7 nodes=node1\n")
    (tmp_path / "kernel" / "node1.log").write_text(
        f"{_stamp(T - 600)} node1 kernel: NVRM: Xid (PCI:0000:18:00): 79, an earlier job's\n"
        f"{_stamp(T + 30)} node1 kernel: NVRM: Xid (PCI:0000:5D:00): 79, this run's\n"
    )
    ctx = Context(job_id="7", nodes=["node1"], start=T - 900, end=T + 100)
    kernel = [ln.text for ln in collect_dir(ctx, tmp_path, zone=UTC).lines if ln.kind == "kernel"]
    assert len(kernel) == 1 and "this run's" in kernel[0]
    # without a job log (a node-only incident) the look-back window alone applies
    (tmp_path / "jobs" / "slurm-7.out").unlink()
    kernel = [ln.text for ln in collect_dir(ctx, tmp_path, zone=UTC).lines if ln.kind == "kernel"]
    assert len(kernel) == 2


def test_a_link_or_a_fifo_in_the_job_log_directory_is_never_read(tmp_path):
    """`<log_dir>/jobs` is writable by the jobs' users: `ln -s /etc/... slurm-9.out` made the
    receiver read the target as job 9's output; a FIFO would block its reader."""
    (tmp_path / "jobs").mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("CUDA out of memory: a line only the link's target holds\n")
    (tmp_path / "jobs" / "slurm-9.out").symlink_to(secret)
    os.mkfifo(tmp_path / "jobs" / "slurm-8.out")
    for job in ("9", "8"):
        got = collect_dir(Context(job_id=job, nodes=[], start=0, end=2e9), tmp_path)
        assert got.lines == [] and got.reports[0].status == "empty"
    assert "OSError" in collect_dir(Context("9", [], 0, 2e9), tmp_path).reports[0].reason


def test_local_time_stamps_are_read_in_the_configured_zone(tmp_path):
    """Old: stamps without a zone were read as UTC, so on a New York cluster every stamped
    line landed 5 hours before the incident's window and the evidence kept none of them."""
    (tmp_path / "jobs").mkdir()
    (tmp_path / "kernel").mkdir()
    now = float(int(time.time()))
    written = now - 60
    local = datetime.fromtimestamp(written, ZoneInfo("America/New_York"))
    xid = local.strftime("%b %e %H:%M:%S") + " node1 kernel: NVRM: Xid (PCI:0000:2b:00): 79"
    failed = local.strftime("[%Y-%m-%d %H:%M:%S") + ",123] torch.distributed: failed"
    (tmp_path / "kernel" / "node1.log").write_text(xid + "\n")
    (tmp_path / "jobs" / "slurm-42.out").write_text(failed + "\n")
    ctx = Context(job_id="42", nodes=["node1"], start=now - 600, end=now)
    settings = Settings(log_dir=str(tmp_path), log_timezone="America/New_York")
    got = {ln.text: ln.time for ln in collect(ctx, settings).lines}
    assert got == {failed: written + 0.123, xid: written}
    assert Settings.from_env({"GOODPUT_LOG_TIMEZONE": "America/New_York"}).log_zone == ZoneInfo(
        "America/New_York"
    )


def test_an_unknown_log_timezone_fails_at_start_up():
    with pytest.raises(ValueError, match="GOODPUT_LOG_TIMEZONE: unknown time zone 'EST5EDTX'"):
        Settings.from_env({"GOODPUT_LOG_TIMEZONE": "EST5EDTX"})
    with pytest.raises(ValueError, match="GOODPUT_LOG_TIMEZONE"):
        Settings(log_timezone="Europe/Atlantis")
    assert Settings.from_env({}).log_timezone == ""  # the host's zone

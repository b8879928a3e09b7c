"""The log collector keeps an incident's evidence to the job's current run."""

from __future__ import annotations

import calendar
import os
import time

from recovery.evidence import Context
from recovery.evidence.logs import collect_dir

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
    kernel = [ln.text for ln in collect_dir(ctx, tmp_path).lines if ln.kind == "kernel"]
    assert len(kernel) == 1 and "this run's" in kernel[0]
    # without a job log (a node-only incident) the look-back window alone applies
    (tmp_path / "jobs" / "slurm-7.out").unlink()
    kernel = [ln.text for ln in collect_dir(ctx, tmp_path).lines if ln.kind == "kernel"]
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

"""The real H200 cut (tests/data/h200-ckpt: one GPU's metrics, the job's log, its Slurm record)
and `goodput import` of it, for the post-mortem tests."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner, Result

from goodput.cli import app

DATA = Path(__file__).resolve().parent / "data" / "h200-ckpt"
NODE = "h200a"


def import_h200(out: Path, *extra: str, job_log: bool = True, slurm: bool = True) -> Result:
    """`goodput import` of the cut's metrics on node h200a into `out`, with the job log and the
    Slurm record unless told otherwise, plus `extra` options."""
    args = ["import", "--metrics", str(DATA / "metrics.csv"), "--node", NODE, "--out", str(out)]
    if job_log:
        args += ["--job-log", str(DATA / "app.log.gz")]
    if slurm:
        args += ["--slurm", str(DATA / "slurm.txt")]
    return CliRunner().invoke(app, [*args, *extra])

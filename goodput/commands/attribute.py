"""`goodput attribute`: run the attribution engine offline on files and print the diagnosis."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from recovery import attribution
from recovery.evidence import Bundle, Context
from recovery.evidence import recording as rec

app = typer.Typer(
    help="Attribute a failure offline (post-mortems, tests).", invoke_without_command=True
)


@app.callback()
def attribute(
    job_log: Path | None = typer.Option(None, "--job-log", help="the job's Slurm output"),
    kernel_log: list[Path] = typer.Option(
        [], "--kernel-log", help="a node's kernel log (named <node>.log); repeatable"
    ),
    recording: Path | None = typer.Option(None, "--recording", help="a recording directory"),
    job_id: str | None = typer.Option(
        None, "--job-id", help="which job (default: the faulty one in truth.json, else the first)"
    ),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node"),
) -> None:
    """Print the diagnosis JSON for the given evidence."""
    for p in [job_log, recording, *kernel_log]:
        if p is not None and not p.exists():
            raise typer.BadParameter(f"{p} does not exist")
    try:
        if recording is not None:
            ctx = rec.context(recording, job_id)
            bundle = rec.collect(recording, ctx)
        else:
            ctx = Context(job_id=job_id, nodes=[], start=0.0, end=time.time())
            bundle = Bundle()
        if job_log is not None or kernel_log:
            bundle.extend(rec.collect_files(ctx, job_log, kernel_log))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    doc = attribution.attribute(bundle, ctx, gpus_per_node=gpus_per_node)
    typer.echo(json.dumps(doc, indent=2, sort_keys=True))

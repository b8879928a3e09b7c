"""`goodput attribute`: run the attribution engine offline on files and print the diagnosis.

stdout: the diagnosis JSON (docs/contracts.md); stderr: which job was chosen and why, and what
each source held, so a verdict is never read without knowing what it was drawn from.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from catalogue.logfiles import unreadable

if TYPE_CHECKING:
    from recovery.evidence import Bundle

app = typer.Typer(help="Attribute a failure offline (post-mortems, tests).")


def command(
    recording: Path | None = typer.Option(None, "--recording", help="A recording directory."),
    job_log: Path | None = typer.Option(None, "--job-log", help="The job's Slurm output."),
    kernel_log: list[Path] = typer.Option(
        [], "--kernel-log", help="A node's kernel log, named <node>.log; repeatable."
    ),
    job_id: str | None = typer.Option(
        None, "--job-id", help="Which job (required when the recording holds several)."
    ),
    gpus_per_node: int | None = typer.Option(
        None, "--gpus-per-node", help="Default: the recording's meta.json, else 8."
    ),
) -> None:
    """Print the diagnosis JSON for the given evidence; say on stderr what it was drawn from."""
    from recovery import attribution
    from recovery.evidence import Bundle, Context
    from recovery.evidence import recording as rec

    def fail(msg: str) -> typer.Exit:
        typer.echo(f"attribute: {msg}", err=True)
        return typer.Exit(2)

    if recording is None and job_log is None and not kernel_log:
        raise fail("no evidence: give --recording DIR, --job-log FILE or --kernel-log FILE")
    for p in [job_log, *kernel_log]:
        if p is not None and (why := unreadable(p)):
            raise fail(f"{p}: {why}")
    if recording is not None and not recording.is_dir():
        raise fail(f"--recording {recording}: not a directory")
    held = ("meta.json", "logs", *rec.GPU_FILES, *rec.JOB_FILES)
    if recording is not None and not any((recording / name).exists() for name in held):
        raise fail(f"--recording {recording}: not a recording (none of {', '.join(held)})")
    if gpus_per_node is not None and not 1 <= gpus_per_node <= 1024:
        raise fail("--gpus-per-node must be between 1 and 1024")
    try:
        meta = rec.read_meta(recording) if recording is not None else {}
        if recording is not None:
            job_id, why = rec.choose_job(recording, job_id)
            ctx = (
                rec.context(recording, job_id)
                if job_id
                else Context(job_id=None, nodes=[], start=0.0, end=time.time())
            )
            bundle = rec.collect(recording, ctx) if job_id else Bundle()
        else:
            why = "given with --job-id" if job_id else "none given: the logs are read as is"
            if job_id is None and job_log is not None and job_log.name.startswith("slurm-"):
                job_id = (
                    job_log.name.removeprefix("slurm-").removesuffix(".gz").removesuffix(".out")
                )
                why = f"from the job log's name ({job_log.name})"
            ctx = Context(job_id=job_id, nodes=[], start=0.0, end=time.time())
            bundle = Bundle()
        if job_log is not None or kernel_log:
            bundle.extend(rec.collect_files(ctx, job_log, kernel_log))
    except (ValueError, OSError) as exc:
        raise fail(str(exc)) from None
    gpn, gpn_from = gpus_per_node, "--gpus-per-node"
    if gpn is None:
        meta_gpn = meta.get("gpus_per_node")
        if meta_gpn:
            gpn, gpn_from = int(meta_gpn), "meta.json"
        elif seen := _gpus_per_node(bundle):
            gpn, gpn_from = seen, "the samples"
        else:
            gpn, gpn_from = 8, "default"
    missing = [r.connector for r in bundle.reports if r.status != "ok"]
    if recording is None:  # logs alone: what a verdict drawn from them lacks
        missing += ["metrics (none given: a --recording holds them)", "slurm (none given)"]
    if not bundle.series or not bundle.lines:
        # a post-mortem on partial evidence: no rule matching is not proof of health
        ctx.alerts = [{"labels": {"alertname": "offline-attribution"}, "annotations": {}}]
    doc = attribution.attribute(bundle, ctx, gpus_per_node=gpn)
    typer.echo(f"job: {ctx.job_id or 'none'} ({why})", err=True)
    typer.echo(f"GPUs per node: {gpn} ({gpn_from})", err=True)
    for r in bundle.reports:
        typer.echo(f"{r.connector}: {r.status}{': ' + r.reason if r.reason else ''}", err=True)
    verdict = f"verdict: {doc['outcome']} ({doc['confidence']:.2f}): {doc['root_cause']}"
    if doc["outcome"] == "unknown" and missing:
        verdict += f" [evidence missing: {', '.join(missing)}]"
    typer.echo(verdict, err=True)
    typer.echo(json.dumps(doc, indent=2, sort_keys=True))


def _gpus_per_node(bundle: Bundle) -> int:
    """The most GPUs the bundle's samples name on one node (0: none named)."""
    seen: dict[str, set[str]] = {}
    for sr in bundle.series:
        if sr.node and sr.gpu is not None:
            seen.setdefault(sr.node, set()).add(sr.gpu)
    return max((len(g) for g in seen.values()), default=0)

"""`goodput export-recording`: one job's time range from Prometheus, as a recording directory."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

import typer

app = typer.Typer(help="Export a job's metrics (and logs) from Prometheus as a recording.")


def _time(text: str) -> float:
    """Unix seconds or ISO 8601 (with a zone, e.g. 2025-01-01T10:00:00Z)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise typer.BadParameter(f"{text!r}: want unix seconds or ISO 8601 with a zone") from exc
    if dt.tzinfo is None:
        raise typer.BadParameter(f"{text!r}: give a time zone (e.g. Z or +02:00)")
    return dt.timestamp()


def command(
    job_id: str = typer.Option(..., "--job-id", help="Slurm job id."),
    start: str = typer.Option(..., "--start", help="Unix seconds or ISO 8601 with a zone."),
    end: str = typer.Option(..., "--end", help="Unix seconds or ISO 8601 with a zone."),
    out: Path = typer.Option(..., "--out", help="Recording directory to write."),
    prometheus: str = typer.Option(
        None, "--prometheus", help="Prometheus URL (default $GOODPUT_PROMETHEUS_URL or :19090)."
    ),
    step: float = typer.Option(5.0, "--step", help="Seconds between samples."),
    log_dir: Path = typer.Option(
        None, "--log-dir", help="Copy logs from here (default $GOODPUT_LOG_DIR when set)."
    ),
) -> None:
    """Write OUT in the recording format (docs/contracts.md) for replay, attribution, notebooks."""
    from detector.export import ExportError, export_recording

    url = prometheus or os.environ.get("GOODPUT_PROMETHEUS_URL", "http://127.0.0.1:19090")
    logs = log_dir or (
        Path(os.environ["GOODPUT_LOG_DIR"]) if os.environ.get("GOODPUT_LOG_DIR") else None
    )
    try:
        meta = export_recording(url, job_id, _time(start), _time(end), out, step=step, log_dir=logs)
    except ExportError as exc:
        typer.echo(f"export-recording: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(json.dumps({"out": str(out), "nodes": meta["nodes"], "jobs": meta["jobs"]}))

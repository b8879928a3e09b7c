"""`goodput replay RECORDING`: the detectors over a recording or a file of GPU samples, with a
report of what each detector could see per job (table, or `--json`)."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="Replay the detectors over a recording.")


def _derive(log: Path, job_id: str, times: list[float]) -> list[dict[str, Any]]:
    """Job metrics from a job log, by the production log parser (exporters.logmetrics)."""
    from exporters.importer import job_metrics

    rows, _ = job_metrics(log.read_text(errors="replace").splitlines(), job_id, times, str(log))
    return rows


def command(
    recording: Path = typer.Argument(
        ..., metavar="RECORDING", help="Recording dir, or a CSV/Parquet/Prometheus JSON file."
    ),
    out: Path = typer.Option(Path("detections.jsonl"), "--out", help="JSON lines output."),
    min_score: float = typer.Option(
        None, "--min-score", help="Write scores at or above this (default: each alert level)."
    ),
    state_dir: Path = typer.Option(
        None, "--state-dir", help="Load baselines saved by job name here; save those fitted."
    ),
    explain: str = typer.Option(None, "--explain", metavar="JOB", help="Detail one job."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Run the detectors over RECORDING; write detections as JSON lines; say per job which
    detectors ran, which could not and why, and the peak of each."""
    from detector.baselines import BaselineStore
    from detector.frame import FrameError
    from detector.replay import replay
    from exporters.importer import ImportFailure

    def fail(msg: str) -> typer.Exit:
        typer.echo(f"replay: {msg}", err=True)
        return typer.Exit(2)

    if min_score is not None and not (math.isfinite(min_score) and min_score >= 0):
        raise fail(f"--min-score {min_score}: want a number >= 0 (0 writes every score)")
    if state_dir is not None and state_dir.exists() and not state_dir.is_dir():
        raise fail(f"--state-dir {state_dir}: not a directory")
    if not out.parent.is_dir():
        raise fail(f"--out {out}: directory {out.parent} does not exist")
    if out.is_dir():
        raise fail(f"--out {out}: is a directory (want the JSON lines file to write)")
    store = BaselineStore(state_dir) if state_dir is not None else None
    # a failed replay leaves --out as it was: written beside it, renamed at the end (a pipe
    # or a device, /dev/stdout, is written directly)
    direct = out.exists() and not out.is_file()
    target = out if direct else out.with_name(out.name + ".partial")
    try:
        with open(target, "w") as fh:
            summary = replay(
                recording, fh, min_score=min_score, store=store, derive=_derive, job=explain
            )
        if not direct:
            target.replace(out)
    except (FrameError, ImportFailure, OSError, ValueError) as exc:
        raise fail(str(exc)) from None
    finally:
        if not direct:
            target.unlink(missing_ok=True)
    summary["out"] = str(out)
    if explain is not None and explain not in summary["jobs"]:
        raise fail(f"--explain {explain}: no such job; jobs: {sorted(summary['jobs']) or 'none'}")
    if as_json:
        doc = summary if explain is None else summary["jobs"][explain]
        json.dump(doc, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    show(summary, explain)


def show(summary: dict[str, Any], explain: str | None = None) -> None:
    """The summary as text: inputs, then per job a table of detectors."""
    con = Console(width=110, highlight=False, soft_wrap=False)
    for note in summary["inputs"]:
        typer.echo(f"read: {note}")
    for err in summary["baseline_errors"]:
        typer.echo(f"baseline ignored: {err}")
    floor = summary["min_score"]
    level = "each score's alert level" if floor is None else f"score >= {floor:g}"
    typer.echo(
        f"{summary['rows']} rows, {summary['instants']} instants every "
        f"{summary['interval_s']:g} s; {summary['detections']} detections ({level}) "
        f"-> {summary['out']}"
    )
    for job, doc in summary["jobs"].items():
        if explain is not None and job != explain:
            continue
        span = doc["last_seen"] - doc["first_seen"]
        typer.echo(
            f"\njob {job} ({doc['name']}): {len(doc['nodes'])} node(s), {doc['gpus']} GPU(s), "
            f"seen {span:.0f} s from {_t(doc['first_seen'])}; peak {doc['peak']['score']:.2f}"
            + (f" at {_t(doc['peak']['time'])}" if doc["peak"]["time"] else "")
        )
        typer.echo(f"baseline: {doc['baseline']['status']}")
        for key in ("progress_note", "physics_note"):
            if doc[key]:
                typer.echo(doc[key])
        table = Table("detector", "ran", "why not", "peak", "at", "where", box=None)
        for name, d in doc["detectors"].items():
            p = d["peak"]
            where = f"{p['node']}/gpu{p['gpu']}" if p["node"] else ""
            table.add_row(
                name,
                "yes" if d["ran"] else "no",
                d["why_not"] or "",
                f"{p['score']:.2f}",
                _t(p["time"]) if p["time"] else "",
                where,
            )
        con.print(table)
        if explain is not None:
            for det in doc["top_detections"]:
                typer.echo(
                    f"  {_t(det['time'])} {det['detector']} {det['score']:.2f} "
                    f"{det['node'] or ''} {det['reason']}"
                )


def _t(t: float | None) -> str:
    return "" if t is None else time.strftime("%H:%M:%S", time.gmtime(t))

"""`goodput audit`: verify the hash chain, export it (recorded), apply retention."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from goodput.commands.receiver_db import DB, open_db

app = typer.Typer(help="The recovery audit log.", no_args_is_help=True)


@app.command("verify")
def verify(
    db: str = DB,
    file: Path | None = typer.Option(None, "--file", help="check an export file instead"),
) -> None:
    """Recompute the hash chain; exit 1 at the first row that does not fit."""
    from recovery import audit

    if file is not None:
        try:
            with file.open() as fh:
                v = audit.verify_lines(fh)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            typer.echo(f"error: {file}: {getattr(exc, 'strerror', None) or exc}", err=True)
            raise typer.Exit(2) from None
    else:
        v = audit.verify(open_db(db)[0])
    if v.ok and file is not None and not v.rows:  # a truncated or wrong file: nothing shown
        typer.echo(f"error: {file} holds no events: nothing verified", err=True)
        raise typer.Exit(1)
    if v.ok:
        typer.echo(f"ok: {v.rows} events, chain intact" if v.rows else "ok: no events to check")
        return
    typer.echo(f"TAMPERED: event seq {v.first_bad_seq}: {v.problem}", err=True)
    raise typer.Exit(1)


@app.command("export")
def export(
    db: str = DB,
    output: str = typer.Option("-", "--output", "-o", help="JSON-lines file (default stdout)"),
    who: str = typer.Option(os.environ.get("USER", "operator"), "--who"),
) -> None:
    """Every stored event, oldest first, as JSON lines (hashes included, so the copy verifies
    with `verify --file`). An export to a file is written in full, fsynced and renamed, and only
    then recorded in the log: only events a recorded export holds may ever be pruned. An export
    to stdout is not recorded (a pipe or a terminal is no durable copy)."""
    from recovery import audit

    engine = open_db(db)[0]
    if output == "-":
        summary = audit.export(engine, sys.stdout)
        if summary is not None:
            typer.echo("stdout export not recorded: use -o FILE to allow pruning", err=True)
        return
    path = Path(output)
    if not path.parent.is_dir():
        typer.echo(f"error: -o {output}: no directory {path.parent}", err=True)
        raise typer.Exit(2)
    tmp = path.with_name(path.name + ".partial")
    with tmp.open("w") as fh:
        summary = audit.export(engine, fh)
        os.fsync(fh.fileno())
    tmp.replace(path)
    fd = os.open(path.resolve().parent, os.O_RDONLY)  # the rename itself survives a crash
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    where = str(path.resolve())
    if summary is not None:
        audit.record_export(engine, summary, where, actor=who)
        typer.echo(f"exported events {summary['first_seq']}..{summary['last_seq']} to {where}")


@app.command("prune")
def prune(db: str = DB) -> None:
    """Apply the policy's retention now: old webhook bodies, exported old audit events, the
    console's logouts whose sessions expired."""
    from recovery import retention
    from recovery.settings import Settings

    deleted = retention.apply(open_db(db)[0], retention.rules_for(Settings.from_env()))
    typer.echo(
        f"pruned {deleted['payloads']} webhook bodies, {deleted['audit']} audit events, "
        f"{deleted['logouts']} expired logouts"
    )

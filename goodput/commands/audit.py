"""`goodput audit`: verify the hash chain, export the log as JSON lines."""

from __future__ import annotations

import json

import typer

app = typer.Typer(help="The recovery audit log.", no_args_is_help=True)
DB = typer.Option(None, "--db", help="database URL (default: $GOODPUT_RECEIVER_DB_URL)")


def _engine(db: str | None):
    from recovery import audit
    from recovery.settings import Settings
    from recovery.store import make_engine

    engine = make_engine(db or Settings.from_env().db_url)
    audit.ensure(engine)
    return engine


@app.command("verify")
def verify(db: str = DB) -> None:
    """Recompute the hash chain; exit 1 at the first row that does not fit."""
    from recovery import audit

    v = audit.verify(_engine(db))
    if v.ok:
        typer.echo(f"ok: {v.rows} events, chain intact")
        return
    typer.echo(f"TAMPERED: event seq {v.first_bad_seq}: {v.problem}", err=True)
    raise typer.Exit(1)


@app.command("export")
def export(
    db: str = DB,
    output: typer.FileTextWrite = typer.Option("-", "--output", "-o"),
) -> None:
    """Every event, oldest first, as JSON lines (hashes included, so a copy can be verified)."""
    from recovery import audit

    for row in audit.iter_all(_engine(db)):
        row["payload"] = json.loads(row["payload"])
        output.write(json.dumps(row, sort_keys=True, default=str) + "\n")

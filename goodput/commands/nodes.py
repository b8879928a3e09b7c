"""`goodput nodes`: each node's history (incidents, MTBI, repeat-offender rules) and its health
checks. Reads the receiver's database (`--db`, default `$GOODPUT_RECEIVER_DB_URL`)."""

from __future__ import annotations

import json

import typer

from goodput.commands.receiver_db import DB, open_db

app = typer.Typer(help="Node history and return-to-service checks.", no_args_is_help=True)


def _fmt_s(s: float | None) -> str:
    """A mean time between incidents: minutes under an hour (two incidents 2 minutes apart
    read as "0.0 h"), hours under two days, then days."""
    if s is None:
        return "-"
    if s < 3600:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h" if s < 2 * 86400 else f"{s / 86400:.1f} d"


@app.command("history")
def history(as_json: bool = typer.Option(False, "--json"), db: str = DB) -> None:
    """Nodes with incidents or checks in the last 7 days, most incidents first."""
    from recovery import node_history
    from recovery.policy import load_policy

    engine, _ = open_db(db)
    rows = node_history.summary(engine, load_policy())
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    if not rows:
        typer.echo("no node has incidents or checks in the last 7 days")
    for r in rows:
        flags = "; ".join(f"{e['rule']} -> {e['then']} ({e['why']})" for e in r["escalations"])
        typer.echo(
            f"{r['node']:<16} incidents(7d) {r['incidents_7d']:>3}  MTBI {_fmt_s(r['mtbi_s']):>8}"
            f"  last check {r['last_check'] or '-':<7} {flags}"
        )


@app.command("checks")
def checks(
    node: str | None = typer.Argument(None, help="only this node"),
    as_json: bool = typer.Option(False, "--json"),
    db: str = DB,
) -> None:
    """The latest return-to-service checks, newest first, with their output."""
    from recovery import node_checks, validate

    if node is not None and not validate.NODE.fullmatch(node):
        typer.echo(f"error: {node!r} is not a node name", err=True)
        raise typer.Exit(2)
    engine, _ = open_db(db)
    rows = node_checks.rows(engine, node)
    if as_json:
        typer.echo(json.dumps(rows, indent=1, default=str))
        return
    if not rows:
        typer.echo(f"no return-to-service checks{f' of {node}' if node else ''}")
    for r in rows:
        typer.echo(
            f"#{r['id']} {r['node']} {r['level']} {r['state']} (mode {r['mode']}, exit "
            f"{r['exit_code']}): {r['step'] or r['drain_reason']}"
        )
        if r["output"].strip():
            typer.echo("    " + r["output"].strip().replace("\n", "\n    ")[-800:])

"""`goodput actions`: list, approve, reject recovery actions; pause/resume them all; resume a
node. Talks to the receiver's database (`--db`, default `$GOODPUT_RECEIVER_DB_URL`).

Exit codes: 0 done; 1 an approved action or a resume ran and failed; 2 refused, nothing done
(bad input, an unknown action, one not pending, a node not drained by Goodput)."""

from __future__ import annotations

import getpass
import json
import os
from collections.abc import Callable

import typer

from goodput.commands.receiver_db import DB, open_db

app = typer.Typer(
    help="Recovery actions: approvals, the pause switch, node resume. Exit status: 0 done, "
    "1 an approved action or a resume ran and failed, 2 refused with nothing done.",
    no_args_is_help=True,
)
WHO = typer.Option(None, "--who", help="who decides (default: the current user)")


def _who(who: str | None) -> str:
    """--who (default: the login name) as the API takes it (`validate.person`), or exit 2."""
    from recovery.validate import person

    return _checked(person, who or os.environ.get("USER") or getpass.getuser())


def _note(text: str) -> str:
    """A comment or reason as the API takes it (`validate.note`), or exit 2."""
    from recovery.validate import note

    return _checked(note, text)


def _checked(rule: Callable[[str], str], value: str) -> str:
    try:
        return rule(value)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command("list")
def list_(
    state: str = typer.Option(None, help="only this state, e.g. pending_approval"),
    job_id: str = typer.Option(None, "--job"),
    as_json: bool = typer.Option(False, "--json"),
    db: str = DB,
) -> None:
    """Actions, newest first."""
    from recovery import action_config, outbox

    state = None if state is None else _checked(outbox.known_state, state)
    engine, _ = open_db(db)
    rows = outbox.list_actions(engine, state=state, job_id=job_id)
    if as_json:
        typer.echo(json.dumps(rows, default=str, indent=1))
        return
    if action_config.is_paused(engine):
        typer.echo("PAUSED: no action executes until `goodput actions resume`")
    if not rows:
        typer.echo("no actions" + (" matching the filter" if state or job_id else ""))
    for r in rows:
        a = r["body"].get("action", {})
        typer.echo(
            f"{r['id']:<28} {r['state']:<17} {r['kind']:<18} job={r['job_id'] or '-':<8}"
            f" nodes={','.join(a.get('nodes') or a.get('resume') or []) or '-'}"
            f" reasons={','.join(a.get('reasons', []))}"
        )


@app.command("approve")
def approve(action_id: str, who: str = WHO, comment: str = "", db: str = DB) -> None:
    """Approve a pending action and execute it now."""
    from recovery import approvals

    engine, settings = open_db(db)
    try:
        r = approvals.approve(engine, settings, action_id, _who(who), _note(comment))
    except approvals.ActionError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"{action_id}: {r.get('state')} {r.get('last_error') or ''}".rstrip())
    raise typer.Exit(0 if r.get("state") == "executed" else 1)


@app.command("reject")
def reject(action_id: str, who: str = WHO, comment: str = "", db: str = DB) -> None:
    """Reject a pending action."""
    from recovery import approvals

    engine, _ = open_db(db)
    try:
        approvals.reject(engine, action_id, _who(who), _note(comment))
    except approvals.ActionError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"{action_id}: rejected")


@app.command("pause")
def pause(who: str = WHO, reason: str = "", db: str = DB) -> None:
    """Stop every action at once (plans are still made and audited)."""
    from recovery import action_config

    action_config.set_paused(open_db(db)[0], True, _who(who), _note(reason))
    typer.echo("paused")


@app.command("resume")
def resume(who: str = WHO, reason: str = "", db: str = DB) -> None:
    """Lift the pause switch."""
    from recovery import action_config

    action_config.set_paused(open_db(db)[0], False, _who(who), _note(reason))
    typer.echo("resumed")


@app.command("resume-node")
def resume_node(node: str, who: str = WHO, comment: str = "", db: str = DB) -> None:
    """Return a node Goodput drained to service (never one a person drained)."""
    from recovery import approvals

    engine, settings = open_db(db)
    try:
        r = approvals.resume_node(engine, settings, node, _who(who), _note(comment))
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"{node}: {r.get('state')} {r.get('last_error') or ''}".rstrip())
    raise typer.Exit(0 if r.get("state") == "executed" else 1)

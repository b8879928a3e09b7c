"""`goodput sim`: the simulated GPU cluster (record a scenario, serve it, inject, run as a job)."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(help="Simulated GPU cluster with fault injection.", no_args_is_help=True)


@app.command("record")
def record_cmd(
    scenario: Path = typer.Argument(..., help="scenario YAML"),
    out: Path = typer.Option(..., "--out", help="recording directory to write"),
    seed: int | None = typer.Option(None, "--seed", help="override the scenario's seed"),
) -> None:
    """Run a scenario accelerated in-process and write a recording."""
    from exporters.sim import ScenarioError, record

    try:
        rec = record(scenario, out, seed)
    except ScenarioError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    faults = rec.truth["faults"]
    typer.echo(
        f"wrote {rec.path}: {len(rec.meta['jobs'])} jobs, {len(faults)} faults "
        f"({', '.join(f['kind'] for f in faults) or 'healthy'})"
    )
    for e in rec.truth["errors"]:
        typer.echo(f"warning: fault {e['kind']} not applied: {e['error']}", err=True)

"""`goodput demo`: the quickstart loop on one machine, shown live; `goodput demo stop`."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import requests
import typer
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from clients.prometheus import PromError
from goodput import demo as loop
from goodput import stack

app = typer.Typer(
    help="The quickstart loop on one machine: `goodput demo` alone runs it (the local stack, "
    "three jobs on real Slurm, four faults injected and handled, about 5 minutes); "
    "`goodput demo stop` ends it.",
    invoke_without_command=True,
)
console = Console(width=120)


def _secs(start: float, end: float | None) -> str:
    return f"{end - start:.1f}s" if end else "-"


def summary(results: list[loop.Outcome]) -> Table:
    table = Table(title="What Goodput did (times from the fault's onset)")
    for col in ("fault", "job", "detect", "act", "diagnosis", "action", "result"):
        table.add_column(col)
    for r in results:
        ok = r.action == r.fault.expect_action and r.action_state == "executed"
        table.add_row(
            r.fault.kind,
            f"{r.fault.job} on {r.node}",
            _secs(r.onset, r.detected),
            _secs(r.onset, r.acted),
            f"{r.outcome} @ {','.join(r.culprits) or 'no node implicated'}",
            f"[{'green' if ok else 'yellow'}]{r.action}[/]",
            r.result,
        )
    return table


def _cli() -> str:
    """How to call this CLI from the current directory (`.venv/bin/goodput` in a checkout)."""
    exe = Path(sys.executable).parent / "goodput"
    try:
        return str(exe.relative_to(Path.cwd()))
    except ValueError:
        return str(exe)


@app.callback()
def demo(ctx: typer.Context) -> None:
    """Start everything, inject a GPU off the bus, a hang, an OOM and a straggler; follow each."""
    if ctx.invoked_subcommand:
        return
    console.print(
        Panel(
            "[bold]Goodput quickstart[/]: real Slurm, Prometheus, Alertmanager; simulated GPUs.\n"
            "[bold red]ACT MODE[/]: Goodput will drain nodes and requeue or stop jobs in this "
            "local Slurm.\n(Everywhere else the default is monitor mode: plan, never execute.)",
            border_style="red",
        )
    )
    t0 = time.monotonic()

    def say(text: str) -> None:
        console.print(f"[dim]{time.monotonic() - t0:6.1f}s[/] {text}")

    try:
        results = loop.run(say)
    except RuntimeError as exc:
        console.print(f"[bold red]demo failed:[/] {exc}")
        raise typer.Exit(1) from None
    console.print(summary(results))
    for r in results:
        if r.back_in_service:
            console.print(
                f"{r.culprits[0]} failed its health check while GPU {r.fault.gpu} was broken, "
                f"passed it after the repair, and was back in service "
                f"{r.back_in_service - r.onset:.0f} s after the fault."
            )
    try:
        jobs = {r.job_id: r.fault.job for r in results}
        e = loop.ettr(stack.stack_env().get("GOODPUT_PROMETHEUS_URL", "http://127.0.0.1:19090"))
        per_job = ", ".join(
            f"{jobs[j]} {v:.1%}"
            for j, v in sorted(e.items())
            if j in jobs  # the demo's jobs
        )
        cluster = e.get("cluster", float("nan"))  # every job of the hour: an earlier run's too
        console.print(f"ETTR, last hour: {per_job} (the cluster, all its jobs: {cluster:.1%})")
    except (OSError, ValueError, KeyError, PromError) as exc:
        console.print(f"[yellow]ETTR not available: {exc}[/]")
    handled = sum(
        r.action == r.fault.expect_action and r.action_state == "executed" for r in results
    )
    url = f"sqlite:///{loop.demo_db()}"
    cli, db = _cli(), f"--db {url}"
    console.print(
        f"{handled}/{len(loop.FAULTS)} faults detected, diagnosed and handled as expected.\n"
        "Explore: Recovery Console http://127.0.0.1:19430/console (log in with the token in "
        f"{stack.stack_env().get('GOODPUT_RECEIVER_TOKEN_FILE')}), Prometheus "
        "http://127.0.0.1:19090/alerts, Alertmanager http://127.0.0.1:19093, "
        f"`{cli} stack status`, `{cli} actions list {db}`, `{cli} audit verify {db}`, "
        f"`{cli} nodes history {db}` (or `export GOODPUT_RECEIVER_DB_URL={url}` "
        "once, for every such command). Stop: `make demo-stop`; "
        f"`{cli} demo stop --keep-stack` leaves the stack running.",
        soft_wrap=True,
    )
    if handled < len(loop.FAULTS):
        raise typer.Exit(1)


@app.command("stop")
def stop(
    keep_stack: bool = typer.Option(
        False, "--keep-stack", help="leave the local stack running (e.g. shared with other work)"
    ),
) -> None:
    """Stop the demo (services, jobs, drains, Prolog holds, fault series), then the local stack."""
    try:
        loop.stop(stack.stack_env(), console.print)
    except (OSError, subprocess.SubprocessError, requests.RequestException) as exc:
        console.print(f"[yellow]the demo was not wholly undone: {exc}[/]")
        if keep_stack:
            raise typer.Exit(1) from None
    raise typer.Exit(0 if keep_stack else stack.run_stack("stop"))

"""`goodput demo`: the quickstart. For now it starts the local stack and says what runs."""

from __future__ import annotations

import typer

from goodput import stack

app = typer.Typer(help="The quickstart loop on one machine.", invoke_without_command=True)


@app.callback()
def demo(ctx: typer.Context) -> None:
    """Start the local stack and show what is running."""
    if ctx.invoked_subcommand:
        return
    if stack.run_stack("start") != 0:
        raise typer.Exit(1)
    stack.run_stack("status")


@app.command("stop")
def stop() -> None:
    """Stop everything the demo started."""
    raise typer.Exit(stack.run_stack("stop"))

"""`goodput`: the command that wires Goodput's parts together."""

from __future__ import annotations

import importlib

import typer

from goodput import stack

# plain help (click's: paragraphs reflowed, no boxes, no <bool> metavars); a crash's traceback
# without the frames' local variables (a token or a database URL with its password may be one)
app = typer.Typer(
    help="Goodput keeps GPU training jobs running.",
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_show_locals=False,
)
stack_app = typer.Typer(help="The local stack: Prometheus, Alertmanager, Slurm (real daemons).")
app.add_typer(stack_app, name="stack")

# Sub-command modules in goodput/commands/; name -> module. A module with a `command` function
# is one command (its usage line shows its own arguments); otherwise its typer `app` is a group.
COMMANDS: dict[str, str] = {
    "actions": "goodput.commands.actions",
    "audit": "goodput.commands.audit",
    "demo": "goodput.commands.demo",
    "exporter": "goodput.commands.exporters",
    "sim": "goodput.commands.sim",
    "detector": "goodput.commands.detector",
    "replay": "goodput.commands.replay",
    "rules": "goodput.commands.rules",
    "dashboards": "goodput.commands.dashboards",
    "receiver": "goodput.commands.receiver",
    "attribute": "goodput.commands.attribute",
    "bench": "goodput.commands.bench",
    "export-recording": "goodput.commands.export",
    "slurm": "goodput.commands.slurm",
    "nodes": "goodput.commands.nodes",
    "import": "goodput.commands.import",
}


@stack_app.command("up")
def stack_up() -> None:
    """Start the local stack (idempotent)."""
    raise typer.Exit(stack.run_stack("start"))


@stack_app.command("down")
def stack_down() -> None:
    """Stop the local stack and every Goodput service it knows."""
    raise typer.Exit(stack.run_stack("stop"))


@stack_app.command("status")
def stack_status() -> None:
    """Say what runs, where, and with which PIDs."""
    raise typer.Exit(stack.run_stack("status"))


for _name, _path in COMMANDS.items():
    _module = importlib.import_module(_path)
    if hasattr(_module, "command"):
        app.command(_name, short_help=_module.app.info.help)(_module.command)
    else:
        app.add_typer(_module.app, name=_name)


if __name__ == "__main__":
    app()

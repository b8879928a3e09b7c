"""`goodput replay RECORDING --out detections.jsonl` (implemented in commands/detector.py)."""

from __future__ import annotations

import typer

from goodput.commands.detector import replay_cmd

app = typer.Typer(
    help="Replay the detectors over a recording.",
    context_settings={"allow_interspersed_args": True},
)
app.callback(invoke_without_command=True)(replay_cmd)

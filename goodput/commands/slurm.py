"""`goodput slurm prolog|epilog|hold|release`: the hooks a site puts in slurm.conf.

    Prolog=/usr/local/bin/goodput-prolog   # a two-line wrapper: exec goodput slurm prolog
    Epilog=/usr/local/bin/goodput-epilog
    SchedulerParameters=nohold_on_prolog_fail,...  # else a refused job is requeued held

`goodput slurm ...` takes a fast path in `goodput.entry.main` (only this module is imported), so a
job start pays for one Python start-up, not for the whole command (`goodput/entry.py`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from recovery import slurm_hooks

app = typer.Typer(
    help="Slurm Prolog/Epilog hooks and node holds (local files only).",
    rich_markup_mode=None,  # as goodput.cli's
    pretty_exceptions_show_locals=False,
)

HOLD_DIR = typer.Option(
    None, "--hold-dir", envvar="GOODPUT_HOLD_DIR", help="where Goodput's node holds live"
)
MAPPING_DIR = typer.Option(
    None,
    "--mapping-dir",
    envvar="DCGM_HPC_JOB_MAPPING_DIR",
    help="dcgm-exporter's --hpc-job-mapping-dir (one file per GPU index with its job ids)",
)


def _finish(outcome: slurm_hooks.Outcome) -> None:
    print(outcome.message, file=sys.stderr if outcome.code else sys.stdout)
    raise typer.Exit(outcome.code)


@app.command("prolog")
def prolog(hold_dir: Path | None = HOLD_DIR, mapping_dir: Path | None = MAPPING_DIR) -> None:
    """Exit 1 (Slurm drains the node, requeues the job) when Goodput holds this node, else 0.
    Without `SchedulerParameters=nohold_on_prolog_fail` Slurm requeues the job held."""
    _finish(slurm_hooks.prolog(os.environ, hold_dir, mapping_dir))


@app.command("epilog")
def epilog(mapping_dir: Path | None = MAPPING_DIR) -> None:
    """Take the job off the GPU job mapping; always exits 0 (a failed Epilog drains the node)."""
    _finish(slurm_hooks.epilog(os.environ, mapping_dir))


@app.command("hold")
def hold(
    node: str,
    reason: str = typer.Option("goodput: held for checking", help="the hold's reason"),
    hold_dir: Path = typer.Option(..., "--hold-dir", envvar="GOODPUT_HOLD_DIR"),
) -> None:
    """Hold NODE: the Prolog refuses jobs there until `release`."""
    try:
        print(slurm_hooks.hold(hold_dir, node, reason))
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="NODE") from e


@app.command("release")
def release(
    node: str, hold_dir: Path = typer.Option(..., "--hold-dir", envvar="GOODPUT_HOLD_DIR")
) -> None:
    """Lift Goodput's hold on NODE (exit 1 when there was none)."""
    try:
        existed = slurm_hooks.release(hold_dir, node)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="NODE") from e
    print(f"{node}: {'released' if existed else 'was not held'}")
    raise typer.Exit(0 if existed else 1)

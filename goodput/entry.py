"""The `goodput` console script. `goodput slurm ...` runs at every job start on every node, so it
imports only its own module; everything else loads the whole command (`goodput.cli`)."""

from __future__ import annotations

import sys

FAST_PATH = {"slurm": "goodput.commands.slurm"}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in FAST_PATH:
        import importlib

        sub = importlib.import_module(FAST_PATH[sys.argv[1]]).app
        sub(args=sys.argv[2:], prog_name=f"goodput {sys.argv[1]}")
    else:
        from goodput.cli import app

        app()


if __name__ == "__main__":
    main()

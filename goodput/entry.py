"""The `goodput` console script. `goodput slurm ...` runs at every job start on every node, so it
imports only its own module; everything else loads the whole command (`goodput.cli`). A file or
directory a command cannot read or write is one line on stderr and exit 2, not a traceback."""

from __future__ import annotations

import sys

FAST_PATH = {"slurm": "goodput.commands.slurm"}


def main() -> None:
    try:
        if len(sys.argv) > 1 and sys.argv[1] in FAST_PATH:
            import importlib

            sub = importlib.import_module(FAST_PATH[sys.argv[1]]).app
            sub(args=sys.argv[2:], prog_name=f"goodput {sys.argv[1]}")
        else:
            from goodput.cli import app

            app()
    except OSError as exc:
        if exc.filename is None:  # not about a path the user named: the whole traceback
            raise
        sys.stderr.write(f"error: {exc.filename}: {exc.strerror or exc}\n")
        sys.exit(2)


if __name__ == "__main__":
    main()

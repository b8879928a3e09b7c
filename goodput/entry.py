"""The `goodput` console script. `goodput slurm ...` runs at every job start on every node, so it
imports only its own module; everything else loads the whole command (`goodput.cli`). A file or
directory a one-off command cannot read or write is one line on stderr and exit 2, not a
traceback (a service keeps its traceback for its log)."""

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
        if exc.filename is None or _service(sys.argv[1:]):  # a service's log keeps it whole
            raise
        sys.stderr.write(f"error: {exc.filename}: {exc.strerror or exc}\n")
        sys.exit(2)


def _service(args: list[str]) -> bool:
    """A long-running service (`receiver serve`, `exporter logs`, ...), not a one-off command."""
    return bool(args) and (args[0] == "exporter" or args[1:2] == ["serve"])


if __name__ == "__main__":
    main()

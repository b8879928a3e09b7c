"""Sub-commands of `goodput`, one module each, each exposing a typer `app`."""

from __future__ import annotations

from pathlib import Path


def unreadable(path: Path) -> str | None:
    """Why `path` is not a file a command can read ('is a directory', 'no such file'), or None."""
    if path.is_file():
        return None
    return "is a directory" if path.is_dir() else "no such file"

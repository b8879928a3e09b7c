"""The Loki shipper's spool: batches waiting for Loki, one JSON file each, oldest first.

A batch file is written to a temporary name, fsync'd and renamed, so a crash leaves either the
whole batch or none of it; `{"resent": bool, "entries": [[labels, ts_ns, line], ...]}`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from clients.loki import Entry, labels_key


class Spool:
    """Batches waiting for Loki, one JSON file each, written atomically, oldest first."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        for tmp in self.dir.glob("*.tmp"):
            tmp.unlink(missing_ok=True)

    def files(self) -> list[Path]:
        return sorted(self.dir.glob("*.json"))

    def bytes(self) -> int:
        return sum(_size(p) for p in self.files())

    def full(self) -> bool:
        return self.bytes() >= self.max_bytes

    def append(self, entries: list[Entry], resent: bool = False, seq: int | None = None) -> Path:
        """A new batch at the end, or at `seq` (what is left of a batch keeps its place)."""
        if seq is None:
            files = self.files()
            seq = int(files[-1].stem) + 1 if files else 1
        data = {"resent": resent, "entries": [[dict(k), ts, line] for k, ts, line in entries]}
        path = self.dir / f"{seq:016d}.json"
        write_atomic(path, json.dumps(data).encode())
        return path

    def read(self, path: Path) -> tuple[list[Entry], bool]:
        data = json.loads(path.read_bytes())
        entries = [(labels_key(k), int(ts), str(line)) for k, ts, line in data["entries"]]
        return entries, bool(data.get("resent"))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

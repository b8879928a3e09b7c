"""Baselines stored per job *name*, so a requeued or resubmitted job starts with its baseline.

One JSON file per name: `<dir>/<name>.json` = {"format", "job_name", "saved", "detectors":
{detector: per-job state}}. Names are sanitised for the file system; files are validated on
load (format, detector names, shapes) and a bad file is ignored with a reason, never trusted.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
FORMAT = "goodput-baseline/1"
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def default_dir() -> Path:
    root = os.environ.get("GOODPUT_STACK_DIR", "/tmp/goodput-stack")  # noqa: S108
    return Path(os.environ.get("GOODPUT_DETECTOR_STATE_DIR", f"{root}/detector")) / "baselines"


class BaselineStore:
    """The files, written at once (`save`), or by one writer thread (`background=True`, the
    service's: a cycle never waits on the disk). In the background the latest state of a
    name wins (one saved twice before the writer reached it is written once), `load` sees a
    save not written yet, `flush` waits for the writes, and a failed write or load is logged,
    counted (`error_count`) and the latest ones kept in `errors`; a killed service loses at
    most the saves not written yet (a file is replaced whole, never left half written). While a
    caller is `busy` (the service's cycle), the writer starts no write: it takes the time
    between cycles, not a cycle's."""

    def __init__(self, directory: str | Path | None = None, background: bool = False) -> None:
        self.dir = Path(directory) if directory else default_dir()
        self.errors: deque[str] = deque(maxlen=100)  # the latest; a full disk must not grow it
        self.error_count = 0
        self.background = background
        self._pending: dict[str, dict[str, dict[str, Any]]] = {}  # name -> states to write
        self._changed = threading.Condition()
        self._writer: threading.Thread | None = None
        self._busy = 0  # callers inside `busy`
        self._flushing = 0  # callers inside `flush`: the writer goes on even when busy

    def path(self, name: str) -> Path:
        safe = _SAFE.sub("_", name)[:120] or "_"
        return self.dir / f"{safe}.json"

    def save(self, name: str, states: dict[str, dict[str, Any]]) -> Path:
        if not self.background:
            return self._write(name, states)
        with self._changed:
            self._pending.pop(name, None)  # to the back of the queue, with its latest state
            self._pending[name] = states
            if self._writer is None:
                self._writer = threading.Thread(target=self._run, daemon=True, name="baselines")
                self._writer.start()
            self._changed.notify_all()
        return self.path(name)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every save handed over is written (or failed); False on timeout."""
        with self._changed:
            self._flushing += 1
            self._changed.notify_all()
            try:
                return self._changed.wait_for(lambda: not self._pending, timeout)
            finally:
                self._flushing -= 1

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Hold the writer back while the caller works: its disk I/O and the interpreter
        lock it takes back after each call would slow a cycle down (saves are still handed
        over, and `load` sees them)."""
        with self._changed:
            self._busy += 1
        try:
            yield
        finally:
            with self._changed:
                self._busy -= 1
                self._changed.notify_all()

    @property
    def pending(self) -> int:
        """Saves handed over and not written yet."""
        with self._changed:
            return len(self._pending)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(self._may_write)
                name, states = next(iter(self._pending.items()))  # the longest waiting
            try:
                self._write(name, states)
            except Exception as exc:  # noqa: BLE001 - the writer thread must outlive any write
                self.error(f"{self.path(name).name}: not saved: {exc}")
            with self._changed:
                if self._pending.get(name) is states:  # else saved again meanwhile: once more
                    del self._pending[name]
                self._changed.notify_all()

    def _may_write(self) -> bool:
        return bool(self._pending) and (not self._busy or bool(self._flushing))

    def _write(self, name: str, states: dict[str, dict[str, Any]]) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.path(name)
        tmp = path.with_suffix(".tmp")
        doc = {"format": FORMAT, "job_name": name, "saved": time.time(), "detectors": states}
        tmp.write_text(json.dumps(doc))
        tmp.replace(path)
        return path

    def load(self, name: str, known: set[str]) -> dict[str, dict[str, Any]] | None:
        """The stored per-detector states for `name`, or None (missing or invalid: see errors);
        a save not written yet is what is stored."""
        with self._changed:
            pending = self._pending.get(name)
        if pending is not None:
            return pending
        path = self.path(name)
        if not path.exists():
            return None
        try:
            doc = json.loads(path.read_text())
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                raise ValueError("wrong format marker")
            if doc.get("job_name") != name:
                raise ValueError(f"file is for job name {doc.get('job_name')!r}")
            states = doc.get("detectors")
            if not isinstance(states, dict) or not set(states) <= known:
                raise ValueError(f"unknown detectors {sorted(set(states or {}) - known)}")
            if not all(isinstance(v, dict) for v in states.values()):
                raise ValueError("detector state is not an object")
            return states
        except (OSError, ValueError) as exc:
            self.error(f"{path.name}: {exc}")
            return None

    def error(self, text: str) -> None:
        log.warning("baselines: %s", text)
        self.errors.append(text)
        self.error_count += 1

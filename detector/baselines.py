"""Baselines stored per job *name*, so a requeued or resubmitted job starts with its baseline.

One JSON file per name: `<dir>/<name>.json` = {"format", "job_name", "saved", "detectors":
{detector: per-job state}}. Names are sanitised for the file system; files are validated on
load (format, detector names, shapes) and a bad file is ignored with a reason, never trusted.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

FORMAT = "goodput-baseline/1"
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def default_dir() -> Path:
    root = os.environ.get("GOODPUT_STACK_DIR", "/tmp/goodput-stack")  # noqa: S108
    return Path(os.environ.get("GOODPUT_DETECTOR_STATE_DIR", f"{root}/detector")) / "baselines"


class BaselineStore:
    def __init__(self, directory: str | Path | None = None) -> None:
        self.dir = Path(directory) if directory else default_dir()
        self.errors: list[str] = []

    def path(self, name: str) -> Path:
        safe = _SAFE.sub("_", name)[:120] or "_"
        return self.dir / f"{safe}.json"

    def save(self, name: str, states: dict[str, dict[str, Any]]) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.path(name)
        tmp = path.with_suffix(".tmp")
        doc = {"format": FORMAT, "job_name": name, "saved": time.time(), "detectors": states}
        tmp.write_text(json.dumps(doc))
        tmp.replace(path)
        return path

    def load(self, name: str, known: set[str]) -> dict[str, dict[str, Any]] | None:
        """The stored per-detector states for `name`, or None (missing or invalid: see errors)."""
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
            self.errors.append(f"{path.name}: {exc}")
            return None

"""Input column spellings (catalogue/columns.yaml): which header means time, node, GPU, job,
and which NVML / nvidia-smi name means which dcgm-exporter field (with its unit scale).

>>> c = columns()
>>> c.role("ts"), c.role(" Hostname "), c.role("index")
('timestamp', 'node', 'gpu')
>>> c.field("gpm_sm_active")
('DCGM_FI_PROF_SM_ACTIVE', 0.01)
>>> c.field("power.draw [W]")
('DCGM_FI_DEV_POWER_USAGE', 1.0)
>>> c.field("DCGM_FI_DEV_GPU_UTIL")
('DCGM_FI_DEV_GPU_UTIL', 1.0)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from catalogue.loader import CatalogueError

PATH = Path(__file__).resolve().parent / "columns.yaml"
_UNIT = re.compile(r"\s*\[[^\]]*\]\s*$")
DCGM_PREFIX = "DCGM_"


def clean(header: object) -> str:
    """A header as matched: trimmed, without a trailing ' [unit]'."""
    return _UNIT.sub("", str(header)).strip()


@dataclass(frozen=True)
class Columns:
    ids: dict[str, tuple[str, ...]]  # role -> spellings (canonical first)
    long: dict[str, tuple[str, ...]]  # name | value -> spellings
    fields: dict[str, tuple[str, float]]  # alias -> (dcgm-exporter field, scale)
    own: tuple[str, ...] = ()  # Goodput's own per-GPU columns, read as themselves

    def role(self, header: object) -> str | None:
        h = clean(header)
        return next((r for r, names in self.ids.items() if h in names), None)

    def long_role(self, header: object) -> str | None:
        h = clean(header)
        return next((r for r, names in self.long.items() if h in names), None)

    def field(self, header: object) -> tuple[str, float] | None:
        """(dcgm-exporter name, scale) for a metric header; DCGM_* names map to themselves."""
        h = clean(header)
        if h in self.fields:
            return self.fields[h]
        return (h, 1.0) if h.startswith(DCGM_PREFIX) or h in self.own else None

    def accepted(self, role: str) -> str:
        """The spellings of one role, for an error message."""
        return ", ".join(self.ids.get(role) or self.long.get(role) or ())


def load(path: Path = PATH) -> Columns:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise CatalogueError(f"{path}: {exc}") from exc
    where = path.name
    ids = {str(r): tuple(str(n) for n in names) for r, names in (doc.get("ids") or {}).items()}
    for role in ("timestamp", "node", "gpu", "job_id"):
        if not ids.get(role) or ids[role][0] != role:
            raise CatalogueError(f"{where}: ids.{role} must list {role!r} first")
    long = {str(r): tuple(str(n) for n in names) for r, names in (doc.get("long") or {}).items()}
    fields: dict[str, tuple[str, float]] = {}
    for target, aliases in (doc.get("fields") or {}).items():
        if not str(target).startswith(DCGM_PREFIX):
            raise CatalogueError(f"{where}: fields.{target}: not a dcgm-exporter name")
        for a in aliases:
            name, scale = (
                (a["name"], float(a.get("scale", 1.0))) if isinstance(a, dict) else (a, 1.0)
            )
            if name in fields:
                raise CatalogueError(f"{where}: {name!r} is listed for two fields")
            fields[str(name)] = (str(target), scale)
    seen: dict[str, str] = {}
    for role, names in [*ids.items(), *long.items()]:
        for n in names:
            if n in seen or n in fields:
                raise CatalogueError(f"{where}: {n!r} is listed twice ({seen.get(n, 'fields')})")
            seen[n] = role
    own = tuple(str(n) for n in doc.get("own") or ())
    return Columns(ids, long, fields, own)


@lru_cache(maxsize=1)
def columns() -> Columns:
    return load()

"""Physics priors per GPU model (`priors.yaml`): load, validate, resolve a model's parameters.

>>> p = load()
>>> p.params("NVIDIA H200")["spin_power_max_w"], p.params("some new GPU")["busy_util"]
(200.0, 95.0)
>>> "spin_power_max_w" in p.params("some new GPU")  # the generic fallback knows no wattage
False
>>> sorted({r.id for r in p.rules})
['clock_collapse', 'hw_slowdown', 'spin_wait']
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
_DEFAULT = str(HERE / "priors.yaml")
OPS = (">=", "<=", ">", "<", "&")
GENERIC = "generic"
TEXT = ("source", "also")  # the keys of a model entry that are not parameters


class PriorsError(ValueError):
    """priors.yaml does not follow its schema; the message names the entry."""


@dataclass(frozen=True)
class Clause:
    field: str
    op: str
    value: float | str  # a number, or the name of a model parameter


@dataclass(frozen=True)
class Rule:
    id: str
    score: float
    when: tuple[Clause, ...]
    wait: bool = False  # a GPU waiting for another rank: a hang only when that rank is stuck


@dataclass(frozen=True)
class Priors:
    models: dict[str, dict[str, float]]  # resolved: generic merged under each listed model
    rules: tuple[Rule, ...]
    working: tuple[tuple[Clause, ...], ...] = ()  # alternatives: a GPU doing real work

    def params(self, model: str) -> dict[str, float]:
        """The parameters for `model` (dcgm's modelName); the generic set if it is not listed."""
        return self.models.get(model, self.models[GENERIC])


def _number(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or abs(v) > 1e12:
        raise PriorsError(f"{where}: want a finite number, got {v!r}")
    return float(v)


def _parse(doc: Any) -> Priors:
    if not isinstance(doc, dict) or doc.get("version") != 1:
        raise PriorsError("priors: want a mapping with version: 1")
    raw = doc.get("models")
    if not isinstance(raw, dict) or GENERIC not in raw:
        raise PriorsError("models: want a mapping with a 'generic' entry")
    models: dict[str, dict[str, float]] = {}
    same: dict[str, str] = {}  # another modelName of the same GPU -> the entry that holds it
    for name, entry in raw.items():
        if not isinstance(entry, dict):
            raise PriorsError(f"models.{name}: want a mapping")
        models[str(name)] = {
            k: _number(v, f"models.{name}.{k}") for k, v in entry.items() if k not in TEXT
        }
        also = entry.get("also", [])
        if not isinstance(also, list) or not all(isinstance(a, str) for a in also):
            raise PriorsError(f"models.{name}.also: want a list of modelName strings")
        for a in also:
            if a in raw or a in same:
                raise PriorsError(f"models.{name}.also: {a!r} is a model or alias already")
            same[a] = str(name)
    generic = models[GENERIC]
    resolved = {n: {**generic, **p} for n, p in models.items()}
    resolved.update({a: resolved[n] for a, n in same.items()})
    known = set().union(*resolved.values())
    rules = []
    for i, r in enumerate(doc.get("rules") or []):
        where = f"rules.{i}"
        if not isinstance(r, dict) or not isinstance(r.get("id"), str):
            raise PriorsError(f"{where}: want a mapping with an id")
        clauses = _clauses(r.get("when"), f"{where}.when", known)
        score = _number(r.get("score"), f"{where}.score")
        if score <= 0:
            raise PriorsError(f"{where}.score: must be > 0")
        wait = r.get("wait", False)
        if not isinstance(wait, bool):
            raise PriorsError(f"{where}.wait: want true or false, got {wait!r}")
        rules.append(Rule(r["id"], score, clauses, wait))
    working = doc.get("working") or []
    if not isinstance(working, list):
        raise PriorsError("working: want a list of alternatives, each a list of clauses")
    alts = tuple(_clauses(a, f"working.{i}", known) for i, a in enumerate(working))
    return Priors(resolved, tuple(rules), alts)


def _clauses(raw: Any, where: str, known: set[str]) -> tuple[Clause, ...]:
    """[[field, op, value], ...] (value a number or a parameter some model defines), at least
    one."""
    clauses = []
    for j, c in enumerate(raw if isinstance(raw, list) else []):
        if not (isinstance(c, list) and len(c) == 3 and c[1] in OPS):
            raise PriorsError(f"{where}.{j}: want [field, op, value], op in {OPS}")
        field, op, value = c
        if isinstance(value, str):
            if value not in known:
                raise PriorsError(f"{where}.{j}: no model defines parameter {value!r}")
        else:
            value = _number(value, f"{where}.{j}")
        clauses.append(Clause(str(field), op, value))
    if not clauses:
        raise PriorsError(f"{where}: want at least one [field, op, value] clause")
    return tuple(clauses)


@lru_cache(maxsize=4)
def _load(path: str) -> Priors:
    return _parse(yaml.safe_load(Path(path).read_text()))


def load(path: str | os.PathLike[str] | None = None) -> Priors:
    """priors.yaml from `path`, `$GOODPUT_CATALOGUE_DIR`, or this package (cached)."""
    if path is None:
        base = os.environ.get("GOODPUT_CATALOGUE_DIR")
        return _load(str(Path(base) / "priors.yaml") if base else _DEFAULT)
    return _load(str(path))

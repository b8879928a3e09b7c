"""The attribution rules (`recovery/rules/*.yaml`) as typed entries, with cross-references.

Each entry is checked by a pydantic model (unknown keys rejected, `catalogue.schema.check`);
then every symptom a rule names must be produced by something: a catalogue pattern (its
`symptom`), an XID class (`BUILT_IN`), a metric or a Slurm rule. Errors name the file and the
entry. `load(directory)` returns the merged rules as plain dicts (what attribution reads).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, model_validator

import catalogue
from catalogue.schema import Strict, check

Role = Literal["initiating", "cascade"]
#: Symptoms attribution makes in code: the XID classes (by the catalogue's table) and a node
#: whose every GPU stopped reporting (a `vanished` metric rule).
BUILT_IN = frozenset(
    {"xid_fatal", "xid_app", "xid_degradation", "xid_cascade", "xid_other", "xid_unknown"}
    | {"node_silent"}
)
_NEEDS = {  # metric rule kind -> the keys it cannot do without
    "xid": ("metric",),
    "increase": ("metric", "min"),
    "above": ("metric", "min"),
    "vanished": ("metric",),
    "prior": ("rule", "min_s"),
    "idle": ("util_max", "min_s"),
    "stall": ("metric", "min_s"),
    "slowdown": ("metric", "ratio"),
    "starved": ("metric", "ratio", "min_s", "busy_share", "util_min"),
    "peer_low": ("metric", "ratio", "min_s"),
    "overrun": ("stalls", "pauses", "min_s"),
}


class RuleError(ValueError):
    """A rules file is malformed or names what nothing produces."""


class _Rule(Strict):
    model_config = Strict.model_config | {"strict": False}


class LogOverride(_Rule):
    pattern: str  # a catalogue pattern id
    role: Role | None = None
    outcome: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_signature(cls, data: Any) -> Any:
        if isinstance(data, dict) and ("regex" in data or "pattern" not in data):
            raise ValueError(
                "an override names a catalogue `pattern` id "
                "(signatures live in catalogue/patterns.yaml)"
            )
        return data


class MetricRule(_Rule):
    id: str
    kind: Literal["xid", "increase", "above", "vanished", "prior", "idle", "stall", "slowdown",
                  "starved", "peer_low", "overrun"]  # fmt: skip
    metric: str | None = None
    rule: str | None = None  # kind prior: a rule of catalogue/priors.yaml
    max_nodes: int | None = Field(default=None, ge=1)
    fb_min: float | str | None = None  # a number, or the name of a generic physics prior
    unless_pause: bool | None = None
    unless_save: bool | None = None  # kind idle: not inside a save (a pause after progress)
    peers_spin: str | None = None  # an earlier metric rule's symptom
    stalls: list[str] | None = None  # kind overrun: earlier metric rules' symptoms
    pauses: list[str] | None = None  # kind overrun: the catalogue pause patterns it is about
    from_start: bool | None = None  # kind idle: GPUs idle since their first sample
    confirm: str | None = None  # kind idle: a detector score that must reach `min`
    role: Role | None = None
    outcome: str | None = None
    min: float | None = None
    min_s: float | None = Field(default=None, ge=0)
    gap_s: float | None = Field(default=None, ge=0)
    ratio: float | None = Field(default=None, gt=0)
    # kinds slowdown and starved: a series holding the job's usual value (the detector's
    # learned step time), the reference where the window's early part is already `ratio`
    # slower than it; kind starved: `busy_reference`, the job's usual busy utilisation then
    reference: str | None = None
    busy_reference: str | None = None
    busy_share: float | None = Field(default=None, gt=0, le=1)  # kind starved
    util_min: float | str | None = None  # a number, or the name of a generic physics prior
    util_max: float | str | None = None
    sm_max: float | str | None = None
    power_max_ratio: float | None = None
    scope: Literal["some", "all"] | None = None
    # kind increase: a counter of time, in seconds per unit (DCGM's violation counters: 1e-6)
    seconds_per_unit: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _complete(self) -> MetricRule:
        missing = [k for k in _NEEDS[self.kind] if getattr(self, k) is None]
        if missing:
            raise ValueError(f"kind {self.kind} needs {missing}")
        if self.seconds_per_unit is not None and self.kind != "increase":
            raise ValueError(f"kind {self.kind} counts no time (`seconds_per_unit`: increase)")
        if self.reference is not None and self.kind not in ("slowdown", "starved", "overrun"):
            raise ValueError(
                f"kind {self.kind} reads no `reference` (kinds slowdown, starved, overrun do)"
            )
        if self.busy_reference is not None and self.kind != "starved":
            raise ValueError(f"kind {self.kind} reads no `busy_reference` (kind starved does)")
        return self


class SlurmRule(_Rule):
    id: str
    role: Role
    outcome: str | None = None
    job_state: list[str] | None = None
    node_state: list[str] | None = None
    exit_code: list[int] | None = None
    signal: list[int] | None = None

    @model_validator(mode="after")
    def _matches_something(self) -> SlurmRule:
        if not (self.job_state or self.node_state or self.exit_code or self.signal):
            raise ValueError("needs job_state, node_state, exit_code or signal")
        return self


class OutcomeRule(_Rule):
    outcome: str
    symptoms: list[str] = Field(min_length=1)
    culprit: Literal["symptom", "none", "suspect"] = "none"
    confidence: float = Field(default=0.5, ge=0.0, le=1.0)
    explains: list[str] = []
    unless: list[str] = []
    any_role: bool = False
    headline: str | None = None  # a symptom of `symptoms` whose text heads the root cause


class RulesFile(_Rule):
    tolerance_s: float | None = Field(default=None, ge=0, le=3600)
    log: list[dict[str, Any]] = []
    metrics: list[dict[str, Any]] = []
    slurm: list[dict[str, Any]] = []
    outcomes: list[dict[str, Any]] = []


_MODELS: dict[str, type[_Rule]] = {
    "log": LogOverride,
    "metrics": MetricRule,
    "slurm": SlurmRule,
    "outcomes": OutcomeRule,
}


def _name(entry: Any) -> str:
    if isinstance(entry, dict):
        for key in ("id", "pattern", "outcome"):
            if isinstance(entry.get(key), str):
                return f" ({entry[key]})"
    return ""


def load(base: Path) -> tuple[dict[str, list[dict[str, Any]]], float]:
    """The merged, checked rules of every `*.yaml` in `base` (name order) and the tolerance."""
    merged: dict[str, list[dict[str, Any]]] = {k: [] for k in _MODELS}
    where_of: dict[int, str] = {}
    tolerance = 20.0
    for path in sorted(base.glob("*.yaml")):
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise RuleError(f"{path.name}: invalid YAML: {exc}") from None
        doc = check(RulesFile, raw, path.name, RuleError)
        for key, model in _MODELS.items():
            for i, entry in enumerate(getattr(doc, key)):
                where = f"{path.name}: {key}[{i}]{_name(entry)}"
                rule = check(model, entry, where, RuleError).model_dump(exclude_none=True)
                where_of[id(rule)] = where
                merged[key].append(rule)
        if doc.tolerance_s is not None:
            tolerance = doc.tolerance_s
    _cross_check(merged, where_of)
    return merged, tolerance


def _cross_check(rules: dict[str, list[dict[str, Any]]], where_of: dict[int, str]) -> None:
    """Outcomes exist, overrides name catalogue patterns, every named symptom is produced."""
    outcomes = set(catalogue.outcomes())
    patterns = {p.id: p for p in catalogue.load_patterns()}
    produced = set(BUILT_IN)
    produced |= {p.symptom for p in patterns.values() if p.role != "info"}
    produced |= {r["id"] for r in rules["metrics"]} | {r["id"] for r in rules["slurm"]}
    for i, r in enumerate(rules["metrics"]):  # a rule reads only symptoms of rules before it
        before = {m["id"] for m in rules["metrics"][:i]}
        for key, refs in (("peers_spin", [r.get("peers_spin")]), ("stalls", r.get("stalls", []))):
            for ref in refs:
                if ref is not None and ref not in before:
                    raise RuleError(
                        f"{where_of[id(r)]}: {key} {ref!r} names no metric rule before it"
                    )
    for key in _MODELS:
        for r in rules[key]:
            where = where_of[id(r)]
            if r.get("outcome") and r["outcome"] not in outcomes:
                raise RuleError(f"{where}: unknown outcome {r['outcome']!r}")
            pauses = {
                p for p in r.get("pauses", ()) if getattr(patterns.get(p), "symptom", "") != "pause"
            }
            if pauses:
                raise RuleError(f"{where}: pauses {sorted(pauses)}: no catalogue pause pattern")
            if key == "log" and r["pattern"] not in patterns:
                raise RuleError(
                    f"{where}: unknown catalogue pattern {r['pattern']!r} "
                    "(signatures live in catalogue/patterns.yaml)"
                )
            if r.get("headline") and r["headline"] not in r.get("symptoms", ()):
                raise RuleError(f"{where}: headline {r['headline']!r} is none of its symptoms")
            for field in ("symptoms", "explains", "unless"):
                orphans = sorted(set(r.get(field, ())) - produced)
                if orphans:
                    raise RuleError(
                        f"{where}: {field} {orphans}: no pattern, XID class, metric or Slurm "
                        "rule produces them"
                    )

"""The operator's recovery policy: YAML, validated into a frozen value.

`load_policy(path)` reads `path` (default: `$GOODPUT_POLICY_FILE`, else the packaged
`policy.default.yaml`, which documents every key); `GOODPUT_MODE` overrides the cluster mode.
Unknown keys, unknown outcomes/actions and out-of-range numbers are errors with the key named.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from functools import reduce
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

import catalogue
from recovery.diagnosis import OUTCOMES  # one list of outcomes: the diagnosis schema
from recovery.node_health import ReturnToService

# The action vocabulary and its kinds: the catalogue's (catalogue/outcomes.yaml `actions`).
_VOCAB = catalogue.actions()
ACTIONS: tuple[str, ...] = tuple(_VOCAB)
DESTRUCTIVE: tuple[str, ...] = tuple(a for a, x in _VOCAB.items() if x.destructive)
RESTARTS: tuple[str, ...] = tuple(a for a, x in _VOCAB.items() if x.restarts)
DRAINS: tuple[str, ...] = tuple(a for a, x in _VOCAB.items() if x.drains)
MODES = ("monitor", "approve", "act")

Mode = Literal["monitor", "approve", "act"]
#: For the type checker and the JSON schema; a test fails when it and ACTIONS drift apart.
ActionKind = Literal[
    "drain", "drain_and_requeue", "requeue", "stop", "hold_for_person", "resume_node", "none"
]
DEFAULT_FILE = Path(__file__).with_name("policy.default.yaml")


class PolicyError(ValueError):
    """The policy file is missing, unreadable or invalid."""


def narrower(a: str, b: str) -> str:
    """The more restrictive of two modes (monitor < approve < act)."""
    return a if MODES.index(a) <= MODES.index(b) else b


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Retry(_Frozen):
    max_requeues_per_job: int = Field(default=3, ge=0, le=100)
    sticky_after: int = Field(default=1, ge=1, le=100)
    backoff_s: tuple[float, ...] = Field(default=(0.0, 60.0, 300.0), min_length=1)
    requeue_within_s: float = Field(default=900.0, gt=0, le=7 * 86400)

    @field_validator("backoff_s")
    @classmethod
    def _nonneg(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if any(x < 0 or x > 86400 for x in v):
            raise ValueError("backoff values must be within 0..86400 seconds")
        return v

    def backoff_for(self, restarts_done: int) -> float:
        """Seconds to wait before restart number `restarts_done + 1`."""
        return self.backoff_s[min(restarts_done, len(self.backoff_s) - 1)]


class BlastRadius(_Frozen):
    max_drains_per_hour: int = Field(default=4, ge=0, le=100000)
    max_partition_unavailable_fraction: float = Field(default=0.5, ge=0.0, le=1.0)
    min_healthy_nodes: int = Field(default=1, ge=0, le=100000)


class WatchdogPolicy(_Frozen):
    """Fail-open (recovery/watchdog.py): what the receiver's health needs, and how fast."""

    enabled: bool = True
    interval_s: float = Field(default=15.0, ge=1.0, le=3600.0)
    failures_before_stop: int = Field(default=2, ge=1, le=100)
    required: tuple[Literal["scheduler", "prometheus", "loki", "logs"], ...] = (
        "scheduler",
        "prometheus",
        "loki",
    )
    alert_silence_s: float | None = Field(default=None, gt=0, le=7 * 86400)


class Retention(_Frozen):
    payload_days: float = Field(default=30.0, gt=0, le=3650)
    audit_days: float = Field(default=365.0, gt=0, le=36500)
    prune_every_s: float = Field(default=3600.0, ge=10, le=86400)


class DirectiveBounds(_Frozen):
    enabled: bool = True
    allow_mode_widening: bool = False
    max_requeues_cap: int = Field(default=3, ge=0, le=100)
    allowed_actions: tuple[ActionKind, ...] = ("requeue", "stop", "hold_for_person", "none")
    overridable_outcomes: tuple[str, ...] = (
        "workload_crash",
        "workload_hang",
        "workload_divergence",
        "workload_oom",
        "unknown",
    )

    @field_validator("overridable_outcomes")
    @classmethod
    def _outcomes(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [o for o in v if o not in OUTCOMES]
        if bad:
            raise ValueError(f"unknown outcomes {bad}")
        return v


def _default_actions() -> dict[str, str]:
    """Outcome -> default action: each catalogue outcome's `action` (catalogue/outcomes.yaml)."""
    return {o.id: o.action for o in catalogue.outcomes().values()}


class Policy(_Frozen):
    """The operator's policy. `job_mode`/`job_actions` are set only by directive merging."""

    mode: Mode = "monitor"
    partition_modes: dict[str, Mode] = Field(default_factory=dict)
    # Canary: when set, Goodput acts only on jobs and nodes of these partitions (in the mode
    # above); everywhere else it plans in monitor mode. partition_modes still wins.
    canary_partitions: tuple[str, ...] = ()
    approval_expiry_s: float = Field(default=1800.0, gt=0, le=7 * 86400)
    actions: dict[str, str] = Field(default_factory=_default_actions)
    min_confidence: dict[str, float] = Field(
        default_factory=lambda: {
            "drain": 0.7,
            "drain_and_requeue": 0.7,
            "requeue": 0.5,
            "stop": 0.8,
        }
    )
    retry: Retry = Retry()
    blast_radius: BlastRadius = BlastRadius()
    directives: DirectiveBounds = DirectiveBounds()
    return_to_service: ReturnToService = ReturnToService()
    retention: Retention = Retention()
    watchdog: WatchdogPolicy = WatchdogPolicy()
    # A signature's action hint (an XID's job_action, a pattern's action in the catalogue)
    # replaces the outcome's default action; off: the outcome alone decides.
    honour_catalogue_hints: bool = True
    job_mode: Mode | None = None

    @field_validator("actions")
    @classmethod
    def _actions(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [o for o in v if o not in OUTCOMES]
        if bad:
            raise ValueError(f"unknown outcomes {bad}; known: {list(OUTCOMES)}")
        wrong = {o: a for o, a in v.items() if a not in ACTIONS}
        if wrong:
            raise ValueError(f"unknown actions {wrong}; known: {list(ACTIONS)}")
        return {**_default_actions(), **v}

    @field_validator("min_confidence")
    @classmethod
    def _conf(cls, v: dict[str, float]) -> dict[str, float]:
        for k, x in v.items():
            if k not in DESTRUCTIVE:
                raise ValueError(f"min_confidence.{k}: only {list(DESTRUCTIVE)} have one")
            if not 0.0 <= x <= 1.0:
                raise ValueError(f"min_confidence.{k} must be within 0..1")
        return v

    def action_for(self, outcome: str, hint: str = "") -> str:
        """The action for `outcome`; a signature's catalogue `hint` replaces it when hints are
        honoured and the outcome's action is still the catalogue's default (an operator's or a
        job's own choice for the outcome wins)."""
        action = self.actions.get(outcome, self.actions["unknown"])
        if hint in ACTIONS and self.honour_catalogue_hints:
            if action == _default_actions().get(outcome):
                return hint
        return action

    def outside_canary(self, partition: str | Iterable[str] | None) -> bool:
        """A canary list is set and a partition of `partition` (a job's may be a comma list),
        or none, is neither on it nor given a mode of its own."""
        if not self.canary_partitions:
            return False
        parts = _parts(partition)
        own = set(self.canary_partitions) | set(self.partition_modes)
        return not parts or not parts <= own

    def mode_for(self, partition: str | Iterable[str] | None) -> str:
        """The narrowest of its partitions' modes (a job's may be a comma list; a node is in
        several): a partition's own mode, else monitor outside the canary partitions, else the
        cluster's; then narrowed (or widened) by the job."""
        parts = _parts(partition)
        mode = (
            reduce(narrower, sorted(map(self._partition_mode, parts)))
            if parts
            else ("monitor" if self.canary_partitions else self.mode)
        )
        if self.job_mode is not None:
            if self.directives.allow_mode_widening:
                mode = self.job_mode
            else:
                mode = narrower(mode, self.job_mode)
        return mode

    def _partition_mode(self, partition: str) -> str:
        own = self.partition_modes.get(partition)
        if own is not None:
            return own
        outside = self.canary_partitions and partition not in self.canary_partitions
        return "monitor" if outside else self.mode


def _parts(partition: str | Iterable[str] | None) -> set[str]:
    """The partition names of a comma list (as Slurm prints a job's) or of several."""
    names = partition.split(",") if isinstance(partition, str) else (partition or ())
    return {p.strip() for p in names if p and p.strip()}


def parse_policy(doc: Any, env: dict[str, str] | None = None) -> Policy:
    """Validate a policy document (a mapping); `GOODPUT_MODE` in `env` overrides `mode`."""
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise PolicyError("the policy must be a mapping at the top level")
    e = os.environ if env is None else env
    mode = e.get("GOODPUT_MODE", "").strip()
    if mode:
        if mode not in MODES:
            raise PolicyError(f"GOODPUT_MODE={mode!r} is not one of {list(MODES)}")
        doc = {**doc, "mode": mode}
    if "job_mode" in doc:
        raise PolicyError("job_mode is set by job directives, not by the policy file")
    try:
        return Policy.model_validate(doc)
    except ValidationError as exc:
        msgs = [
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()[:10]
        ]
        raise PolicyError("invalid policy: " + "; ".join(msgs)) from None


def load_policy(path: str | Path | None = None, env: dict[str, str] | None = None) -> Policy:
    """Load and validate the policy file (see the module docstring for the lookup order)."""
    e = dict(os.environ) if env is None else env
    chosen = Path(path or e.get("GOODPUT_POLICY_FILE") or DEFAULT_FILE)
    try:
        doc = yaml.safe_load(chosen.read_text())
    except OSError as exc:
        raise PolicyError(f"cannot read policy file {chosen}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise PolicyError(f"policy file {chosen} is not valid YAML: {exc}") from None
    return parse_policy(doc, e)

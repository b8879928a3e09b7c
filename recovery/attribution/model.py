"""What the attribution stages share: the symptom (`Sym`), the rules loaded from
`recovery/rules/*.yaml` with their physics-prior thresholds resolved (`load_rules`), the
constants that name progress, running states and metrics, and the time order of symptoms."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from catalogue import priors as physics_priors
from recovery import ruleset
from recovery.evidence import LogLine
from recovery.ruleset import RuleError as RuleError  # re-exported: a rules file is malformed

RULES_DIR = Path(__file__).resolve().parent.parent / "rules"
SOURCES = ("prometheus", "log", "slurm")
PROGRESS = frozenset({"progress", "checkpoint"})  # catalogue info symptoms of a working job
MILESTONE = "job_start"  # catalogue info symptom: start-up done (the work before it ended)
OWN_ADDRESS = "own_address"  # catalogue info symptom: a rank announced its own address


class Pause(NamedTuple):
    """The pause a job's log opened last, while still open: its line and catalogue pattern."""

    line: LogLine
    pattern: str


PROGRESS_METRICS = ("goodput_job_last_progress_timestamp_seconds", "goodput_job_iteration")
RUNNING = ("RUNNING", "COMPLETING", "CONFIGURING")
# metric-rule thresholds that may name a physics prior (catalogue/priors.yaml) instead of a number
PRIOR_KEYS = ("min", "util_min", "util_max", "sm_max", "fb_min", "mask")
FB_USED = "DCGM_FI_DEV_FB_USED"


@dataclass
class Sym:
    id: str
    role: str
    time: float | None
    source: str
    node: str | None = None
    gpu: str | None = None
    detail: str = ""
    outcome: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    action: str = ""  # the catalogue's action hint of the signature (an XID's job_action)
    # how the node of a symptom that other nodes reported was found (lines naming a remote
    # peer, logged by several nodes: `logs._witnessed`): "" seen there; "address": the peer
    # those lines name, by the address it announced; "silent": the one node of the job that
    # logged none of them; "unplaced": none (the node is None)
    placed: str = ""


@dataclass(frozen=True)
class Rules:
    log: tuple[dict[str, Any], ...]
    metrics: tuple[dict[str, Any], ...]
    slurm: tuple[dict[str, Any], ...]
    outcomes: tuple[dict[str, Any], ...]
    tolerance_s: float


@lru_cache(maxsize=4)
def load_rules(directory: str | None = None) -> Rules:
    """Merge every `*.yaml` in `directory` (default: the packaged rules), in name order;
    typed and cross-checked by `recovery.ruleset` (`RuleError` names the file and entry)."""
    base = Path(directory or os.environ.get("GOODPUT_RULES_DIR") or RULES_DIR)
    merged, tolerance = ruleset.load(base)
    return Rules(
        log=tuple(merged["log"]),
        metrics=tuple(_resolve_priors(r) for r in merged["metrics"]),
        slurm=tuple(merged["slurm"]),
        outcomes=tuple(merged["outcomes"]),
        tolerance_s=tolerance,
    )


def _resolve_priors(rule: dict[str, Any]) -> dict[str, Any]:
    """A metric rule with its threshold names (`util_min: busy_util`) replaced by the physics
    priors' values (catalogue/priors.yaml, the one home of those thresholds). The series carry no
    GPU model, so the model-independent `generic` parameters apply."""
    params = physics_priors.load().params(physics_priors.GENERIC)
    out = dict(rule)
    for key in PRIOR_KEYS:
        value = out.get(key)
        if isinstance(value, str):
            if value not in params:
                raise RuleError(f"metric rule {rule.get('id')}: no generic prior named {value!r}")
            out[key] = params[value]
    return out


def _key(s: Sym) -> float:
    return s.time if s.time is not None else float("inf")


def clip(text: str, limit: int) -> str:
    """`text` at most `limit` characters, cut at a space where one is near and marked `…`."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit * 3 // 4 else cut).rstrip() + "…"

"""Job directives: a job's own wishes in its Slurm `--comment`, bounded by the operator.

    --comment='{"goodput": {"mode": "monitor", "max_requeues": 1, "on_hang": "stop",
                            "actions": {"workload_crash": "stop"}}}'

`parse_directive(comment)` returns `(Directive | None, error | None)`: a comment without a
`goodput` key is no directive; an invalid one is ignored (the caller audits the error), never
fatal. `merge(policy, directive)` returns the job's policy: a mode may only narrow (unless the
operator allows widening), requeues are capped, actions only from the allowed set.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from recovery.policy import ACTIONS, MODES, OUTCOMES, Policy

MAX_COMMENT = 4096
SHORTHANDS = {
    "on_hang": "workload_hang",
    "on_crash": "workload_crash",
    "on_oom": "workload_oom",
    "on_divergence": "workload_divergence",
}
KEYS = {"mode", "max_requeues", "actions", *SHORTHANDS}


@dataclass(frozen=True)
class Directive:
    mode: str | None = None
    max_requeues: int | None = None
    actions: dict[str, str] = field(default_factory=dict)


def parse_directive(comment: str | None) -> tuple[Directive | None, str | None]:
    """Parse a job comment; `(None, None)` when it carries no Goodput directive."""
    if not comment or "goodput" not in comment:
        return None, None
    if len(comment) > MAX_COMMENT:
        return None, f"comment longer than {MAX_COMMENT} characters"
    try:
        doc = json.loads(comment)
    except ValueError:
        return None, "comment mentions goodput but is not JSON"
    except RecursionError:  # `[` x 1000 fits in a comment
        return None, "comment mentions goodput but nests too deeply"
    if not isinstance(doc, dict) or "goodput" not in doc:
        return None, None
    d = doc["goodput"]
    if not isinstance(d, dict):
        return None, "goodput directive must be an object"
    unknown = sorted(set(d) - KEYS)
    if unknown:
        return None, f"unknown directive keys {unknown}; known: {sorted(KEYS)}"
    mode = d.get("mode")
    if mode is not None and mode not in MODES:
        return None, f"mode {mode!r} is not one of {list(MODES)}"
    maxr = d.get("max_requeues")
    if maxr is not None and (isinstance(maxr, bool) or not isinstance(maxr, int) or maxr < 0):
        return None, "max_requeues must be a non-negative integer"
    actions = d.get("actions", {})
    if not isinstance(actions, dict):
        return None, "actions must be an object of outcome -> action"
    actions = dict(actions)
    for short, outcome in SHORTHANDS.items():
        if short in d:
            actions[outcome] = d[short]
    for outcome, action in actions.items():
        if outcome not in OUTCOMES:
            return None, f"unknown outcome {outcome!r} in directive"
        if action not in ACTIONS:
            return None, f"unknown action {action!r} for {outcome}"
    return Directive(mode=mode, max_requeues=maxr, actions=actions), None


def check_bounds(policy: Policy, directive: Directive) -> str | None:
    """Why the directive exceeds the operator's bounds, or None when it is within them."""
    b = policy.directives
    if not b.enabled:
        return "job directives are disabled by the operator policy"
    for outcome, action in directive.actions.items():
        if outcome not in b.overridable_outcomes:
            return f"outcome {outcome} is not overridable by jobs"
        if action not in b.allowed_actions:
            return f"action {action} is not allowed in job directives"
    return None


def merge(policy: Policy, directive: Directive | None) -> Policy:
    """The job's policy: the operator's, narrowed by the directive (assumed within bounds)."""
    if directive is None or check_bounds(policy, directive) is not None:
        return policy
    changes: dict[str, Any] = {}
    if directive.mode is not None:
        changes["job_mode"] = directive.mode
    if directive.max_requeues is not None:
        cap = max(policy.directives.max_requeues_cap, 0)
        changes["retry"] = policy.retry.model_copy(
            update={"max_requeues_per_job": min(directive.max_requeues, cap)}
        )
    if directive.actions:
        changes["actions"] = {**policy.actions, **directive.actions}
    return policy.model_copy(update=changes) if changes else policy

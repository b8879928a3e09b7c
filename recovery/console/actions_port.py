"""The console's view of recovery actions, through the outbox (`recovery.outbox`), the
approvals and pause switch that alone may change one (`recovery.approvals`,
`recovery.action_config`), and the audit log.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Engine

from recovery import action_config, approvals, audit, outbox
from recovery.action_config import probe_scheduler  # noqa: F401 - the console's health page
from recovery.policy import DRAINS, Policy, PolicyError


def available() -> bool:
    """Whether decisions can be made here (always, now that actions are part of the receiver)."""
    return True


def policy_in_force(settings: Any) -> tuple[Policy | None, str]:
    """The policy the receiver acts on, and where it came from (or why it failed)."""
    try:
        return action_config.config(settings).policy, "as the receiver's actions load it"
    except (PolicyError, ValueError) as exc:
        return None, str(exc)


def _view(a: dict[str, Any], now: float) -> dict[str, Any]:
    body: dict[str, Any] = a["body"] if isinstance(a.get("body"), dict) else {}
    action: dict[str, Any] = body["action"] if isinstance(body.get("action"), dict) else {}
    diag: dict[str, Any] = body["diagnosis"] if isinstance(body.get("diagnosis"), dict) else {}
    expires = a.get("expires_at")
    return {
        "action_id": str(a.get("id", "")),
        "incident_id": a.get("incident_id"),
        "job_id": a.get("job_id"),
        "kind": a.get("kind") or action.get("kind") or "?",
        "state": a.get("state"),
        "mode": a.get("mode") or action.get("mode"),
        "disposition": action.get("disposition"),
        "nodes": action.get("nodes") or [],
        "exclude": action.get("exclude") or [],
        "reasons": action.get("reasons") or [],
        "directive": body.get("directive"),
        "outcome": diag.get("outcome"),
        "confidence": diag.get("confidence"),
        "root_cause": diag.get("root_cause"),
        "requested_at": a.get("created_at"),
        "expires_at": expires if isinstance(expires, int | float) else None,
        "expired": isinstance(expires, int | float) and expires <= now,
        "decided_by": a.get("decided_by"),
        "result": a.get("result"),
        "last_error": a.get("last_error"),
    }


def pending(engine: Engine, now: float | None = None) -> list[dict[str, Any]]:
    """Actions waiting for a person, oldest first, with their expiry."""
    now = time.time() if now is None else now
    rows = outbox.list_actions(engine, state="pending_approval", limit=1000)
    return sorted((_view(a, now) for a in rows), key=lambda a: a["requested_at"] or 0)


def incident_action(engine: Engine, incident_id: int) -> dict[str, Any] | None:
    """The incident's latest action, or None."""
    found = outbox.incident_action(engine, str(incident_id))
    return _view(found, time.time()) if found else None


def decide(engine: Any, settings: Any, action_id: str, verdict: str, who: str, reason: str) -> str:
    """Approve (and execute) or reject; returns a one-line result. Raises ValueError on refusal
    (unknown action, not pending)."""
    if verdict == "approve":
        out = approvals.approve(engine, settings, action_id, who, reason)
    else:
        out = approvals.reject(engine, action_id, who, reason)
    state = out.get("state") if isinstance(out, dict) else None
    return f"now {state}" if state else "done"


def resume_node(engine: Engine, settings: Any, node: str, who: str, reason: str) -> str:
    """Return a node Goodput drained to service (an audited action, executed now); a
    one-line result. `approvals.UnknownNode` for a node the scheduler does not know."""
    out = approvals.resume_node(engine, settings, node, who, reason)
    state, error = out.get("state"), out.get("last_error")
    return f"now {state}" + (f" ({error})" if error else "") if state else "done"


def set_paused(engine: Engine, paused: bool, who: str, reason: str) -> None:
    action_config.set_paused(engine, paused, who, reason)


def paused(engine: Engine) -> bool | None:
    return action_config.is_paused(engine)


def incident_events(engine: Engine, incident_id: int) -> list[dict[str, Any]]:
    """Every audit event of the incident (planned, approved, executed, ...), oldest first."""
    out: list[dict[str, Any]] = []
    cursor: int | None = 0
    while cursor is not None and len(out) < 5000:
        batch, cursor = audit.query(engine, incident_id=str(incident_id), cursor=cursor, limit=1000)
        out += batch
    return out


def drains_last_hour(engine: Engine, now: float | None = None) -> int:
    """Nodes counted against `max_drains_per_hour` now (drains executed or still open)."""
    now = time.time() if now is None else now
    used = 0
    for a in outbox.list_actions(engine, limit=1000):
        if a.get("state") not in outbox.DRAIN_STATES or not a.get("created_at"):
            continue
        if now - 3600.0 < float(a["created_at"]) <= now:
            action = (a.get("body") or {}).get("action") or {}
            if action.get("kind") in DRAINS or action.get("nodes"):
                used += len(action.get("nodes") or [])
    return used

"""The console's view of recovery actions: pending approvals, decisions, budgets.

Reads come from the audit log (`recovery.audit`, append-only and hash-chained), which every
action writes before and after it happens. Approve and reject go through `recovery.actions`
(the only code that may execute an action); when that module is absent the console says so
and offers no buttons.
"""

from __future__ import annotations

import importlib
import inspect
import time
from typing import Any

from sqlalchemy import Engine

from recovery import audit
from recovery.policy import DRAINS, Policy, PolicyError, load_policy

CLOSING = (
    "approved",
    "rejected",
    "expired",
    "executing",
    "executed",
    "failed",
    "skipped",
    "reconciled",
)


def actions_module() -> Any:
    try:
        return importlib.import_module("recovery.actions")
    except ImportError:
        return None


def policy_in_force(app_state: Any) -> tuple[Policy | None, str]:
    """The policy the receiver uses (its own copy if it holds one) and where it came from."""
    held = getattr(app_state, "policy", None)
    if isinstance(held, Policy):
        return held, "held by the receiver"
    try:
        return load_policy(), "loaded from GOODPUT_POLICY_FILE or the packaged default"
    except PolicyError as exc:
        return None, str(exc)


def _events(engine: Engine, **filters: Any) -> list[dict[str, Any]]:
    audit.ensure(engine)
    out: list[dict[str, Any]] = []
    cursor: int | None = 0
    while cursor is not None and len(out) < 20000:
        batch, cursor = audit.query(engine, cursor=cursor, limit=1000, **filters)
        out += batch
    return out


def _action_of(payload: Any) -> dict[str, Any]:
    if not isinstance(payload, dict):
        return {}
    inner = payload.get("action")
    return inner if isinstance(inner, dict) else payload


def pending(engine: Engine, now: float | None = None) -> list[dict[str, Any]]:
    """Actions waiting for a person, oldest first, with their expiry."""
    now = time.time() if now is None else now
    mod = actions_module()
    lister = getattr(mod, "pending_approvals", None)
    if callable(lister):
        return [dict(a) for a in lister(engine)]
    waiting: dict[str, dict[str, Any]] = {}
    for ev in _events(engine):
        aid = ev.get("action_id")
        if not aid:
            continue
        if ev["type"] == "pending_approval":
            payload = ev["payload"] if isinstance(ev["payload"], dict) else {}
            action = _action_of(payload)
            expires = payload.get("expires_at")
            waiting[aid] = {
                "action_id": aid,
                "incident_id": ev.get("incident_id"),
                "job_id": ev.get("job_id"),
                "kind": action.get("kind", "?"),
                "nodes": action.get("nodes") or [],
                "exclude": action.get("exclude") or [],
                "mode": action.get("mode"),
                "reasons": action.get("reasons") or [],
                "requested_at": ev["ts"],
                "expires_at": expires if isinstance(expires, int | float) else None,
                "expired": isinstance(expires, int | float) and expires <= now,
            }
        elif ev["type"] in CLOSING:
            waiting.pop(aid, None)
    return sorted(waiting.values(), key=lambda a: a["requested_at"])


def decide(
    engine: Any, settings: Any, action_id: str, verdict: str, actor: str, reason: str
) -> str:
    """Approve or reject through `recovery.actions`; returns its message. Raises on refusal."""
    mod = actions_module()
    fn = getattr(mod, verdict, None) if mod is not None else None
    if not callable(fn):
        raise LookupError("recovery actions are not installed in this receiver")
    offered = {
        "engine": engine,
        "settings": settings,
        "action_id": action_id,
        "actor": actor,
        "reason": reason,
        "by": actor,
        "comment": reason,
    }
    params = inspect.signature(fn).parameters
    kwargs = {k: v for k, v in offered.items() if k in params}
    result = fn(**kwargs)
    return str(result) if result is not None else f"{verdict}d"


def can_decide() -> bool:
    mod = actions_module()
    return (
        mod is not None
        and callable(getattr(mod, "approve", None))
        and callable(getattr(mod, "reject", None))
    )


def incident_actions(engine: Engine, incident_id: int) -> list[dict[str, Any]]:
    """Every audit event of the incident (planned, approved, executed, ...), oldest first."""
    return _events(engine, incident_id=str(incident_id))


def drains_last_hour(engine: Engine, now: float | None = None) -> int:
    """Nodes Goodput drained in the last hour, counted from `executed` audit events."""
    now = time.time() if now is None else now
    count = 0
    for ev in _events(engine, type_="executed", since=now - 3600.0):
        action = _action_of(ev["payload"])
        if action.get("kind") in DRAINS:
            nodes = action.get("nodes") or action.get("drained") or []
            count += len(nodes) if isinstance(nodes, list) else 1
    return count


def paused(engine: Engine) -> bool | None:
    """The global pause switch: from `recovery.actions.is_paused` or the last pause event."""
    mod = actions_module()
    fn = getattr(mod, "is_paused", None)
    if callable(fn):
        try:
            return bool(fn(engine))
        except Exception:  # noqa: BLE001 - the console only reports it
            return None
    last = sorted(
        _events(engine, type_="paused") + _events(engine, type_="resumed"), key=lambda e: e["seq"]
    )
    return bool(last) and last[-1]["type"] == "paused"

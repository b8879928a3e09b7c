"""HTTP API for recovery actions, the audit log, the pause switch and the policy.

`router` is included by the receiver app behind its auth; it reads `app.state.engine` and
`app.state.settings`.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from recovery import action_config, approvals, audit, outbox, validate
from recovery.policy import PolicyError
from recovery.scheduler.base import JOB_RE, NODE_RE

router = APIRouter(prefix="/api/v1", tags=["actions"])


class Verdict(BaseModel):
    """Who decides (a name the audit trail can show as is) and why."""

    model_config = ConfigDict(extra="forbid", strict=True)
    who: validate.Person
    comment: validate.Note = Field(default="", max_length=1000)


def _ctx(request: Request) -> tuple[Any, Any]:
    return request.app.state.engine, request.app.state.settings


def _job(job_id: str | None) -> str | None:
    if job_id is not None and not JOB_RE.match(job_id):
        raise HTTPException(422, f"invalid job_id {job_id!r}")
    return job_id


@router.get("/actions")
def list_actions(
    request: Request,
    state: str | None = Query(None, max_length=24),
    job_id: str | None = Query(None, max_length=32),
    limit: int = Query(100, ge=1, le=1000),
) -> dict[str, Any]:
    """Actions, newest first (expired approvals are marked first)."""
    engine, _ = _ctx(request)
    try:
        state = None if state is None else outbox.known_state(state)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    return {
        "actions": outbox.list_actions(engine, state=state, job_id=_job(job_id), limit=limit),
        "paused": action_config.is_paused(engine),
    }


@router.get("/actions/{action_id}")
def get_action(request: Request, action_id: str) -> dict[str, Any]:
    found = outbox.get_action(_ctx(request)[0], action_id)
    if found is None:
        raise HTTPException(404, f"no action {action_id}")
    return found


@router.post("/actions/{action_id}/approve")
def approve(request: Request, action_id: str, body: Verdict) -> dict[str, Any]:
    """Approve a pending action (recording who) and execute it now."""
    engine, settings = _ctx(request)
    try:
        return approvals.approve(engine, settings, action_id, body.who, body.comment)
    except approvals.UnknownAction as exc:
        raise HTTPException(404, str(exc)) from None
    except approvals.ActionError as exc:  # decided already, expired, or over the budget
        raise HTTPException(409, str(exc)) from None


@router.post("/actions/{action_id}/reject")
def reject(request: Request, action_id: str, body: Verdict) -> dict[str, Any]:
    engine, _ = _ctx(request)
    try:
        return approvals.reject(engine, action_id, body.who, body.comment)
    except approvals.UnknownAction as exc:
        raise HTTPException(404, str(exc)) from None
    except approvals.ActionError as exc:  # decided already, expired, or over the budget
        raise HTTPException(409, str(exc)) from None


@router.post("/actions/pause")
def pause(request: Request, body: Verdict) -> dict[str, Any]:
    """The global pause switch: no action executes until resumed."""
    action_config.set_paused(_ctx(request)[0], True, body.who, body.comment)
    return {"paused": True}


@router.post("/actions/resume")
def resume(request: Request, body: Verdict) -> dict[str, Any]:
    action_config.set_paused(_ctx(request)[0], False, body.who, body.comment)
    return {"paused": False}


@router.post("/nodes/{node}/resume")
def resume_node(request: Request, node: str, body: Verdict) -> dict[str, Any]:
    """Return a node Goodput drained to service (audited with the comment; 409 for a node not
    drained or one a person drained; 404 for a node the scheduler does not know)."""
    if not NODE_RE.match(node):
        raise HTTPException(422, f"invalid node {node!r}")
    engine, settings = _ctx(request)
    try:
        return approvals.resume_node(engine, settings, node, body.who, body.comment)
    except approvals.UnknownNode as exc:
        raise HTTPException(404, str(exc)) from None
    except approvals.ActionError as exc:  # not drained, or a person's drain
        raise HTTPException(409, str(exc)) from None


@router.get("/audit")
def audit_query(
    request: Request,
    job_id: str | None = Query(None, max_length=32),
    incident_id: str | None = Query(None, max_length=64),
    type: str | None = Query(None, max_length=40),  # noqa: A002 - API name
    since: float | None = Query(None, allow_inf_nan=False),
    until: float | None = Query(None, allow_inf_nan=False),
    cursor: int = Query(0, ge=0, le=validate.DB_INT_MAX),
    limit: int = Query(100, ge=1, le=1000),
) -> dict[str, Any]:
    """Audit events, oldest first, filtered; pass `next_cursor` back as `cursor`."""
    engine, _ = _ctx(request)
    if type is not None and type not in audit.TYPES:
        raise HTTPException(422, f"unknown event type {type!r}: one of {', '.join(audit.TYPES)}")
    if incident_id is not None and validate.db_int(incident_id) is None:
        raise HTTPException(422, f"incident_id must be a number, not {incident_id[:40]!r}")
    events, nxt = audit.query(
        engine,
        job_id=_job(job_id),
        incident_id=incident_id,
        type_=type,
        since=since,
        until=until,
        cursor=cursor,
        limit=limit,
    )
    return {"events": events, "next_cursor": nxt}


@router.get("/audit/verify")
def audit_verify(request: Request) -> dict[str, Any]:
    engine, _ = _ctx(request)
    v = audit.verify(engine)
    return {"ok": v.ok, "rows": v.rows, "first_bad_seq": v.first_bad_seq, "problem": v.problem}


@router.get("/policy")
def policy_view(request: Request) -> dict[str, Any]:
    """The operator policy in force (after `GOODPUT_MODE`) and the pause switch."""
    engine, settings = _ctx(request)
    try:
        cfg = action_config.config(settings)
    except PolicyError as exc:
        raise HTTPException(500, str(exc)) from None
    mode: Literal["monitor", "approve", "act"] = cfg.policy.mode
    return {
        "policy": cfg.policy.model_dump(mode="json"),
        "mode": mode,
        "paused": action_config.is_paused(engine),
    }

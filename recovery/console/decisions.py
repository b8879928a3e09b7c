"""What a person decides in the console: approve or reject planned actions, the pause switch,
return a node Goodput drained to service."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from recovery import approvals, validate
from recovery.console import actions_port
from recovery.console.page import (
    can_read,
    engine_of,
    error_page,
    login_redirect,
    mutation,
    render,
    secure,
    settings_of,
)

router = APIRouter(prefix="/console", include_in_schema=False)


async def _decision(request: Request, what: str) -> tuple[Any, dict[str, str], str] | Response:
    """A person's decision: who (logged in, CSRF and Origin checked), their form, and its
    one-line reason (`validate.reason`); the error page otherwise."""
    checked = await mutation(request, what)
    if isinstance(checked, Response):
        return checked
    who, form = checked
    try:
        return who, form, validate.reason(form.get("reason", ""))
    except ValueError as exc:
        return await error_page(request, 400, str(exc))


@router.get("/approvals")
def approvals_page(request: Request) -> Response:
    if not can_read(request):
        return login_redirect(request)
    pol, source = actions_port.policy_in_force(settings_of(request))
    engine = engine_of(request)
    return render(
        request,
        "approvals.html",
        pending=actions_port.pending(engine),
        policy=pol,
        policy_source=source,
        now=time.time(),
        can_decide=actions_port.available(),
        paused=actions_port.paused(engine),
        notice=request.query_params.get("done", "")[:200],
    )


@router.post("/actions/{action_id}/{verdict}")
async def decide_action(request: Request, action_id: str, verdict: str) -> Response:
    settings = settings_of(request)
    if verdict not in ("approve", "reject"):
        return await error_page(request, 404, "unknown verdict")
    if (
        not action_id
        or len(action_id) > 64
        or not all(c.isalnum() or c in "-_:." for c in action_id)
    ):
        return await error_page(request, 404, "no such action")
    checked = await _decision(request, "decide actions")
    if isinstance(checked, Response):
        return checked
    who, form, reason = checked
    if verdict == "reject" and not reason:
        return await error_page(request, 400, "a rejection needs a reason")
    try:
        message = await run_in_threadpool(
            actions_port.decide, engine_of(request), settings, action_id, verdict, who.actor, reason
        )
    except approvals.UnknownAction:
        return await error_page(request, 404, "no such action")
    except (LookupError, ValueError) as exc:
        return await error_page(request, 409, f"{verdict} refused: {exc}"[:500])
    except Exception as exc:  # noqa: BLE001 - shown to the person, who can retry
        return await error_page(
            request, 409, f"{verdict} failed: {type(exc).__name__}: {exc}"[:500]
        )
    done = f"{verdict}d {action_id}: {message}"
    return secure(RedirectResponse("/console/approvals?" + urlencode({"done": done}), 303))


@router.post("/pause")
async def pause_switch(request: Request) -> Response:
    """Flip the global pause switch (audited by `recovery.actions`)."""
    checked = await _decision(request, "pause actions")
    if isinstance(checked, Response):
        return checked
    who, form, reason = checked
    if form.get("paused") not in ("on", "off") or not reason:
        return await error_page(request, 400, "say on or off, and give a reason")
    try:
        await run_in_threadpool(
            actions_port.set_paused, engine_of(request), form["paused"] == "on", who.actor, reason
        )
    except LookupError as exc:
        return await error_page(request, 409, str(exc))
    return secure(RedirectResponse("/console/policy", 303))


@router.post("/nodes/{node}/resume")
async def resume_node(request: Request, node: str) -> Response:
    """Return a node Goodput drained (its repair done) to service: audited with who and why."""
    settings = settings_of(request)
    if not validate.NODE.fullmatch(node):
        return await error_page(request, 404, "no such node")
    checked = await _decision(request, "return nodes to service")
    if isinstance(checked, Response):
        return checked
    who, form, reason = checked
    if not reason:
        return await error_page(request, 400, "say why the node may return (what was repaired)")
    try:
        message = await run_in_threadpool(
            actions_port.resume_node, engine_of(request), settings, node, who.actor, reason
        )
    except approvals.UnknownNode as exc:
        return await error_page(request, 404, str(exc))
    except approvals.ActionError as exc:  # not drained, or a person's drain: nothing recorded
        return await error_page(request, 409, str(exc))
    except Exception as exc:  # noqa: BLE001 - shown to the person, who can retry
        return await error_page(request, 409, f"resume refused: {type(exc).__name__}: {exc}"[:500])
    done = f"resume {node}: {message}"
    return secure(RedirectResponse("/console/policy?" + urlencode({"done": done}), 303))

"""The operator's read-only pages: the audit log, the policy in force with the connectors'
health, and the nodes (ETTR and each node's history)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import yaml
from fastapi import APIRouter, Request
from fastapi.responses import Response

from recovery import audit, validate
from recovery.console import actions_port, ettr, health, queries
from recovery.console.page import can_read, engine_of, login_redirect, render, settings_of
from recovery.policy import DRAINS

router = APIRouter(prefix="/console", include_in_schema=False)


@router.get("/audit")
def audit_page(request: Request) -> Response:
    if not can_read(request):
        return login_redirect(request)
    engine = engine_of(request)
    q = request.query_params
    f = {
        "job": q.get("job", "").strip(),
        "incident": q.get("incident", "").strip(),
        "type": q.get("type", "").strip(),
        "cursor": q.get("cursor", "0"),
    }
    problems = []
    if f["job"] and not validate.JOB_ID.fullmatch(f["job"]):
        problems.append("job is not a valid job id")
        f["job"] = ""
    if f["incident"] and validate.db_int(f["incident"]) is None:
        problems.append("incident must be a number")
        f["incident"] = ""
    if f["type"] and f["type"] not in audit.TYPES:
        problems.append("unknown event type")
        f["type"] = ""
    cursor = validate.db_int(f["cursor"]) or 0
    events, nxt = audit.query(
        engine,
        job_id=f["job"] or None,
        incident_id=f["incident"] or None,
        type_=f["type"] or None,
        cursor=cursor,
        limit=100,
    )
    base = {k: v for k, v in f.items() if v and k != "cursor"}
    return render(
        request,
        "audit.html",
        events=events,
        f=f,
        problems=problems,
        types=audit.TYPES,
        verification=audit.verify(engine),
        next_link="?" + urlencode({**base, "cursor": nxt}) if nxt else None,
        first_link="?" + urlencode(base) if cursor else None,
    )


@router.get("/policy")
def policy_page(request: Request) -> Response:
    if not can_read(request):
        return login_redirect(request)
    settings, engine = settings_of(request), engine_of(request)
    pol, source = actions_port.policy_in_force(settings_of(request))
    sched = actions_port.probe_scheduler(settings)
    probes, nodes = health.probe(settings, sched)
    partitions: dict[str, list[Any]] = {}
    for n in nodes:
        for p in n.partitions or ("(none)",):
            partitions.setdefault(p.rstrip("*"), []).append(n)
    drains = actions_port.drains_last_hour(engine)
    return render(
        request,
        "policy.html",
        policy=pol,
        policy_source=source,
        probes=probes,
        last_reports=queries.connector_history(engine),
        partitions=partitions,
        drains=drains,
        paused=actions_port.paused(engine),
        drain_kinds=DRAINS,
        notice=request.query_params.get("done", "")[:200],
        policy_yaml=yaml.safe_dump(pol.model_dump(mode="json"), sort_keys=False) if pol else "",
    )


@router.get("/nodes")
def nodes_page(request: Request) -> Response:
    """ETTR (cluster and the jobs that lost the most) and each node's history."""
    if not can_read(request):
        return login_redirect(request)
    settings, engine = settings_of(request), engine_of(request)
    pol, source = actions_port.policy_in_force(settings)
    rows, note = [], ""
    if pol is None:
        note = f"The policy could not be loaded: {source}"
    else:
        from recovery import node_history

        try:
            rows = node_history.summary(engine, pol)
        except Exception as exc:  # noqa: BLE001 - the page says so instead of a 500
            note = f"node history unavailable ({type(exc).__name__})"
    return render(
        request,
        "nodes.html",
        ettr=ettr.read(settings.prometheus_url),
        nodes=rows,
        history_note=note,
    )

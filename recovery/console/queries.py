"""Read-only queries for the console over the receiver's tables (`recovery.store`).

Everything returned is plain dicts, shaped for the templates; stored JSON that does not parse
becomes None rather than an error, so odd data never breaks a page.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Engine, and_, case, func, or_, select

from recovery import incidents as incidents_mod
from recovery.store import alerts, diagnoses, incident_alerts, incidents, loads

PER_PAGE = 50


def _like_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def incident_page(
    engine: Engine,
    *,
    state: str | None = None,
    outcome: str | None = None,
    node: str | None = None,
    job: str | None = None,
    page: int = 1,
    per: int = PER_PAGE,
) -> dict[str, Any]:
    """A page of incidents, open first then newest, with their latest diagnosis summary."""
    where: list[Any] = []
    if state:
        where.append(incidents.c.state == state)
    if outcome == "pending":
        where.append(incidents.c.outcome.is_(None))
    elif outcome:
        where.append(incidents.c.outcome == outcome)
    if job:
        where.append(incidents.c.job_id == job)
    if node:
        by_alert = (
            select(incident_alerts.c.incident_id)
            .select_from(incident_alerts.join(alerts))
            .where(alerts.c.node == node)
        )
        by_diag = select(diagnoses.c.incident_id).where(
            diagnoses.c.body.like(f'%"{_like_escape(node)}"%', escape="\\")
        )
        where.append(
            or_(incidents.c.node == node, incidents.c.id.in_(by_alert), incidents.c.id.in_(by_diag))
        )
    open_first = case((incidents.c.state == "open", 0), else_=1)
    with engine.connect() as conn:
        total = int(
            conn.execute(select(func.count()).select_from(incidents).where(*where)).scalar() or 0
        )
        pages = max(1, -(-total // per))
        page = min(max(1, page), pages)
        rows = conn.execute(
            select(incidents)
            .where(*where)
            .order_by(open_first, incidents.c.id.desc())
            .limit(per)
            .offset((page - 1) * per)
        ).all()
        ids = [r.id for r in rows]
        latest: dict[int, Any] = {}
        if ids:
            newest = (
                select(func.max(diagnoses.c.id))
                .where(diagnoses.c.incident_id.in_(ids))
                .group_by(diagnoses.c.incident_id)
            )
            for d in conn.execute(
                select(diagnoses.c.incident_id, diagnoses.c.body).where(diagnoses.c.id.in_(newest))
            ):
                latest[d.incident_id] = loads(d.body)
        alert_nodes: dict[int, set[str]] = {i: set() for i in ids}
        alert_counts: dict[int, list[int]] = {i: [0, 0] for i in ids}
        if ids:
            for a in conn.execute(
                select(incident_alerts.c.incident_id, alerts.c.node, alerts.c.status)
                .select_from(incident_alerts.join(alerts))
                .where(incident_alerts.c.incident_id.in_(ids))
            ):
                if a.node:
                    alert_nodes[a.incident_id].add(a.node)
                alert_counts[a.incident_id][0] += 1
                alert_counts[a.incident_id][1] += int(a.status == "firing")
    now = time.time()
    items = []
    for r in rows:
        diag = latest.get(r.id) if isinstance(latest.get(r.id), dict) else None
        culprits = _str_list(diag.get("affected_nodes")) if diag else []
        items.append(
            {
                "id": r.id,
                "job_id": r.job_id,
                "job_name": (diag or {}).get("job_name"),
                "node": r.node,
                "state": r.state,
                "outcome": r.outcome,
                "diagnosis_state": r.diagnosis_state,
                "culprits": culprits,
                "alert_nodes": sorted(alert_nodes.get(r.id, ())),
                "confidence": _confidence(diag),
                "root_cause": str((diag or {}).get("root_cause") or ""),
                "age_s": max(0.0, now - (r.first_alert_ts or r.opened_at)),
                "alerts": alert_counts.get(r.id, [0, 0]),
            }
        )
    return {"items": items, "total": total, "page": page, "pages": pages, "per": per}


def _str_list(value: Any) -> list[str]:
    if not isinstance(value, list):
        return []
    return [str(v) for v in value if isinstance(v, str | int)]


def _confidence(diag: dict[str, Any] | None) -> float | None:
    if not diag:
        return None
    try:
        c = float(diag.get("confidence"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return min(1.0, max(0.0, c))


def incident_detail(engine: Engine, incident_id: int) -> dict[str, Any] | None:
    """The incident with its alerts and latest diagnosis (the receiver's own query)."""
    found = incidents_mod.incident(engine, incident_id)
    if found is None:
        return None
    diag = incidents_mod.latest_diagnosis(engine, incident_id)  # unreadable → no diagnosis
    found["diagnosis"] = diag if isinstance(diag, dict) else None
    with engine.connect() as conn:
        found["diagnosis_count"] = int(
            conn.execute(
                select(func.count())
                .select_from(diagnoses)
                .where(diagnoses.c.incident_id == incident_id)
            ).scalar()
            or 0
        )
    return found


def outcome_counts(engine: Engine) -> dict[str, int]:
    """Open incidents per outcome (for the list page's header)."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(incidents.c.outcome, func.count())
            .where(and_(incidents.c.state == "open"))
            .group_by(incidents.c.outcome)
        ).all()
    return {(o or "pending"): int(n) for o, n in rows}


def connector_history(engine: Engine, limit: int = 20) -> dict[str, dict[str, Any]]:
    """The most recent connector report per evidence source, from the last diagnoses."""
    with engine.connect() as conn:
        bodies = conn.execute(
            select(diagnoses.c.body, diagnoses.c.created_at)
            .order_by(diagnoses.c.id.desc())
            .limit(limit)
        ).all()
    out: dict[str, dict[str, Any]] = {}
    for body, created in bodies:
        doc = loads(body)
        reports = doc.get("connector_reports") if isinstance(doc, dict) else None
        for rep in reports if isinstance(reports, list) else []:
            if isinstance(rep, dict) and isinstance(rep.get("connector"), str):
                out.setdefault(rep["connector"], {**rep, "at": created})
    return out

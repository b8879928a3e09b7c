"""The incident queries behind the API and the console: one incident with its alerts and an
alert summary, its latest diagnosis, the detail view (both together), and a page of incidents,
newest first. Read-only."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Engine, func, select

from recovery.store import alerts, diagnoses, incident_alerts, incidents, loads


def _alert_dict(row: Any) -> dict[str, Any]:
    return {
        "id": row.id,
        "fingerprint": row.fingerprint,
        "alertname": row.alertname,
        "status": row.status,
        "severity": row.severity,
        "job_id": row.job_id,
        "node": row.node,
        "gpu": row.gpu,
        "starts_at": row.starts_ts,
        "ends_at": row.ends_ts,
        "labels": loads(row.labels),
        "annotations": loads(row.annotations),
    }


def _incident_dict(row: Any, summary: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row.id,
        "job_id": row.job_id,
        "node": row.node,
        "state": row.state,
        "opened_at": row.opened_at,
        "updated_at": row.updated_at,
        "resolved_at": row.resolved_at,
        "first_alert_at": row.first_alert_ts,
        "outcome": row.outcome,
        "diagnosis_state": row.diagnosis_state,
        "alert_summary": summary,
    }


def _summaries(conn: Connection, ids: list[int]) -> dict[int, dict[str, Any]]:
    """Each incident's alert summary (total, firing, count by name, nodes), counted by the
    database: a page of incidents of a thousand-node job loads no alert rows."""
    out: dict[int, dict[str, Any]] = {
        i: {"total": 0, "firing": 0, "by_name": {}, "nodes": []} for i in ids
    }
    if not ids:
        return out
    link = alerts.join(incident_alerts)
    mine = incident_alerts.c.incident_id.in_(ids)
    for incident_id, name, status, n in conn.execute(
        select(incident_alerts.c.incident_id, alerts.c.alertname, alerts.c.status, func.count())
        .select_from(link)
        .where(mine)
        .group_by(incident_alerts.c.incident_id, alerts.c.alertname, alerts.c.status)
    ):
        summary = out[incident_id]
        summary["total"] += n
        summary["firing"] += n if status == "firing" else 0
        summary["by_name"][name] = summary["by_name"].get(name, 0) + n
    for incident_id, node in conn.execute(
        select(incident_alerts.c.incident_id, alerts.c.node)
        .select_from(link)
        .where(mine, alerts.c.node.is_not(None), alerts.c.node != "")
        .group_by(incident_alerts.c.incident_id, alerts.c.node)
    ):
        out[incident_id]["nodes"].append(node)
    for summary in out.values():
        summary["nodes"].sort()
    return out


def _alerts_of(conn: Connection, incident_id: int) -> list[Any]:
    return list(
        conn.execute(
            select(alerts)
            .select_from(alerts.join(incident_alerts))
            .where(incident_alerts.c.incident_id == incident_id)
            .order_by(alerts.c.starts_ts, alerts.c.id)
        ).all()
    )


def incident(engine: Engine, incident_id: int) -> dict[str, Any] | None:
    """The incident dict (with its alerts), or None."""
    with engine.connect() as conn:
        row = conn.execute(select(incidents).where(incidents.c.id == incident_id)).first()
        if row is None:
            return None
        found = _incident_dict(row, _summaries(conn, [incident_id])[incident_id])
        found["alerts"] = [_alert_dict(a) for a in _alerts_of(conn, incident_id)]
        return found


def latest_diagnosis(engine: Engine, incident_id: int) -> dict[str, Any] | None:
    with engine.connect() as conn:
        body = conn.execute(
            select(diagnoses.c.body)
            .where(diagnoses.c.incident_id == incident_id)
            .order_by(diagnoses.c.id.desc())
            .limit(1)
        ).scalar()
    return loads(body)


def get_incident(engine: Engine, incident_id: int) -> dict[str, Any] | None:
    """Detail view: the incident, its alerts, and its latest diagnosis."""
    found = incident(engine, incident_id)
    if found is not None:
        found["diagnosis"] = latest_diagnosis(engine, incident_id)
    return found


def list_incidents(
    engine: Engine,
    state: str | None = None,
    job_id: str | None = None,
    limit: int = 50,
    offset: int = 0,
) -> dict[str, Any]:
    """A page of incidents, newest first: `{"items", "total", "limit", "offset"}`."""
    where = []
    if state:
        where.append(incidents.c.state == state)
    if job_id:
        where.append(incidents.c.job_id == job_id)
    with engine.connect() as conn:
        total = conn.execute(select(func.count()).select_from(incidents).where(*where)).scalar()
        rows = conn.execute(
            select(incidents)
            .where(*where)
            .order_by(incidents.c.id.desc())
            .limit(limit)
            .offset(offset)
        ).all()
        summaries = _summaries(conn, [r.id for r in rows])
        items = [_incident_dict(r, summaries[r.id]) for r in rows]
    return {"items": items, "total": int(total or 0), "limit": limit, "offset": offset}

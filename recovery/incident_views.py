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


def _incident_dict(row: Any, alert_rows: list[Any]) -> dict[str, Any]:
    names: dict[str, int] = {}
    for a in alert_rows:
        names[a.alertname] = names.get(a.alertname, 0) + 1
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
        "alerts": [_alert_dict(a) for a in alert_rows],
        "alert_summary": {
            "total": len(alert_rows),
            "firing": sum(1 for a in alert_rows if a.status == "firing"),
            "by_name": names,
            "nodes": sorted({a.node for a in alert_rows if a.node}),
        },
    }


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
        return _incident_dict(row, _alerts_of(conn, incident_id))


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
        items = []
        for r in rows:
            d = _incident_dict(r, _alerts_of(conn, r.id))
            d.pop("alerts")
            items.append(d)
    return {"items": items, "total": int(total or 0), "limit": limit, "offset": offset}

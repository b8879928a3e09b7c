"""Telling on-call: a notice posted to Alertmanager's API (an action waits for approval, needs
a person, failed, stopped a job; the receiver stopped acting), best effort, audited."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import requests
from sqlalchemy import Engine

from recovery import audit, outbox
from recovery.action_config import Config
from recovery.decide import Action


def notify(
    engine: Engine,
    cfg: Config,
    alertname: str,
    row: Any,
    action: Action | None,
    text: str,
    severity: str,
    until: float | None,
) -> None:
    """Tell on-call through Alertmanager's API (best effort, audited)."""
    if row is None:
        return
    r = row if isinstance(row, dict) else dict(row._mapping)
    if not cfg.alertmanager_url:
        return
    alert = {
        "labels": {
            "alertname": alertname,
            "severity": severity,
            "job_id": r["job_id"] or "",
            "action_id": r["id"],
            "action": r["kind"],
            "goodput_notification": "true",
        },
        "annotations": {
            "summary": text[:500],
            "description": text[:2000],
            "runbook_url": f"alertmanager/runbooks.md#{alertname.lower()}",
        },
        "startsAt": datetime.fromtimestamp(outbox.now(engine), UTC).isoformat(),
    }
    if until:
        alert["endsAt"] = datetime.fromtimestamp(until, UTC).isoformat()
    try:
        resp = requests.post(
            f"{cfg.alertmanager_url.rstrip('/')}/api/v2/alerts", json=[alert], timeout=5
        )
        ok, detail = resp.status_code < 300, f"HTTP {resp.status_code}"
    except requests.RequestException as exc:
        ok, detail = False, type(exc).__name__
    audit.record(
        engine,
        "notified",
        {"alertname": alertname, "ok": ok, "detail": detail},
        **outbox.refs(r),
    )

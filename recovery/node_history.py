"""Each node's history, read from what the receiver already stores: the final diagnoses that
blamed it (with GPU and XID), and its health checks. Summaries per node — incidents in the last
week, MTBI, the last check, the repeat-offender rules it breaks — for the console, the CLI and
`/metrics` (one series per node, never per GPU).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import Engine, func, select

from recovery import clock, node_checks, node_health, store
from recovery.diagnosis import CATEGORY
from recovery.policy import Policy

WEEK_S = 7 * 86400.0
# A verdict at least this sure says who is to blame; below it the job's failure counts on each
# node it ran on towards the several-users rule (each diagnosis unsure, together telling).
SURE = 0.7
# "XID 79", "xid_79", and the kernel's "NVRM: Xid (PCI:0000:9b:00): 79, pid=…"
XID = re.compile(r"\bxid(?:\s*\([^)]*\))?[\s_:]*(\d{1,3})\b", re.IGNORECASE)


def _xid(diag: dict[str, Any], node: str) -> int | None:
    for s in diag.get("symptoms") or []:
        if s.get("node") in (None, node):
            m = XID.search(f"{s.get('id', '')} {s.get('detail', '')}")
            if m:
                return int(m.group(1))
    return None


def events(engine: Engine, since: float, node: str | None = None) -> dict[str, list[Any]]:
    """node -> its history events since `since`: one `incident` per final diagnosis that named
    it (infrastructure or unknown outcomes: a workload's own bug is not the node's), one
    `job_failed` (with the job's user) per other node the job ran on when the diagnosis was
    unsure, and the outcome of every health check."""
    latest = (
        select(func.max(store.diagnoses.c.id))
        .where(store.diagnoses.c.created_at >= since)
        .group_by(store.diagnoses.c.incident_id)
    )
    with engine.connect() as conn:
        rows = conn.execute(
            select(store.diagnoses.c.created_at, store.diagnoses.c.body).where(
                store.diagnoses.c.id.in_(latest)
            )
        ).all()
    out: dict[str, list[Any]] = {}
    for created, body in rows:
        diag = store.loads(body) or {}
        outcome = diag.get("outcome", "healthy")
        if outcome == "healthy":
            continue
        at = float(diag.get("onset") or created)
        user = diag.get("job_user") or None
        blamed = (
            []
            if CATEGORY.get(outcome, "unknown") == "workload"
            else diag.get("affected_nodes") or []
        )
        gpus = {g.get("node"): g.get("gpu") for g in diag.get("affected_gpus") or []}
        for n in blamed:
            if node is None or n == node:
                ev = node_health.NodeEvent(at, n, "incident", gpus.get(n), _xid(diag, n), user)
                out.setdefault(n, []).append(ev)
        if user and float(diag.get("confidence") or 0.0) < SURE:  # a sure verdict says who
            for n in diag.get("job_nodes") or []:
                if n not in blamed and (node is None or n == node):
                    ev = node_health.NodeEvent(at, n, "job_failed", user=user)
                    out.setdefault(n, []).append(ev)
    for r in node_checks.rows(engine, node, limit=1000):
        if r["started_at"] >= since and r["state"] in node_checks.FINISHED:
            kind = "check_passed" if r["exit_code"] == 0 else "check_failed"
            out.setdefault(r["node"], []).append(
                node_health.NodeEvent(r["started_at"], r["node"], kind)  # type: ignore[arg-type]
            )
    for evs in out.values():
        evs.sort(key=lambda e: e.at)
    return out


def lookback_s(policy: Policy) -> float:
    """How far back a node's history is read: a week, or the longest repeat-offender window."""
    return max([WEEK_S, *(r.window_s for r in policy.return_to_service.repeat_offenders)])


def summary(engine: Engine, policy: Policy, now: float | None = None) -> list[dict[str, Any]]:
    """One row per node with history in the last week (or a rule's window), most incidents
    first; the counts and MTBI are over the last week."""
    now = clock.now(engine) if now is None else now
    rules = policy.return_to_service.repeat_offenders
    rows = []
    latest = node_checks.latest_states(engine)
    for node, evs in events(engine, now - lookback_s(policy)).items():
        incidents = [e for e in evs if e.kind == "incident" and e.at >= now - WEEK_S]
        checked = any(e.kind.startswith("check_") for e in evs)
        rows.append(
            {
                "node": node,
                "incidents_7d": len(incidents),
                "mtbi_s": node_health.mtbi_s(incidents),
                "last_check": latest.get(node) if checked else None,
                "escalations": [
                    {"rule": r.name, "then": r.then, "why": why}
                    for r, why in node_health.escalations(evs, rules, now)
                ],
            }
        )
    return sorted(rows, key=lambda r: (-r["incidents_7d"], r["node"]))


class NodeHistoryCollector(Collector):
    """`goodput_node_incidents_7d{node}`, `goodput_node_mtbi_seconds{node}` and
    `goodput_node_escalation{node,rule,then}` (1 while a repeat-offender rule holds)."""

    def __init__(self, engine: Engine, policy: Any) -> None:
        self.engine, self.policy = engine, policy  # policy: a Policy or a callable giving one

    def collect(self) -> Iterator[Any]:
        incidents = GaugeMetricFamily(
            "goodput_node_incidents_7d",
            "Incidents that blamed the node, last 7 days.",
            labels=["node"],
        )
        mtbi = GaugeMetricFamily(
            "goodput_node_mtbi_seconds",
            "Mean time between the node's incidents (7 d).",
            labels=["node"],
        )
        esc = GaugeMetricFamily(
            "goodput_node_escalation",
            "1 while a repeat-offender rule holds for the node.",
            labels=["node", "rule", "then"],
        )
        try:
            policy = self.policy() if callable(self.policy) else self.policy
            rows = summary(self.engine, policy)
        except Exception:  # noqa: BLE001 - a scrape must not fail because the DB is busy
            rows = []
        for r in rows:
            incidents.add_metric([r["node"]], float(r["incidents_7d"]))
            if r["mtbi_s"] is not None:
                mtbi.add_metric([r["node"]], float(r["mtbi_s"]))
            for e in r["escalations"]:
                esc.add_metric([r["node"], e["rule"], e["then"]], 1.0)
        yield from (incidents, mtbi, esc)

"""Incidents: alerts grouped per job, opened, updated and resolved; the list/detail queries.

Rules:
- an alert is identified by (fingerprint, startsAt); a redelivery with the same status changes
  nothing; a status change (firing → resolved) updates the stored alert only;
- an alert with `job_id` joins the job's open incident (one is opened if none);
- an alert with only `node` joins the open incidents of the jobs on that node (asked from
  Slurm before the ingest lock is taken, plus open incidents that already name the node);
  with none, a node incident;
- each new alert in an incident schedules a diagnosis after `settings.settle_s`;
- receivers sharing a PostgreSQL store ingest one at a time (an advisory lock: no two open
  incidents for one job) and claim a due diagnosis with a lease (`claim_diagnoses`), so each
  is made by one receiver; a new alert ends the claim (the diagnosis under way is superseded);
- an incident resolves when all its alerts are resolved.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    bindparam,
    case,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from recovery import clock, failpoints, validate
from recovery.schema import INGEST_LOCK, serialize
from recovery.settings import Settings
from recovery.store import (
    alerts,
    diagnoses,
    dumps,
    incident_alerts,
    incidents,
    loads,
    store_payload,
)

log = logging.getLogger("goodput.receiver.incidents")
NodeJobs = Callable[[str], list[str]]

_LOCK = threading.Lock()  # one writer at a time inside this process (incident creation races)


@dataclass
class IngestResult:
    new: int = 0
    changed: int = 0
    incident_ids: list[int] = field(default_factory=list)


def default_node_jobs(settings: Settings) -> NodeJobs:
    """Slurm's answer to "which jobs run on this node" (empty when Slurm is off or fails)."""
    sources = getattr(settings, "sources", None)  # a Settings, or a test's stand-in
    if sources is not None:
        return sources.jobs_on_node
    if not settings.slurm_enabled:
        return lambda _node: []

    def lookup(node: str) -> list[str]:
        from recovery.evidence import slurm

        return slurm.jobs_on_node(node, timeout=min(settings.slurm_timeout_s, 5.0))

    return lookup


@dataclass
class Payload:
    """One webhook payload, validated, with Slurm's jobs on its nodes already asked."""

    docs: list[dict[str, Any]]
    raw: str = ""
    group_key: str = ""
    status: str = "firing"
    on_node: dict[str, list[str]] = field(default_factory=dict)


def prepare(
    engine: Engine,
    settings: Settings,
    alert_docs: Iterable[dict[str, Any]],
    raw: str = "",
    group_key: str = "",
    status: str = "firing",
    node_jobs: NodeJobs | None = None,
) -> Payload:
    """A payload ready to fold (the Slurm lookups done, outside any lock or transaction)."""
    docs = list(alert_docs)
    on_node = _jobs_on_nodes(engine, docs, node_jobs or default_node_jobs(settings))
    return Payload(docs, raw, group_key, status, on_node)


def ingest(
    engine: Engine,
    settings: Settings,
    alert_docs: Iterable[dict[str, Any]],
    raw: str = "",
    group_key: str = "",
    status: str = "firing",
    node_jobs: NodeJobs | None = None,
    now: float | None = None,
) -> IngestResult:
    """Store a validated webhook payload and fold its alerts into incidents (one transaction)."""
    payload = prepare(engine, settings, alert_docs, raw, group_key, status, node_jobs)
    (result,) = ingest_payloads(engine, settings, [payload], now)
    failpoints.hit("ingested")
    return result


def ingest_payloads(
    engine: Engine, settings: Settings, payloads: list[Payload], now: float | None = None
) -> list[IngestResult]:
    """Store and fold several payloads in ONE transaction, in order (the receiver's group
    commit, `recovery.group_commit`): all are durable together, or none is."""
    now = clock.now(engine) if now is None else now
    with _LOCK, engine.begin() as conn:
        serialize(conn, INGEST_LOCK)  # other receivers on this PostgreSQL wait for our commit
        return [_fold(conn, settings, p, now) for p in payloads]


def _fold(conn: Connection, settings: Settings, p: Payload, now: float) -> IngestResult:
    result = IngestResult()
    touched: set[int] = set()
    ended: set[int] = set()  # incidents an alert's status change may resolve
    store_payload(conn, p.raw, group_key=p.group_key, status=p.status, now=now)
    for doc in p.docs:
        alert_id, is_new, changed = _upsert_alert(conn, doc, now)
        result.new += int(is_new)
        result.changed += int(changed)
        if doc["labels"].get("goodput_notification") == "true":
            continue  # Goodput's own notices to on-call (approvals, stops) open nothing
        if is_new and doc["status"] == "firing":
            starts = validate.timestamp(doc["startsAt"])
            for inc in _incidents_for(conn, doc, p.on_node, now):
                _link(conn, inc, alert_id, now, settings.settle_s, starts)
                touched.add(inc)
        elif is_new or changed:
            ended.update(_linked_incidents(conn, alert_id))
    touched |= ended
    for inc in ended:  # one with a new firing alert stays open: nothing to count there
        _maybe_resolve(conn, inc, now)
    result.incident_ids = sorted(touched)
    return result


def _jobs_on_nodes(
    engine: Engine, docs: list[dict[str, Any]], lookup: NodeJobs
) -> dict[str, list[str]]:
    """Slurm's jobs on each node named by a new firing alert that has no job_id, asked before
    the ingest lock and transaction are taken, so a slow or unreachable Slurm delays only this
    request. A redelivered alert asks nothing; after one failed lookup the remaining nodes
    fall back on the open incidents that already name them."""
    wanted: dict[str, set[tuple[str, str]]] = {}
    for doc in docs:
        labels = doc["labels"]
        if (
            doc["status"] == "firing"
            and labels.get("node")
            and not labels.get("job_id")
            and labels.get("goodput_notification") != "true"
        ):
            wanted.setdefault(labels["node"], set()).add((doc["fingerprint"], doc["startsAt"]))
    if not wanted:
        return {}
    fps = {fp for ids in wanted.values() for fp, _ in ids}
    with engine.connect() as conn:
        stored = {
            (r.fingerprint, r.starts_at)
            for r in conn.execute(
                select(alerts.c.fingerprint, alerts.c.starts_at).where(
                    alerts.c.fingerprint.in_(fps)
                )
            )
        }
    out: dict[str, list[str]] = {}
    for node in sorted(n for n, ids in wanted.items() if ids - stored):
        try:
            out[node] = [j for j in lookup(node) if validate.JOB_ID.fullmatch(j)]
        except Exception as exc:  # noqa: BLE001 - Slurm unreachable: fall back on what we know
            log.warning("jobs on node %s: Slurm lookup failed: %s", node, exc)
            break
    return out


# The webhook's hot statements, built once with bound parameters (building them per alert cost
# as much as running them: `bench/webhook.py`).
_ALERT_BY_IDENTITY = select(alerts.c.id, alerts.c.status, alerts.c.ends_ts).where(
    alerts.c.fingerprint == bindparam("b_fp"), alerts.c.starts_at == bindparam("b_starts")
)
_INSERT_ALERT = insert(alerts)
_OPEN_OF_JOB = (
    select(incidents.c.id)
    .where(incidents.c.state == "open", incidents.c.job_id == bindparam("b_job"))
    .order_by(incidents.c.id.desc())
    .limit(1)
)
_INSERT_LINK = insert(incident_alerts)
_was = incidents.c.first_alert_ts
_LINK = (
    update(incidents)
    .where(incidents.c.id == bindparam("b_id"))
    .values(
        updated_at=bindparam("b_now"),
        first_alert_ts=case(
            (or_(_was.is_(None), _was > bindparam("b_starts")), bindparam("b_starts")),
            else_=_was,
        ),
        diagnosis_state="pending",
        diagnosis_due=bindparam("b_due"),
        diagnosis_gen=incidents.c.diagnosis_gen + 1,
        diagnosis_owner=None,
        diagnosis_lease=None,
    )
)


def _upsert_alert(conn: Connection, doc: dict[str, Any], now: float) -> tuple[int, bool, bool]:
    labels = doc["labels"]
    row = conn.execute(
        _ALERT_BY_IDENTITY, {"b_fp": doc["fingerprint"], "b_starts": doc["startsAt"]}
    ).first()
    ends = validate.timestamp(doc.get("endsAt") or "0001-01-01T00:00:00Z") or None
    if row is not None:
        if row.status == doc["status"]:
            return row.id, False, False
        conn.execute(
            update(alerts)
            .where(alerts.c.id == row.id)
            .values(status=doc["status"], ends_ts=ends, updated_at=now)
        )
        return row.id, False, True
    new_id = conn.execute(
        _INSERT_ALERT,
        {
            "fingerprint": doc["fingerprint"],
            "starts_at": doc["startsAt"],
            "starts_ts": validate.timestamp(doc["startsAt"]),
            "ends_ts": ends,
            "status": doc["status"],
            "alertname": labels.get("alertname", "")[:128],
            "severity": labels.get("severity", "")[:32],
            "job_id": labels.get("job_id") or None,
            "node": labels.get("node") or None,
            "gpu": labels.get("gpu") or None,
            "labels": dumps(labels),
            "annotations": dumps(doc.get("annotations") or {}),
            "received_at": now,
            "updated_at": now,
        },
    ).inserted_primary_key[0]  # type: ignore[index]
    return int(new_id), True, False


def _open_incident(conn: Connection, now: float, job_id: str | None, node: str | None) -> int:
    if job_id is not None:
        row = conn.execute(_OPEN_OF_JOB, {"b_job": job_id}).first()
    else:
        q = select(incidents.c.id).where(
            incidents.c.state == "open", incidents.c.job_id.is_(None), incidents.c.node == node
        )
        row = conn.execute(q.order_by(incidents.c.id.desc())).first()
    if row is not None:
        return int(row.id)
    new_id = conn.execute(
        insert(incidents).values(
            job_id=job_id,
            node=node if job_id is None else None,
            state="open",
            opened_at=now,
            updated_at=now,
            diagnosis_state="pending",
            diagnosis_gen=0,
            diagnosis_attempts=0,
        )
    ).inserted_primary_key[0]  # type: ignore[index]
    return int(new_id)


def _incidents_for(
    conn: Connection, doc: dict[str, Any], on_node: dict[str, list[str]], now: float
) -> list[int]:
    labels = doc["labels"]
    job_id, node = labels.get("job_id") or None, labels.get("node") or None
    if job_id:
        return [_open_incident(conn, now, job_id, None)]
    if not node:
        return [_open_incident(conn, now, None, "")]  # cluster-level alert: one bucket
    jobs: set[str] = set(on_node.get(node, ()))
    known = conn.execute(
        select(incidents.c.job_id)
        .select_from(incidents.join(incident_alerts).join(alerts))
        .where(
            and_(
                incidents.c.state == "open", alerts.c.node == node, incidents.c.job_id.is_not(None)
            )
        )
        .distinct()
    ).scalars()
    jobs.update(j for j in known if j)
    if not jobs:
        return [_open_incident(conn, now, None, node)]
    return [_open_incident(conn, now, j, None) for j in sorted(jobs)]


def _link(
    conn: Connection,
    incident_id: int,
    alert_id: int,
    now: float,
    settle: float,
    starts: float | None = None,
) -> None:
    """Link a new alert (it has no link yet) to the incident and schedule its diagnosis."""
    if starts is None:
        starts = conn.execute(select(alerts.c.starts_ts).where(alerts.c.id == alert_id)).scalar()
    conn.execute(_INSERT_LINK, {"incident_id": incident_id, "alert_id": alert_id})
    params = {"b_id": incident_id, "b_now": now, "b_starts": starts, "b_due": now + settle}
    conn.execute(_LINK, params)


def _linked_incidents(conn: Connection, alert_id: int) -> list[int]:
    return list(
        conn.execute(
            select(incident_alerts.c.incident_id).where(incident_alerts.c.alert_id == alert_id)
        ).scalars()
    )


def _maybe_resolve(conn: Connection, incident_id: int, now: float) -> None:
    firing = conn.execute(
        select(func.count())
        .select_from(incident_alerts.join(alerts))
        .where(and_(incident_alerts.c.incident_id == incident_id, alerts.c.status == "firing"))
    ).scalar_one()
    state = conn.execute(
        select(incidents.c.state).where(incidents.c.id == incident_id)
    ).scalar_one()
    if firing == 0 and state == "open":
        conn.execute(
            update(incidents)
            .where(incidents.c.id == incident_id)
            .values(state="resolved", resolved_at=now, updated_at=now)
        )


# --- queries --------------------------------------------------------------------------------


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


def due_diagnoses(engine: Engine, now: float | None = None) -> list[tuple[int, int]]:
    """(incident id, generation) of incidents whose diagnosis is pending and due."""
    now = clock.now(engine) if now is None else now
    with engine.connect() as conn:
        rows = conn.execute(
            select(incidents.c.id, incidents.c.diagnosis_gen)
            .where(and_(incidents.c.diagnosis_state == "pending", incidents.c.diagnosis_due <= now))
            .order_by(incidents.c.diagnosis_due)
        ).all()
    return [(int(r.id), int(r.diagnosis_gen)) for r in rows]


def claim_diagnoses(
    engine: Engine, owner: str, lease_s: float, now: float | None = None, limit: int = 100
) -> list[tuple[int, int]]:
    """Claim the due diagnoses nobody holds (or whose holder's lease expired) for `owner`,
    for `lease_s` seconds: (incident id, generation), oldest due first. On PostgreSQL the rows
    are locked `FOR UPDATE SKIP LOCKED`, so receivers claiming at once never get the same."""
    now = clock.now(engine) if now is None else now
    c = incidents.c
    free = or_(c.diagnosis_lease.is_(None), c.diagnosis_lease < now, c.diagnosis_owner == owner)
    with _LOCK, engine.begin() as conn:
        rows = conn.execute(
            select(c.id, c.diagnosis_gen)
            .where(c.diagnosis_state == "pending", c.diagnosis_due <= now, free)
            .order_by(c.diagnosis_due)
            .limit(limit)
            .with_for_update(skip_locked=True)
        ).all()
        if rows:
            conn.execute(
                update(incidents)
                .where(c.id.in_([r.id for r in rows]))
                .values(diagnosis_owner=owner, diagnosis_lease=now + lease_s)
            )
    return [(int(r.id), int(r.diagnosis_gen)) for r in rows]


def release_claims(engine: Engine, but: str) -> int:
    """End every diagnosis claim not held by `but`: at start-up of the only receiver of a store
    (SQLite), whatever another owner still holds was left by a process that is gone."""
    c = incidents.c
    with _LOCK, engine.begin() as conn:
        done = conn.execute(
            update(incidents)
            .where(c.diagnosis_owner.is_not(None), c.diagnosis_owner != but)
            .values(diagnosis_owner=None, diagnosis_lease=None)
        )
    return int(done.rowcount or 0)


def store_diagnosis(
    engine: Engine,
    incident_id: int,
    gen: int,
    doc: dict[str, Any],
    recheck_s: float = 0.0,
    recheck_max: int = 0,
    now: float | None = None,
    on_final: Callable[[Connection], Any] | None = None,
    incomplete_max: int = 0,
    owner: str | None = None,
) -> str:
    """Store a diagnosis and say what it settles:

    - "done": final, plan an action on it;
    - "superseded": a newer alert re-pended the incident; its diagnosis will decide;
    - "recheck": an inconclusive verdict (`unknown`) on an open incident, diagnosed again
      `recheck_s` later, at most `recheck_max` times per incident: the symptoms that settle it
      (a GPU idle for 30 s, a peer slower for 20 s) may not have had the time to show yet;
    - "resolved": inconclusive, and the incident has resolved meanwhile: nothing to ask anyone.

    A diagnosis made while a source was unreachable (`incomplete(doc)`) of an open incident is
    also diagnosed again `recheck_s` later, at most `incomplete_max` times: an outage of Slurm
    must not lower the confidence of the verdict for good. `on_final(conn)` runs inside the
    transaction that stores a "done" diagnosis (the action outbox is written with it).
    With `owner` (the claim's, `claim_diagnoses`), nothing is stored unless the claim still
    stands ("superseded": a new alert ended it, or another receiver took over after our lease
    expired), and the claim is released.
    """
    now = clock.now(engine) if now is None else now
    for attempt in range(20):
        try:
            return _store(
                engine,
                incident_id,
                gen,
                doc,
                (recheck_s, recheck_max, incomplete_max),
                now,
                on_final,
                owner,
            )
        except IntegrityError:  # another receiver won a race for a row id (audit seq)
            time.sleep(0.01 * (attempt + 1))
    raise RuntimeError("could not store the diagnosis")


def incomplete(doc: dict[str, Any]) -> bool:
    """Slurm could not be asked: the verdict lacks the job's and the nodes' state."""
    return any(
        r.get("connector") == "slurm" and r.get("status") == "error"
        for r in doc.get("connector_reports") or []
        if isinstance(r, dict)
    )


def _store(
    engine: Engine,
    incident_id: int,
    gen: int,
    doc: dict[str, Any],
    limits: tuple[float, int, int],
    now: float,
    on_final: Callable[[Connection], Any] | None,
    owner: str | None,
) -> str:
    recheck_s, recheck_max, incomplete_max = limits
    with _LOCK, engine.begin() as conn:
        if owner is not None:
            claim = conn.execute(
                select(incidents.c.diagnosis_owner)
                .where(incidents.c.id == incident_id)
                .with_for_update()
            ).first()
            if claim is None or claim.diagnosis_owner != owner:
                return "superseded"
            conn.execute(
                update(incidents)
                .where(incidents.c.id == incident_id)
                .values(diagnosis_owner=None, diagnosis_lease=None)
            )
        conn.execute(
            insert(diagnoses).values(
                incident_id=incident_id, created_at=now, outcome=doc["outcome"], body=dumps(doc)
            )
        )
        conn.execute(
            update(incidents)
            .where(incidents.c.id == incident_id)
            .values(outcome=doc["outcome"], updated_at=now)
        )
        current = and_(incidents.c.id == incident_id, incidents.c.diagnosis_gen == gen)
        if doc["outcome"] == "unknown" and recheck_max > 0:
            unknowns = conn.execute(
                select(func.count())
                .select_from(diagnoses)
                .where(diagnoses.c.incident_id == incident_id, diagnoses.c.outcome == "unknown")
            ).scalar_one()
            open_now = and_(current, incidents.c.state == "open")
            due = {"diagnosis_due": now + recheck_s}
            if (
                unknowns <= recheck_max
                and conn.execute(update(incidents).where(open_now).values(**due)).rowcount
            ):
                return "recheck"
        if incomplete(doc) and incomplete_max > 0:
            tries = conn.execute(  # this one included
                select(func.count())
                .select_from(diagnoses)
                .where(diagnoses.c.incident_id == incident_id)
            ).scalar_one()
            open_now = and_(current, incidents.c.state == "open")
            due = {"diagnosis_due": now + recheck_s}
            if (
                tries <= incomplete_max
                and conn.execute(update(incidents).where(open_now).values(**due)).rowcount
            ):
                return "recheck"
        done = conn.execute(
            update(incidents)
            .where(current, incidents.c.diagnosis_state == "pending")
            .values(diagnosis_state="done")
        )
        if not done.rowcount:
            return "superseded"
        state = conn.execute(select(incidents.c.state).where(current)).scalar_one()
        if doc["outcome"] == "unknown" and state != "open":
            return "resolved"
        if on_final is not None:
            on_final(conn)
    return "done"


def record_failure(
    engine: Engine,
    incident_id: int,
    max_attempts: int = 5,
    retry_s: float = 10.0,
    now: float | None = None,
) -> None:
    """Count a failed diagnosis attempt; retry later, give up after `max_attempts`."""
    with _LOCK, engine.begin() as conn:
        row = conn.execute(
            select(incidents.c.diagnosis_attempts).where(incidents.c.id == incident_id)
        ).scalar_one()
        attempts = int(row or 0) + 1
        conn.execute(
            update(incidents)
            .where(incidents.c.id == incident_id)
            .values(
                diagnosis_attempts=attempts,
                diagnosis_due=(clock.now(engine) if now is None else now) + retry_s,
                diagnosis_state="failed" if attempts >= max_attempts else "pending",
                diagnosis_owner=None,
                diagnosis_lease=None,
            )
        )

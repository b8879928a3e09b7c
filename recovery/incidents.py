"""Incidents: alerts grouped per job, opened, updated and resolved.

Rules:
- an alert is identified by (fingerprint, startsAt); a redelivery with the same status changes
  nothing; a status change (firing → resolved) updates the stored alert only;
- an alert with `job_id` joins the job's open incident (one is opened if none);
- an alert with only `node` joins the open incidents of the jobs on that node (asked from
  Slurm before the ingest lock is taken) and of the jobs whose open incident has an alert on the
  node that started within `settings.lookback_s` before it (a job the fault ended has left
  Slurm's list); with none, a node incident;
- Goodput's restart of a job (`requeue`, `drain_and_requeue`, executed) ends the job's run: an
  alert that started after it is the new run's and joins a new incident, whose evidence starts
  at the restart (`recovery.worker`); a late alert of the ended run joins that run's incident
  without diagnosing it again (the verdict the restart was planned on stands), and so does an
  alert that started within `settings.restart_grace_s` of the restart, when it is job-level
  (no `node`: the detector relearning the new run, new nodes and slow first iterations, is not
  a new fault) or names a node the restart excluded that Slurm does not place the job on now
  (the ended run's detector alert firing after its `for`);
- each new alert in an incident schedules a diagnosis after `settings.settle_s`;
- receivers sharing a PostgreSQL store ingest one at a time (an advisory lock: no two open
  incidents for one job) and claim a due diagnosis with a lease (`claim_diagnoses`), so each
  is made by one receiver; a new alert ends the claim (the diagnosis under way is superseded);
- an incident resolves when all its alerts are resolved.

This module folds webhook payloads into incidents (the alert and link rows a batch writes are
`recovery.ingest_rows`); the diagnosis claims and their storage are
`recovery.diagnosis_queue`, the list/detail queries `recovery.incident_views`, both
re-exported here so callers use `recovery.incidents` alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    bindparam,
    func,
    insert,
    or_,
    select,
    update,
)

from recovery import clock, failpoints, ingest_rows, validate
from recovery.diagnosis_queue import (
    _LOCK,
    claim_diagnoses,
    due_diagnoses,
    incomplete,
    record_failure,
    release_claims,
    store_diagnosis,
)
from recovery.incident_views import get_incident, incident, latest_diagnosis, list_incidents
from recovery.outbox import excluded, restarted_at
from recovery.schema import INGEST_LOCK, serialize
from recovery.settings import Settings
from recovery.store import (
    alerts,
    incident_alerts,
    incidents,
    store_payloads,
)

__all__ = [
    "IngestResult",
    "NodeJobs",
    "Payload",
    "claim_diagnoses",
    "default_node_jobs",
    "due_diagnoses",
    "get_incident",
    "incident",
    "incomplete",
    "ingest",
    "ingest_payloads",
    "latest_diagnosis",
    "list_incidents",
    "prepare",
    "record_failure",
    "release_claims",
    "store_diagnosis",
]

log = logging.getLogger("goodput.receiver.incidents")
NodeJobs = Callable[[str], list[str]]


@dataclass
class IngestResult:
    new: int = 0
    changed: int = 0
    incident_ids: list[int] = field(default_factory=list)


def _no_slurm(_node: str) -> list[str]:
    """Slurm is off: no answer (the incidents with a recent alert on the node stand in)."""
    return []


def default_node_jobs(settings: Settings) -> NodeJobs:
    """Slurm's answer to "which jobs run on this node" (it raises when Slurm fails)."""
    sources = getattr(settings, "sources", None)  # a Settings, or a test's stand-in
    if sources is not None:
        return sources.jobs_on_node
    if not settings.slurm_enabled:
        return _no_slurm

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
        store_payloads(conn, [(p.raw, p.group_key, p.status) for p in payloads], now)
        docs = [d for p in payloads for d in p.docs]
        known = ingest_rows.stored_alerts(conn, docs)
        fresh = ingest_rows.insert_new(conn, docs, now, known)
        links = ingest_rows.Links()
        jobs = {d["labels"].get("job_id") for d in docs} - {None, ""}
        open_ = _OpenOfJobs(conn, jobs)
        results = [_fold(conn, settings, p, now, known, fresh, links, open_) for p in payloads]
        links.flush(conn)
        return results


def _fold(
    conn: Connection,
    settings: Settings,
    p: Payload,
    now: float,
    known: dict[ingest_rows.Identity, Any],
    fresh: set[ingest_rows.Identity],
    links: ingest_rows.Links,
    open_: _OpenOfJobs,
) -> IngestResult:
    result = IngestResult()
    touched: set[int] = set()
    ended: set[int] = set()  # incidents an alert's status change may resolve
    for doc in p.docs:
        alert_id, is_new, changed = ingest_rows.upsert_alert(conn, doc, now, known, fresh)
        result.new += int(is_new)
        result.changed += int(changed)
        if doc["labels"].get("goodput_notification") == "true":
            continue  # Goodput's own notices to on-call (approvals, stops) open nothing
        if doc["labels"].get("scope") == "service":
            continue  # Goodput's own health (detector, exporter down): on-call's, no job to mend
        # firing again after it was resolved, the same alert (Prometheus resends it when
        # Alertmanager resolved it for want of resends): placed as a new one is, where its
        # incident was resolved meanwhile
        refired = changed and doc["status"] == "firing"
        if (is_new or refired) and doc["status"] == "firing":
            starts = validate.timestamp(doc["startsAt"])
            t = now if starts is None else starts
            if not doc["labels"].get("node"):  # a job-level detector alert: its new run's
                t -= settings.restart_grace_s  # first minutes are relearned, not a new fault
            if refired:
                links.flush(conn)
            linked = set(_linked_incidents(conn, alert_id)) if refired else set()
            for inc, again in _incidents_for(conn, settings, doc, p.on_node, now, t, links, open_):
                if inc not in linked:  # still linked to its open incident: it stays open
                    links.add(inc, alert_id, now, settings.settle_s if again else None, starts)
                touched.add(inc)
        elif is_new or changed:
            links.flush(conn)
            ended.update(_linked_incidents(conn, alert_id))
    touched |= ended
    if ended:
        links.flush(conn)  # a firing alert linked since keeps its incident open
    for inc in ended:  # one with a new firing alert stays open: nothing to count there
        if _maybe_resolve(conn, inc, now):
            open_.resolved(inc)
    result.incident_ids = sorted(touched)
    return result


def node_lookups(docs: list[dict[str, Any]]) -> dict[str, set[tuple[str, str]]]:
    """The nodes whose jobs `prepare` asks Slurm for (firing alerts naming a node and no job),
    each with those alerts' identities."""
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
    return wanted


def _jobs_on_nodes(
    engine: Engine, docs: list[dict[str, Any]], lookup: NodeJobs
) -> dict[str, list[str]]:
    """Slurm's jobs on each node named by a new firing alert that has no job_id, asked before
    the ingest lock and transaction are taken, so a slow or unreachable Slurm delays only this
    request. A redelivered alert asks nothing; with Slurm off, or after one failed lookup, the
    nodes left unanswered fall back on the open incidents that recently named them."""
    wanted = node_lookups(docs)
    if not wanted or lookup is _no_slurm:
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


# The fold's own statement, built once (`recovery.ingest_rows` has the others)
_RESTARTED_AT = restarted_at(incidents.c.id)
_OPEN = select(incidents.c.id, incidents.c.job_id, _RESTARTED_AT.label("restarted_at")).where(
    incidents.c.state == "open"
)
_OPEN_OF_JOB = _OPEN.where(incidents.c.job_id == bindparam("b_job")).order_by(incidents.c.id.desc())
_OPEN_OF_JOBS = _OPEN.where(incidents.c.job_id.in_(bindparam("b_jobs", expanding=True))).order_by(
    incidents.c.id.desc()
)


class _OpenOfJobs:
    """The open incidents of a batch's jobs (id, restarted_at; newest first), read in one
    query and kept current as the batch opens and resolves incidents (no restart is recorded
    during an ingest); a job first met through a node alert is read when met."""

    def __init__(self, conn: Connection, jobs: set[str]) -> None:
        self.rows: dict[str, list[Any]] = {j: [] for j in jobs}
        if jobs:
            for r in conn.execute(_OPEN_OF_JOBS, {"b_jobs": sorted(jobs)}):
                self.rows[r.job_id].append(r)

    def of(self, conn: Connection, job_id: str) -> list[Any]:
        if job_id not in self.rows:
            self.rows[job_id] = list(conn.execute(_OPEN_OF_JOB, {"b_job": job_id}))
        return self.rows[job_id]

    def opened(self, job_id: str, incident_id: int) -> None:
        self.rows.setdefault(job_id, []).insert(0, _Open(incident_id, job_id, None))

    def resolved(self, incident_id: int) -> None:
        for job, rows in self.rows.items():
            self.rows[job] = [r for r in rows if r.id != incident_id]


@dataclass(frozen=True)
class _Open:  # an incident this batch opened, as `_OPEN_OF_JOB` reads one
    id: int
    job_id: str
    restarted_at: float | None


def _job_incident(
    conn: Connection,
    now: float,
    job_id: str,
    t: float,
    open_: _OpenOfJobs,
    node: str | None = None,
    grace: float = 0.0,
) -> tuple[int, bool]:
    """The incident of the job that an alert started at `t` (on `node`) joins, and whether it
    is diagnosed again. `t` falls in one of the job's runs, which Goodput's restarts end: the
    current run's alert joins the job's open incident that no restart ended (a new one if
    none); a late alert of an ended run, or one that started within `grace` of a restart on a
    node the restart took the job off (a detector's alert that fires after its `for`), joins
    the open incident whose restart ended that run, without a new diagnosis."""
    rows = open_.of(conn, job_id)
    for r in rows:
        if r.restarted_at is None or t > r.restarted_at + grace:
            continue
        if node is not None and node in excluded(conn, r.id):
            return int(r.id), False
    ended = min((r.restarted_at for r in rows if (r.restarted_at or 0) > t), default=None)
    for r in rows:
        if r.restarted_at == ended:  # None == None: the current run's incident
            return int(r.id), ended is None
    new_id = _new_incident(conn, now, job_id, None)
    open_.opened(job_id, new_id)
    return new_id, True


def _node_incident(conn: Connection, now: float, node: str) -> int:
    q = select(incidents.c.id).where(
        incidents.c.state == "open", incidents.c.job_id.is_(None), incidents.c.node == node
    )
    row = conn.execute(q.order_by(incidents.c.id.desc())).first()
    return int(row.id) if row is not None else _new_incident(conn, now, None, node)


def _new_incident(conn: Connection, now: float, job_id: str | None, node: str | None) -> int:
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
    conn: Connection,
    settings: Settings,
    doc: dict[str, Any],
    on_node: dict[str, list[str]],
    now: float,
    t: float,
    links: ingest_rows.Links,
    open_: _OpenOfJobs,
) -> list[tuple[int, bool]]:
    """The incidents a new firing alert that started at `t` joins, each with whether it is
    diagnosed again."""
    labels = doc["labels"]
    job_id, node = labels.get("job_id") or None, labels.get("node") or None
    if job_id:
        placed = job_id in on_node.get(node or "", ())  # Slurm runs the job there now
        grace = settings.restart_grace_s
        return [_job_incident(conn, now, job_id, t, open_, None if placed else node, grace)]
    if not node:
        return [(_node_incident(conn, now, ""), True)]  # cluster-level alert: one bucket
    # Slurm's jobs there, and the jobs whose incident had an alert on the node lately: a job
    # the fault itself ended (its node failed) has left Slurm's list, not the incident
    jobs = set(on_node.get(node, ())) | _recent_jobs(conn, links, node, t, settings.lookback_s)
    if not jobs:
        return [(_node_incident(conn, now, node), True)]
    return [_job_incident(conn, now, j, t, open_) for j in sorted(jobs)]


def _recent_jobs(
    conn: Connection, links: ingest_rows.Links, node: str, t: float, within: float
) -> set[str]:
    """The jobs whose open incident has an alert on `node` that started within `within` before
    `t` (a diagnosis's evidence window), and no restart before `t` (the job has left the node
    since); older, the job may have ended or left the node long ago."""
    links.flush(conn)  # the incidents that name the node, by their links
    known = conn.execute(
        select(incidents.c.job_id)
        .select_from(incidents.join(incident_alerts).join(alerts))
        .where(
            and_(
                incidents.c.state == "open",
                alerts.c.node == node,
                incidents.c.job_id.is_not(None),
                or_(_RESTARTED_AT.is_(None), _RESTARTED_AT > t),
            )
        )
        .group_by(incidents.c.id, incidents.c.job_id)
        .having(func.max(alerts.c.starts_ts) >= t - within)
    ).scalars()
    return {j for j in known if j}


def _linked_incidents(conn: Connection, alert_id: int) -> list[int]:
    return list(
        conn.execute(
            select(incident_alerts.c.incident_id).where(incident_alerts.c.alert_id == alert_id)
        ).scalars()
    )


def _maybe_resolve(conn: Connection, incident_id: int, now: float) -> bool:
    """Resolve the incident when none of its alerts fires; whether it was resolved now."""
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
        return True
    return False

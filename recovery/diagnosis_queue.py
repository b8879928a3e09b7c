"""The diagnosis queue of the incidents: the due diagnoses, their claims with a lease (one
receiver makes each), storing a diagnosis with what it settles (done, superseded, recheck,
resolved), and counting a failed attempt. `_LOCK` is the one in-process writer lock of the
incident rows, shared with the ingest (`recovery.incidents`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine, and_, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from recovery import clock, leases
from recovery.store import diagnoses, dumps, incidents

log = logging.getLogger(__name__)
_LOCK = threading.Lock()  # one writer at a time inside this process (incident creation races)


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
    *,
    owner: str | None = None,
    gen: int | None = None,
) -> bool:
    """Count a failed diagnosis attempt; retry later, give up after `max_attempts`. Only while
    the claim stands: `owner`'s (by default this process's, `leases.OWNER`), of generation
    `gen` (when given), still pending. A stale failure (a new alert ended the claim, another
    receiver took it over or stored its diagnosis) changes nothing: False."""
    now = clock.now(engine) if now is None else now
    c, owner = incidents.c, leases.OWNER if owner is None else owner
    claim = and_(c.id == incident_id, c.diagnosis_owner == owner, c.diagnosis_state == "pending")
    if gen is not None:
        claim = and_(claim, c.diagnosis_gen == gen)
    with _LOCK, engine.begin() as conn:
        row = conn.execute(select(c.diagnosis_attempts).where(claim).with_for_update()).first()
        if row is None:
            log.info("incident %s: a stale diagnosis failed; not counted", incident_id)
            return False
        attempts = int(row.diagnosis_attempts or 0) + 1
        conn.execute(
            update(incidents)
            .where(claim)
            .values(
                diagnosis_attempts=attempts,
                diagnosis_due=now + retry_s,
                diagnosis_state="failed" if attempts >= max_attempts else "pending",
                diagnosis_owner=None,
                diagnosis_lease=None,
            )
        )
    return True

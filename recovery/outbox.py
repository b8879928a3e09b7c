"""The action outbox: one row per planned action, written before anything is executed.

A final diagnosis and its outbox row are committed in ONE transaction (`enqueue`, called from
inside `incidents.store_diagnosis`): the row starts `planning` and carries the diagnosis, so a
process that dies before planning leaves a row that `reconcile` plans on restart. Every later
step moves the row with a conditional UPDATE (`WHERE state IN (...)`), so a step is done once
whichever process gets there first, and a re-plan replaces the row in place.

States: `planning` → `waiting_scheduler` (retried) | `pending_approval` | `ready` →
(`approved`) → `executing` → `executed` | `failed`; terminal also `rejected`, `expired`,
`planned_only`, `no_action`, `skipped`.

The steps that touch the scheduler are `recovery.executor`'s; here are the table, the writes that
need none (`enqueue`, `expire`) and the reads (`get_action`, `incident_action`, `list_actions`,
`counts`).
"""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Float,
    Index,
    Integer,
    String,
    Table,
    Text,
    cast,
    func,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement

from recovery import audit, clock
from recovery.decide import Diagnosis
from recovery.policy import RESTARTS
from recovery.schema import metadata

actions_table = Table(
    "goodput_actions",
    metadata,
    Column("id", String(80), primary_key=True),  # the idempotency key
    Column("incident_id", String(64), nullable=True),
    Column("job_id", String(32), nullable=True),
    Column("kind", String(32), nullable=False),
    Column("state", String(24), nullable=False),
    Column("mode", String(16), nullable=False),
    Column("body", Text, nullable=False),  # the Action, the cause key, the outcome
    Column("restarts_before", Integer, nullable=True),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("expires_at", Float, nullable=True),
    Column("next_attempt_at", Float, nullable=True),
    Column("attempts", Integer, nullable=False, default=0),
    Column("owner", String(64), nullable=True),
    Column("lease_until", Float, nullable=True),  # an executing row's owner lease (leases)
    Column("decided_by", String(128), nullable=True),
    Column("last_error", Text, nullable=True),
    Column("result", Text, nullable=True),
)
# For the planner's bounded reads (_history, incident_action) and the retry loop's state scans.
Index("ix_goodput_actions_state_created", actions_table.c.state, actions_table.c.created_at)
Index("ix_goodput_actions_state_updated", actions_table.c.state, actions_table.c.updated_at)
Index("ix_goodput_actions_job_state", actions_table.c.job_id, actions_table.c.state)
Index("ix_goodput_actions_incident", actions_table.c.incident_id, actions_table.c.created_at)
switches = Table(
    "goodput_switches",
    metadata,
    Column("name", String(32), primary_key=True),
    Column("value", String(64), nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("updated_by", String(128), nullable=False),
)

PLANNABLE = ("planning", "waiting_scheduler")  # a diagnosis with no decision yet
OPEN_STATES = (*PLANNABLE, "pending_approval", "ready", "approved", "executing")
RUNNABLE = ("ready", "approved", "executing")
# Rows whose drains are done or reserved (the blast-radius budget): planned, not given up.
RESERVING = ("pending_approval", "ready", "approved", "executing")
DRAIN_STATES = ("executed", *RESERVING)
# A later diagnosis of the same incident is planned again only when the earlier plan did
# nothing in the scheduler and the verdict (outcome or culprit nodes) changed.
REPLANNABLE = ("no_action", "planned_only", "skipped")
STATES = (*OPEN_STATES, "executed", "failed", "rejected", "expired", *REPLANNABLE)  # every one


def runnable_state(row: Any) -> str:
    """Where a row waits to run (again): `approved` once a person approved it, else `ready`."""
    return "approved" if row.decided_by else "ready"


def known_state(state: str) -> str:
    """`state` when it is an action state (a filter's value); ValueError naming them all."""
    if state not in STATES:
        raise ValueError(f"unknown state {state!r}: one of {', '.join(STATES)}")
    return state


MAX_PLANS_PER_INCIDENT = 5


def now(db: Engine | Connection | None = None) -> float:
    """The time of `db`'s receiver (`recovery.clock`)."""
    return clock.now(db)


def refs(row: Any) -> dict[str, Any]:
    """An outbox row's (a Row or its dict) references for its audit events."""
    r = row if isinstance(row, dict) else row._mapping
    return {"job_id": r["job_id"], "incident_id": r["incident_id"], "action_id": r["id"]}


def raw(conn_or_engine: Connection | Engine, action_id: str) -> Any:
    q = select(actions_table).where(actions_table.c.id == action_id)
    if isinstance(conn_or_engine, Engine):
        with conn_or_engine.connect() as conn:
            return conn.execute(q).first()
    return conn_or_engine.execute(q).first()


def public(r: Any) -> dict[str, Any]:
    d = dict(r._mapping)
    d["body"] = json.loads(d["body"])
    d["result"] = json.loads(d["result"]) if d.get("result") else None
    d.pop("owner", None)
    d.pop("lease_until", None)
    return d


# Goodput's restarts of a job end one run and begin the next: what happened after one is the
# new run's, whose faults open a new incident (`recovery.incidents`).
_RESTARTED = (actions_table.c.state == "executed", actions_table.c.kind.in_(RESTARTS))


def restarted_at(incident_id: ColumnElement[Any]) -> Any:
    """SQL: when an action of the incident `incident_id` (an integer column) restarted its job
    (`requeue`, `drain_and_requeue`, executed), or NULL."""
    a = actions_table.c
    return (
        select(func.min(a.updated_at))
        .where(a.incident_id == cast(incident_id, String), *_RESTARTED)
        .scalar_subquery()
    )


def excluded(conn: Connection, incident_id: int) -> set[str]:
    """The nodes the incident's restarts took its job off (their `exclude`)."""
    q = select(actions_table.c.body).where(
        actions_table.c.incident_id == str(incident_id), *_RESTARTED
    )
    out: set[str] = set()
    for body in conn.execute(q).scalars():
        action = json.loads(body).get("action") or {}
        out.update(n for n in action.get("exclude") or [] if isinstance(n, str))
    return out


def run_bounds(engine: Engine, job_id: str | None, t: float) -> tuple[float | None, float | None]:
    """The job's run that time `t` falls in, as Goodput's restarts of the job bound it: (the
    last restart at or before `t`, the first after), None where there is none."""
    if job_id is None:
        return None, None
    q = select(actions_table.c.updated_at).where(actions_table.c.job_id == job_id, *_RESTARTED)
    with engine.connect() as conn:
        times = [float(x) for x in conn.execute(q).scalars()]
    return max((x for x in times if x <= t), default=None), min(
        (x for x in times if x > t), default=None
    )


def get_action(engine: Engine, action_id: str) -> dict[str, Any] | None:
    """One action as the API shows it, or None."""
    r = raw(engine, action_id)
    return public(r) if r else None


def incident_action(engine: Engine, incident_id: str) -> dict[str, Any] | None:
    """The incident's latest action (`inc-<id>`, then `inc-<id>-2`, … when re-planned)."""
    with engine.connect() as conn:
        row = latest(conn, str(incident_id))
    return public(row) if row is not None else None


def expire(engine: Engine) -> int:
    """Expire pending approvals past their deadline (audited)."""
    t = now(engine)
    with engine.connect() as conn:
        rows = conn.execute(
            select(actions_table).where(
                actions_table.c.state == "pending_approval", actions_table.c.expires_at < t
            )
        ).all()

    def expire_one(conn: Connection, r: Any) -> int:
        done = conn.execute(
            update(actions_table)
            .where(actions_table.c.id == r.id, actions_table.c.state == "pending_approval")
            .values(state="expired", updated_at=t)
        ).rowcount
        if done:
            audit.append(conn, "expired", {"expires_at": r.expires_at}, **refs(r))
        return int(done)

    return sum(write(engine, expire_one, r) for r in rows)


def list_actions(
    engine: Engine, state: str | None = None, job_id: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    """The newest actions first (pending ones past their deadline expired first)."""
    expire(engine)
    q = (
        select(actions_table)
        .order_by(actions_table.c.created_at.desc())
        .limit(max(1, min(limit, 1000)))
    )
    if state:
        q = q.where(actions_table.c.state == state)
    if job_id:
        q = q.where(actions_table.c.job_id == job_id)
    with engine.connect() as conn:
        return [public(r) for r in conn.execute(q).all()]


def counts(engine: Engine) -> dict[tuple[str, str], int]:
    """(kind, state) -> number of actions: for metrics, counted by the database (every
    scrape asks, and the table keeps every action ever planned)."""
    t = actions_table.c
    q = select(t.kind, t.state, func.count()).group_by(t.kind, t.state)
    with engine.connect() as conn:
        return {(kind, state): int(n) for kind, state, n in conn.execute(q)}


def retrying(engine: Engine) -> int:
    """Open actions waiting to try again after the scheduler failed a try (unreachable, or
    Slurm answering "try again"): those with a retry time."""
    t = actions_table.c
    q = select(func.count()).where(t.state.in_(OPEN_STATES), t.next_attempt_at.is_not(None))
    with engine.connect() as conn:
        return int(conn.execute(q).scalar() or 0)


def diag_dict(d: Diagnosis) -> dict[str, Any]:
    return {
        "outcome": d.outcome,
        "root_cause": d.root_cause,
        "confidence": d.confidence,
        "affected_nodes": list(d.affected_nodes),
        "onset": d.onset,
        "cause_key": d.cause_key,
        "action_hint": d.hint,
    }


def latest(conn: Connection, incident_id: str) -> Any:
    """The incident's latest outbox row (`inc-<id>`, then `inc-<id>-2`, … when re-planned)."""
    return conn.execute(
        select(actions_table)
        .where(actions_table.c.incident_id == str(incident_id))
        .order_by(actions_table.c.created_at.desc(), actions_table.c.id.desc())
        .limit(1)
    ).first()


def _replan(row: Any, diag: Diagnosis) -> bool:
    before = json.loads(row.body).get("diagnosis", {})
    changed = before.get("outcome") != diag.outcome or sorted(
        before.get("affected_nodes") or []
    ) != sorted(diag.affected_nodes)
    plans = int(row.id.rsplit("-", 1)[-1]) if row.id.count("-") > 1 else 1
    # a drain alone left the job as it was: a later verdict on it (the job crashed) is planned
    did_nothing_to_the_job = row.state in REPLANNABLE or (
        row.state == "executed" and row.kind == "drain"
    )
    return did_nothing_to_the_job and changed and plans < MAX_PLANS_PER_INCIDENT


def _next_id(action_id: str) -> str:
    base, _, n = action_id.rpartition("-")
    return f"{base}-{int(n) + 1}" if action_id.count("-") > 1 else f"{action_id}-2"


def enqueue(conn: Connection, incident: dict[str, Any], diagnosis: dict[str, Any]) -> str | None:
    """Write the outbox row for a final diagnosis inside the caller's transaction; returns the
    action id to plan, or None (invalid diagnosis, audited; or the incident's plan stands).

    A row not yet decided (`planning`, `waiting_scheduler`) takes the newer diagnosis in place;
    a decided one that did nothing to the job (nothing at all, or a drain alone) is followed by
    `inc-<id>-N` when the verdict changed.
    """
    incident_id = str(incident.get("id", diagnosis.get("incident_id", "")))
    job_id = diagnosis.get("job_id") or incident.get("job_id")
    try:
        diag = Diagnosis.from_dict({**diagnosis, "incident_id": incident_id, "job_id": job_id})
    except ValueError as exc:
        audit.append(
            conn, "skipped", {"reason": f"invalid diagnosis: {exc}"}, incident_id=incident_id
        )
        return None
    opened = incident.get("opened_at")
    body = {
        "diagnosis": diag_dict(diag),
        "cause_key": diag.cause_key,
        "incident": {"opened_at": opened if isinstance(opened, int | float) else None},
    }
    prev = latest(conn, incident_id)
    t = now(conn)
    if prev is not None and prev.state in PLANNABLE:
        if json.loads(prev.body).get("diagnosis") == body["diagnosis"]:
            return str(prev.id)  # the same diagnosis delivered again
        conn.execute(
            update(actions_table)
            .where(actions_table.c.id == prev.id, actions_table.c.state.in_(PLANNABLE))
            .values(body=json.dumps(body, default=str), state="planning", updated_at=t)
        )
        action_id = str(prev.id)
    elif prev is not None and not _replan(prev, diag):
        return None
    else:
        action_id = f"inc-{incident_id}" if prev is None else _next_id(prev.id)
        conn.execute(
            actions_table.insert().values(
                id=action_id,
                incident_id=incident_id,
                job_id=diag.job_id,
                kind="none",
                state="planning",
                mode="",
                body=json.dumps(body, default=str),
                created_at=t,
                updated_at=t,
                attempts=0,
            )
        )
    audit.append(conn, "diagnosis", diag_dict(diag), job_id=diag.job_id, incident_id=incident_id)
    return action_id


def write(engine: Engine, fn: Any, *args: Any) -> Any:
    """Run `fn(conn, *args)` in a transaction, again after a lost race (audit seq, row id)."""
    for attempt in range(20):
        try:
            with engine.begin() as conn:
                return fn(conn, *args)
        except IntegrityError:
            time.sleep(0.01 * (attempt + 1))
    raise RuntimeError("could not write the action outbox")

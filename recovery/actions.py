"""Recovery actions: plan -> (approve) -> execute -> verify -> record, crash-safe.

The receiver calls `on_diagnosis(engine, settings, incident, diagnosis)` after storing a
diagnosis. The planned action is written to an outbox table (its id is the idempotency key:
one action per incident) together with its audit entry *before* anything is executed; the
scheduler port's guards (expected restart count, drained-by-whom) make a repeated execution a
no-op. On start, `reconcile()` picks up every action that was planned, approved or executing
when the process died and finishes it against the scheduler's real state.

Settings are read from attributes of `settings` (getattr) or the environment:
`GOODPUT_MODE`, `GOODPUT_POLICY_FILE`, `GOODPUT_SCHEDULER`, `GOODPUT_SIM_URL`,
`GOODPUT_ALERTMANAGER_URL`, `GOODPUT_PROMETHEUS_URL`. Test hook: `GOODPUT_TEST_CRASH_AT`
= `planned` | `executed` makes the process SIGKILL itself at that point.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
import uuid
import weakref
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests
from sqlalchemy import (
    Column,
    Engine,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.schema import CreateIndex

from recovery import accounting, audit
from recovery.decide import Action, Diagnosis, History, JobView, NodeView, decide
from recovery.directives import check_bounds, merge, parse_directive
from recovery.policy import DEFAULT_FILE, DRAINS, RESTARTS, Policy, load_policy
from recovery.scheduler import (
    Scheduler,
    SchedulerError,
    SchedulerUnavailable,
    from_settings,
)
from recovery.scheduler.base import check_node

log = logging.getLogger("goodput.actions")
metadata = MetaData()
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
    Column("decided_by", String(128), nullable=True),
    Column("last_error", Text, nullable=True),
    Column("result", Text, nullable=True),
)
# For the planner's bounded reads (_history, incident_action) and the retry loop's state scans.
Index("ix_goodput_actions_state_created", actions_table.c.state, actions_table.c.created_at)
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

# States. Terminal: executed, failed, rejected, expired, planned_only, no_action, skipped.
OPEN_STATES = ("waiting_scheduler", "pending_approval", "ready", "approved", "executing")
RUNNABLE = ("ready", "approved", "executing")
MAX_ATTEMPTS = 50
OWNER = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
_ensured: weakref.WeakSet[Engine] = weakref.WeakSet()
_running: weakref.WeakSet[Engine] = weakref.WeakSet()
_lock = threading.Lock()


class ActionError(ValueError):
    """A request about an action that cannot be honoured (unknown id, wrong state)."""


@dataclass(frozen=True)
class Config:
    policy: Policy
    scheduler: Scheduler
    alertmanager_url: str | None
    prometheus_url: str | None
    retry_base_s: float


def _setting(settings: Any, attr: str, env: str, default: str | None = None) -> str | None:
    value = getattr(settings, attr, None)
    if value:
        return str(value)
    extra = getattr(settings, "extra", None) or {}
    return extra.get(env) or os.environ.get(env) or default


_sched_cache: dict[str, Scheduler] = {}
# (absolute path, GOODPUT_MODE) -> (mtime_ns, size, inode, policy) of the last read.
_policy_cache: dict[tuple[str, str], tuple[int, int, int, Policy]] = {}


def _policy(settings: Any) -> Policy:
    """The policy file, validated; read again only when its mtime, size or inode changes, so
    an edit takes effect on the next incident and an invalid edit raises PolicyError, as a
    fresh read would (the last good version is not kept in force)."""
    env = dict(os.environ)
    env.update(getattr(settings, "extra", None) or {})
    chosen = getattr(settings, "policy_file", None) or env.get("GOODPUT_POLICY_FILE")
    path = Path(chosen or DEFAULT_FILE)
    try:
        st = path.stat()
    except OSError:
        return load_policy(path, env=env)  # raises PolicyError naming the file
    key = (os.path.abspath(path), env.get("GOODPUT_MODE", ""))
    stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
    cached = _policy_cache.get(key)
    if cached is not None and cached[:3] == stamp:
        return cached[3]
    policy = load_policy(path, env=env)
    _policy_cache[key] = (*stamp, policy)
    return policy


def config(settings: Any) -> Config:
    policy = getattr(settings, "policy", None)
    if not isinstance(policy, Policy):
        policy = _policy(settings)
    sched = getattr(settings, "scheduler_adapter", None)
    if sched is None:
        kind = _setting(settings, "scheduler", "GOODPUT_SCHEDULER", "slurm") or "slurm"
        if kind not in _sched_cache:
            _sched_cache[kind] = from_settings(settings)
        sched = _sched_cache[kind]
    return Config(
        policy=policy,
        scheduler=sched,
        alertmanager_url=_setting(settings, "alertmanager_url", "GOODPUT_ALERTMANAGER_URL"),
        prometheus_url=_setting(settings, "prometheus_url", "GOODPUT_PROMETHEUS_URL"),
        retry_base_s=float(getattr(settings, "action_retry_s", 5.0)),
    )


def ensure(engine: Engine) -> None:
    if engine in _ensured:
        return
    metadata.create_all(engine)
    with engine.begin() as conn:  # create_all skips the indexes of a table that already exists
        for index in actions_table.indexes:
            conn.execute(CreateIndex(index, if_not_exists=True))
    audit.ensure(engine)
    accounting.ensure(engine)
    _ensured.add(engine)


def _crash_hook(point: str) -> None:
    if os.environ.get("GOODPUT_TEST_CRASH_AT") == point:
        os.kill(os.getpid(), signal.SIGKILL)


def _now() -> float:
    return time.time()


def _refs(row: Any) -> dict[str, Any]:
    """An outbox row's (a Row or its dict) references for its audit events."""
    r = row if isinstance(row, dict) else row._mapping
    return {"job_id": r["job_id"], "incident_id": r["incident_id"], "action_id": r["id"]}


# ---- the pause switch ---------------------------------------------------------------------
def is_paused(engine: Engine) -> bool:
    ensure(engine)
    with engine.connect() as conn:
        row = conn.execute(select(switches.c.value).where(switches.c.name == "pause")).first()
    return bool(row and row.value == "on")


def set_paused(engine: Engine, paused: bool, who: str, reason: str = "") -> None:
    """Flip the global pause switch (audited)."""
    ensure(engine)
    value = "on" if paused else "off"
    with engine.begin() as conn:
        done = conn.execute(
            update(switches)
            .where(switches.c.name == "pause")
            .values(value=value, updated_at=_now(), updated_by=who[:128])
        ).rowcount
        if not done:
            conn.execute(
                switches.insert().values(
                    name="pause", value=value, updated_at=_now(), updated_by=who[:128]
                )
            )
        audit.append(conn, "paused" if paused else "resumed", {"reason": reason[:500]}, actor=who)


# ---- planning -------------------------------------------------------------------------------
# decide() counts drains in the hour before `now` (blast_radius_violation); older ones are not read.
DRAIN_WINDOW_S = 3600.0
# Rows whose drains count: done or still to be done (a plan waiting for the scheduler has none).
DRAIN_STATES = ("executed", *(s for s in OPEN_STATES if s != "waiting_scheduler"))


def _history(engine: Engine, cfg: Config, diag: Diagnosis, job: Any, nodes: list[Any]) -> History:
    """What decide needs from the outbox: the job's executed restarts (all of them: the retry
    budget is per job) and the drains planned or done in the last hour (the blast radius)."""
    now = _now()
    t = actions_table.c
    with engine.connect() as conn:
        restarts = conn.execute(
            select(t.body).where(
                t.job_id == diag.job_id, t.state == "executed", t.kind.in_(RESTARTS)
            )
        ).all()
        recent = conn.execute(
            select(t.created_at, t.body).where(
                t.state.in_(DRAIN_STATES),
                t.created_at > now - DRAIN_WINDOW_S,
                t.created_at <= now,
            )
        ).all()
    same = sum(1 for r in restarts if json.loads(r.body).get("cause_key") == diag.cause_key)
    drain_times: list[float] = []
    for r in recent:
        drain_times += [r.created_at] * len(json.loads(r.body).get("action", {}).get("nodes", []))
    jv = None
    if job is not None:
        jv = JobView(job.state, job.restarts, job.exit_code, job.partition, job.start_time)
    return History(
        now=now,
        job=jv,
        restarts_done=len(restarts),
        same_cause_restarts=same,
        drain_times=tuple(drain_times),
        nodes=tuple(NodeView(n.node, n.state, n.partitions) for n in nodes),
        paused=is_paused(engine),
    )


def _insert(
    engine: Engine,
    row: dict[str, Any],
    events: list[tuple[str, dict[str, Any]]],
    actor: str = "goodput",
) -> bool:
    """Insert the outbox row and its audit events atomically; False if the key exists."""
    for attempt in range(20):
        try:
            with engine.begin() as conn:
                if conn.execute(
                    select(actions_table.c.id).where(actions_table.c.id == row["id"])
                ).first():
                    return False
                conn.execute(actions_table.insert().values(**row))
                for type_, payload in events:
                    audit.append(conn, type_, payload, **_refs(row), actor=actor)
                return True
        except IntegrityError:
            time.sleep(0.01 * (attempt + 1))
    raise RuntimeError("could not write the action outbox")


def on_diagnosis(
    engine: Engine, settings: Any, incident: dict[str, Any], diagnosis: dict[str, Any]
) -> dict[str, Any] | None:
    """Plan (and, by mode, execute or queue for approval) the action for one diagnosis.

    Idempotent per incident. Never raises for bad input: it is audited and None returned.
    """
    ensure(engine)
    start(engine, settings)
    incident_id = str(incident.get("id", diagnosis.get("incident_id", "")))
    job_id = diagnosis.get("job_id") or incident.get("job_id")
    try:
        diag = Diagnosis.from_dict({**diagnosis, "incident_id": incident_id, "job_id": job_id})
    except ValueError as exc:
        audit.record(
            engine, "skipped", {"reason": f"invalid diagnosis: {exc}"}, incident_id=incident_id
        )
        return None
    latest = incident_action(engine, incident_id)
    if latest is not None and not _replan(latest, diag):
        return latest
    action_id = f"inc-{incident_id}" if latest is None else _next_id(latest["id"])
    audit.record(engine, "diagnosis", _diag_dict(diag), job_id=diag.job_id, incident_id=incident_id)
    accounting.open_incident(
        engine, incident, diag, _setting(settings, "prometheus_url", "GOODPUT_PROMETHEUS_URL")
    )
    _plan(engine, settings, action_id, diag, incident)
    return get_action(engine, action_id)


# A later diagnosis of the same incident is planned again only when the earlier plan did
# nothing in the scheduler and the verdict (outcome or culprit nodes) changed.
REPLANNABLE = ("no_action", "planned_only", "skipped")
MAX_PLANS_PER_INCIDENT = 5


def _replan(latest: dict[str, Any], diag: Diagnosis) -> bool:
    before = latest["body"].get("diagnosis", {})
    changed = before.get("outcome") != diag.outcome or sorted(
        before.get("affected_nodes") or []
    ) != sorted(diag.affected_nodes)
    plans = int(latest["id"].rsplit("-", 1)[-1]) if latest["id"].count("-") > 1 else 1
    return latest["state"] in REPLANNABLE and changed and plans < MAX_PLANS_PER_INCIDENT


def _next_id(action_id: str) -> str:
    base, _, n = action_id.rpartition("-")
    return f"{base}-{int(n) + 1}" if action_id.count("-") > 1 else f"{action_id}-2"


def incident_action(engine: Engine, incident_id: str) -> dict[str, Any] | None:
    """The incident's latest action (`inc-<id>`, then `inc-<id>-2`, … when re-planned)."""
    ensure(engine)
    with engine.connect() as conn:
        rows = conn.execute(
            select(actions_table)
            .where(actions_table.c.incident_id == str(incident_id))
            .order_by(actions_table.c.created_at.desc())
            .limit(1)
        ).all()
    return _public(rows[0]) if rows else None


def _plan(
    engine: Engine, settings: Any, action_id: str, diag: Diagnosis, incident: dict[str, Any]
) -> None:
    cfg = config(settings)
    now = _now()
    body: dict[str, Any] = {"diagnosis": _diag_dict(diag), "cause_key": diag.cause_key}
    try:
        job = cfg.scheduler.job_state(diag.job_id) if diag.job_id else None
        nodes = cfg.scheduler.node_states()
    except SchedulerUnavailable as exc:
        row = _row(action_id, diag, "none", "waiting_scheduler", cfg.policy.mode, body, None, now)
        row.update(next_attempt_at=now + cfg.retry_base_s, last_error=str(exc))
        _insert(
            engine,
            row,
            [("retry_scheduled", {"reason": f"scheduler unreachable while planning: {exc}"})],
        )
        return
    events: list[tuple[str, dict[str, Any]]] = []
    policy = cfg.policy
    if job is not None:
        directive, error = parse_directive(job.comment)
        if directive is not None:
            error = check_bounds(policy, directive)
        if error:
            events.append(("directive_invalid", {"comment": job.comment[:500], "error": error}))
        elif directive is not None:
            policy = merge(policy, directive)
            body["directive"] = job.comment[:500]
    action = decide(diag, _history(engine, cfg, diag, job, nodes), policy)
    body["action"] = action.to_dict()
    state = {
        "execute": "ready",
        "await_approval": "pending_approval",
        "plan_only": "planned_only",
    }.get(action.disposition, "no_action")
    row = _row(
        action_id, diag, action.kind, state, action.mode, body, job.restarts if job else None, now
    )
    if state == "pending_approval":
        row["expires_at"] = now + policy.approval_expiry_s
    events.append(("planned", {**action.to_dict(), "state": state}))
    if state == "pending_approval":
        events.append(("pending_approval", {"expires_at": row["expires_at"]}))
    if not _insert(engine, row, events):
        return
    _crash_hook("planned")
    accounting.mark_decided(engine, diag.incident_id, now)
    if state == "pending_approval":
        _notify(
            engine,
            cfg,
            "GoodputActionPendingApproval",
            row,
            action,
            f"Goodput plans {action.kind} for job {action.job_id}: approve or reject "
            f"with `goodput actions approve {action_id}`",
            "warning",
            row["expires_at"],
        )
    elif action.kind == "hold_for_person":
        _notify(
            engine,
            cfg,
            "GoodputNeedsPerson",
            row,
            action,
            f"Goodput needs a person for job {action.job_id} "
            f"({diag.outcome}): {', '.join(action.reasons)}",
            "warning",
            None,
        )
    elif state == "ready":
        execute(engine, settings, action_id)


def _diag_dict(d: Diagnosis) -> dict[str, Any]:
    return {
        "outcome": d.outcome,
        "root_cause": d.root_cause,
        "confidence": d.confidence,
        "affected_nodes": list(d.affected_nodes),
        "onset": d.onset,
        "cause_key": d.cause_key,
    }


def _row(
    action_id: str,
    diag: Diagnosis,
    kind: str,
    state: str,
    mode: str,
    body: dict[str, Any],
    restarts: int | None,
    now: float,
) -> dict[str, Any]:
    return {
        "id": action_id,
        "incident_id": diag.incident_id,
        "job_id": diag.job_id,
        "kind": kind,
        "state": state,
        "mode": mode,
        "body": json.dumps(body, default=str),
        "restarts_before": restarts,
        "created_at": now,
        "updated_at": now,
        "attempts": 0,
    }


# ---- execution -----------------------------------------------------------------------------
def _claim(engine: Engine, action_id: str, from_states: tuple[str, ...]) -> Any:
    with engine.begin() as conn:
        n = conn.execute(
            update(actions_table)
            .where(
                actions_table.c.id == action_id,
                actions_table.c.state.in_(from_states),
            )
            .values(
                state="executing",
                owner=OWNER,
                updated_at=_now(),
                attempts=actions_table.c.attempts + 1,
            )
        ).rowcount
        if not n:
            return None
        row = conn.execute(select(actions_table).where(actions_table.c.id == action_id)).one()
        audit.append(
            conn,
            "executing",
            {"attempt": row.attempts},
            **_refs(row),
        )
        return row


def _finish(
    engine: Engine, row: Any, state: str, type_: str, payload: dict[str, Any], **values: Any
) -> None:
    with engine.begin() as conn:
        conn.execute(
            update(actions_table)
            .where(actions_table.c.id == row.id)
            .values(state=state, updated_at=_now(), **values)
        )
        audit.append(conn, type_, payload, **_refs(row))


def execute(
    engine: Engine,
    settings: Any,
    action_id: str,
    from_states: tuple[str, ...] = ("ready", "approved"),
) -> dict[str, Any] | None:
    """Execute one ready or approved action (a no-op if someone else holds it)."""
    ensure(engine)
    cfg = config(settings)
    if is_paused(engine):
        r = _raw(engine, action_id)
        if r is not None and r.state in from_states:
            _finish(engine, r, "skipped", "skipped", {"reason": "paused"})
        return get_action(engine, action_id)
    row = _claim(engine, action_id, from_states)
    if row is None:
        return get_action(engine, action_id)
    body = json.loads(row.body)
    action = body["action"]
    sched = cfg.scheduler
    steps: list[str] = []
    try:
        outcome = body.get("diagnosis", {}).get("outcome", "")
        for node in action.get("nodes", []):
            reason = f"goodput: {outcome} incident {row.incident_id} action {row.id}"
            steps.append(sched.drain(node, reason).detail)
        kind = row.kind
        if kind in RESTARTS:
            steps.append(
                sched.requeue(
                    row.job_id,
                    tuple(action.get("exclude", [])),
                    expected_restarts=row.restarts_before,
                    delay_s=float(action.get("delay_s", 0.0)),
                ).detail
            )
        elif kind == "stop" and row.job_id:
            steps.append(sched.stop(row.job_id, expected_restarts=row.restarts_before).detail)
        elif kind == "resume_node":
            for node in action.get("resume", []):
                steps.append(sched.resume(node).detail)
    except (SchedulerError, ValueError) as exc:  # GuardRefused, SchedulerUnavailable included
        if isinstance(exc, SchedulerUnavailable) and row.attempts < MAX_ATTEMPTS:
            back = "approved" if row.decided_by else "ready"
            delay = min(cfg.retry_base_s * 2 ** min(row.attempts, 6), 600.0)
            _finish(
                engine,
                row,
                back,
                "retry_scheduled",
                {"error": str(exc), "steps": steps, "retry_in_s": delay},
                last_error=str(exc),
                next_attempt_at=_now() + delay,
            )
        else:
            _finish(
                engine,
                row,
                "failed",
                "failed",
                {"error": str(exc), "steps": steps},
                last_error=str(exc),
            )
        return get_action(engine, action_id)
    _crash_hook("executed")
    result = {"steps": steps, "verified": _verify(sched, row, action)}
    _finish(engine, row, "executed", "executed", result, result=json.dumps(result))
    if row.kind == "stop":
        _notify(
            engine,
            cfg,
            "GoodputJobStopped",
            _raw(engine, action_id),
            None,
            f"Goodput stopped job {row.job_id} ({outcome}); release or cancel it",
            "warning",
            None,
        )
    return get_action(engine, action_id)


def _verify(sched: Scheduler, row: Any, action: dict[str, Any]) -> dict[str, Any]:
    """What the scheduler shows after the action (recorded, not enforced)."""
    out: dict[str, Any] = {}
    try:
        if action.get("nodes") or action.get("resume"):
            states = {n.node: n for n in sched.node_states()}
            for node in [*action.get("nodes", []), *action.get("resume", [])]:
                s = states.get(node)
                out[node] = {"state": s.state, "reason": s.reason} if s else None
        if row.job_id and row.kind in (*RESTARTS, "stop"):
            j = sched.job_state(row.job_id)
            if j is not None:
                out["job"] = {
                    "state": j.state,
                    "restarts": j.restarts,
                    "held": j.held,
                    "excluded": list(j.excluded),
                }
    except SchedulerError as exc:
        out["error"] = str(exc)
    return out


# ---- approvals, resume_node -----------------------------------------------------------------
def _raw(engine: Engine, action_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(actions_table).where(actions_table.c.id == action_id)).first()


def get_action(engine: Engine, action_id: str) -> dict[str, Any] | None:
    ensure(engine)
    r = _raw(engine, action_id)
    return _public(r) if r else None


def _public(r: Any) -> dict[str, Any]:
    d = dict(r._mapping)
    d["body"] = json.loads(d["body"])
    d["result"] = json.loads(d["result"]) if d.get("result") else None
    d.pop("owner", None)
    return d


def list_actions(
    engine: Engine, state: str | None = None, job_id: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    ensure(engine)
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
        return [_public(r) for r in conn.execute(q).all()]


def approve(
    engine: Engine, settings: Any, action_id: str, who: str, comment: str = ""
) -> dict[str, Any]:
    """Approve a pending action (recording who) and execute it."""
    _decide_pending(engine, action_id, who, "approved", comment)
    return execute(engine, settings, action_id, ("approved",)) or {}


def reject(engine: Engine, action_id: str, who: str, comment: str = "") -> dict[str, Any]:
    _decide_pending(engine, action_id, who, "rejected", comment)
    return get_action(engine, action_id) or {}


def _decide_pending(engine: Engine, action_id: str, who: str, verdict: str, comment: str) -> None:
    ensure(engine)
    expire(engine)
    if not who or len(who) > 128:
        raise ActionError("who must be a non-empty name of at most 128 characters")
    with engine.begin() as conn:
        row = conn.execute(select(actions_table).where(actions_table.c.id == action_id)).first()
        if row is None:
            raise ActionError(f"no action {action_id}")
        if row.state != "pending_approval":
            raise ActionError(f"action {action_id} is {row.state}, not pending approval")
        conn.execute(
            update(actions_table)
            .where(actions_table.c.id == action_id)
            .values(state=verdict, decided_by=who, updated_at=_now())
        )
        audit.append(
            conn,
            verdict,
            {"comment": comment[:1000]},
            **_refs(row),
            actor=who,
        )


def expire(engine: Engine) -> int:
    """Expire pending approvals past their deadline (audited)."""
    now = _now()
    with engine.connect() as conn:
        rows = conn.execute(
            select(actions_table).where(
                actions_table.c.state == "pending_approval", actions_table.c.expires_at < now
            )
        ).all()
    n = 0
    for r in rows:
        with engine.begin() as conn:
            done = conn.execute(
                update(actions_table)
                .where(
                    actions_table.c.id == r.id,
                    actions_table.c.state == "pending_approval",
                )
                .values(state="expired", updated_at=now)
            ).rowcount
            if done:
                audit.append(
                    conn,
                    "expired",
                    {"expires_at": r.expires_at},
                    **_refs(r),
                )
                n += 1
    return n


def resume_node(
    engine: Engine, settings: Any, node: str, who: str, comment: str = ""
) -> dict[str, Any]:
    """Return a repaired node to service: an audited action, executed at once (not while
    paused); the port refuses nodes a person drained."""
    ensure(engine)
    check_node(node)
    cfg = config(settings)
    action = Action(
        kind="resume_node",
        disposition="execute",
        mode="act",
        job_id=None,
        incident_id="",
        default_kind="resume_node",
        reasons=("requested_by_person",),
    )
    body: dict[str, Any] = {
        "action": {**action.to_dict(), "resume": [node]},
        "comment": comment[:1000],
    }
    action_id = f"resume-{node}-{uuid.uuid4().hex[:10]}"
    now = _now()
    row = {
        "id": action_id,
        "incident_id": None,
        "job_id": None,
        "kind": "resume_node",
        "state": "ready",
        "mode": cfg.policy.mode,
        "body": json.dumps(body),
        "restarts_before": None,
        "created_at": now,
        "updated_at": now,
        "attempts": 0,
        "decided_by": who[:128],
    }
    _insert(engine, row, [("planned", body["action"])], actor=who)
    return execute(engine, settings, action_id) or {}


# ---- notifications -------------------------------------------------------------------------
def _notify(
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
        "startsAt": datetime.now(UTC).isoformat(),
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
        **_refs(r),
    )


# ---- start-up reconciliation and the retry loop -----------------------------------------------
def reconcile(engine: Engine, settings: Any, startup: bool = False) -> int:
    """Finish what is due: executing rows left by a dead process (at start-up), ready or
    approved rows whose retry time has come, plans that waited for the scheduler."""
    ensure(engine)
    expire(engine)
    now = _now()
    with engine.connect() as conn:
        rows = conn.execute(
            select(actions_table)
            .where(actions_table.c.state.in_((*RUNNABLE, "waiting_scheduler")))
            .order_by(actions_table.c.created_at)
        ).all()
    n = 0
    for r in rows:
        if r.next_attempt_at and r.next_attempt_at > now and r.state != "executing":
            continue
        if r.state == "executing" and (not startup or r.owner == OWNER):
            continue  # executing is finished here only when a dead process left it
        if r.state == "waiting_scheduler":
            body = json.loads(r.body)
            diag = Diagnosis.from_dict(
                {**body["diagnosis"], "incident_id": r.incident_id, "job_id": r.job_id}
            )
            with engine.begin() as conn:
                conn.execute(
                    actions_table.delete().where(
                        actions_table.c.id == r.id, actions_table.c.state == "waiting_scheduler"
                    )
                )
            _plan(engine, settings, r.id, diag, {"id": r.incident_id})
        else:
            if startup:
                was: dict[str, Any] = {"was": r.state}
                if r.state == "executing":
                    was["owner"] = r.owner  # the process that died holding it
                audit.record(
                    engine,
                    "reconciled",
                    was,
                    **_refs(r),
                )
            execute(engine, settings, r.id, (r.state,))
        n += 1
    try:
        accounting.update_recoveries(engine, config(settings).scheduler)
    except SchedulerError:
        pass
    return n


def start(
    engine: Engine, settings: Any, interval_s: float = 5.0, thread: bool | None = None
) -> None:
    """Reconcile once per process and engine, then keep retrying in a daemon thread
    (off when `GOODPUT_ACTIONS_THREAD=0`)."""
    with _lock:
        if engine in _running:
            return
        _running.add(engine)
    ensure(engine)
    try:
        reconcile(engine, settings, startup=True)
    except Exception:  # noqa: BLE001 - start-up must not take the receiver down
        log.exception("reconcile at start-up failed")
    if thread is None:
        thread = os.environ.get("GOODPUT_ACTIONS_THREAD", "1") not in ("0", "false")
    if not thread:
        return

    def loop() -> None:
        while True:
            time.sleep(interval_s)
            try:
                reconcile(engine, settings)
            except Exception:  # noqa: BLE001
                log.exception("action retry loop")

    threading.Thread(target=loop, name="goodput-actions", daemon=True).start()


def counts(engine: Engine) -> dict[tuple[str, str], int]:
    """(kind, state) -> number of actions: for metrics."""
    ensure(engine)
    out: dict[tuple[str, str], int] = {}
    with engine.connect() as conn:
        for r in conn.execute(select(actions_table.c.kind, actions_table.c.state)).all():
            out[(r.kind, r.state)] = out.get((r.kind, r.state), 0) + 1
    return out


__all__ = [
    "ActionError",
    "DRAINS",
    "approve",
    "execute",
    "get_action",
    "is_paused",
    "list_actions",
    "on_diagnosis",
    "reconcile",
    "reject",
    "resume_node",
    "set_paused",
    "start",
]

"""Recovery actions: plan -> (approve) -> execute -> verify -> record, crash-safe.

A final diagnosis reaches the outbox (`recovery.outbox`) in the same transaction that stores
it; `plan` decides it (`recovery.planning`), then, by mode, executes it or queues it for a
person. The outbox row's id is the idempotency key (one action per incident, `-N` when
re-planned); the scheduler port's guards (expected restart count, drained-by-whom) make a
repeated execution a no-op. `reconcile()` (at start-up in a background thread, then every few
seconds) plans every row still `planning` or `waiting_scheduler` and finishes every action
that was ready, approved or executing when a process died, against the scheduler's real state.

Settings are read from attributes of `settings` (getattr) or the environment:
`GOODPUT_MODE`, `GOODPUT_POLICY_FILE`, `GOODPUT_SCHEDULER`, `GOODPUT_SIM_URL`,
`GOODPUT_ALERTMANAGER_URL`, `GOODPUT_PROMETHEUS_URL`. Failpoints: `recovery.failpoints`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
import weakref
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests
from sqlalchemy import Connection, Engine, select, update

from recovery import (
    accounting,
    audit,
    failpoints,
    leases,
    node_health,
    outbox,
    planning,
    schema,
    watchdog,
)
from recovery.decide import Action, Diagnosis
from recovery.outbox import (
    DRAIN_STATES,
    MAX_PLANS_PER_INCIDENT,
    OPEN_STATES,
    PLANNABLE,
    REPLANNABLE,
    RUNNABLE,
    actions_table,
    enqueue,
    metadata,
    switches,
)
from recovery.planning import DRAIN_WINDOW_S, _history
from recovery.policy import DEFAULT_FILE, DRAINS, RESTARTS, Policy, load_policy
from recovery.scheduler import (
    Scheduler,
    SchedulerError,
    SchedulerUnavailable,
    from_settings,
)
from recovery.scheduler.base import check_node

log = logging.getLogger("goodput.actions")
MAX_ATTEMPTS = 50
OWNER = leases.OWNER
_running: weakref.WeakSet[Engine] = weakref.WeakSet()
_lock = threading.Lock()
_refs = outbox.refs
_public = outbox.public
_diag_dict = outbox.diag_dict


def _now(db: Engine | Connection) -> float:
    return outbox.now(db)


class ActionError(ValueError):
    """A request about an action that cannot be honoured (unknown id, wrong state)."""


class UnknownNode(ActionError):
    """The scheduler does not know the node."""


@dataclass(frozen=True)
class Config:
    policy: Policy
    scheduler: Scheduler
    alertmanager_url: str | None
    prometheus_url: str | None
    retry_base_s: float
    lease_s: float = leases.DEFAULT_S


def _setting(settings: Any, attr: str, env: str, default: str | None = None) -> str | None:
    """`settings.<attr>`, else `settings.extra[env]`, the environment, `default`; an attribute
    set to "" turns the setting off (the environment is not read: the benchmark's receiver)."""
    value = getattr(settings, attr, None)
    if value is not None:
        return str(value) or None
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
        lease_s=float(getattr(settings, "lease_s", leases.DEFAULT_S)),
    )


# ---- the pause switch ---------------------------------------------------------------------
def is_paused(engine: Engine) -> bool:
    schema.upgrade(engine)
    with engine.connect() as conn:
        row = conn.execute(select(switches.c.value).where(switches.c.name == "pause")).first()
    return bool(row and row.value == "on")


def set_paused(engine: Engine, paused: bool, who: str, reason: str = "") -> None:
    """Flip the global pause switch (audited)."""
    schema.upgrade(engine)
    value = "on" if paused else "off"

    def write(conn: Connection) -> None:
        done = conn.execute(
            update(switches)
            .where(switches.c.name == "pause")
            .values(value=value, updated_at=_now(conn), updated_by=who[:128])
        ).rowcount
        if not done:
            conn.execute(
                switches.insert().values(
                    name="pause", value=value, updated_at=_now(conn), updated_by=who[:128]
                )
            )
        audit.append(conn, "paused" if paused else "resumed", {"reason": reason[:500]}, actor=who)

    outbox.write(engine, write)


# ---- planning -------------------------------------------------------------------------------
def _insert(
    engine: Engine,
    row: dict[str, Any],
    events: list[tuple[str, dict[str, Any]]],
    actor: str = "goodput",
) -> bool:
    """Insert an outbox row and its audit events atomically; False if the key exists."""

    def write(conn: Connection) -> bool:
        if conn.execute(select(actions_table.c.id).where(actions_table.c.id == row["id"])).first():
            return False
        conn.execute(actions_table.insert().values(**row))
        for type_, payload in events:
            audit.append(conn, type_, payload, **_refs(row), actor=actor)
        return True

    return bool(outbox.write(engine, write))


def on_diagnosis(
    engine: Engine, settings: Any, incident: dict[str, Any], diagnosis: dict[str, Any]
) -> dict[str, Any] | None:
    """Enqueue (if the diagnosis' transaction has not already) and plan the action for one
    final diagnosis; by mode, execute it or queue it for approval.

    Idempotent per incident. Never raises for bad input: it is audited and None returned.
    """
    schema.upgrade(engine)
    start(engine, settings)
    action_id = outbox.write(engine, enqueue, incident, diagnosis)
    if action_id is None:
        return incident_action(engine, str(incident.get("id", diagnosis.get("incident_id", ""))))
    return plan(engine, settings, action_id)


def incident_action(engine: Engine, incident_id: str) -> dict[str, Any] | None:
    """The incident's latest action (`inc-<id>`, then `inc-<id>-2`, … when re-planned)."""
    schema.upgrade(engine)
    with engine.connect() as conn:
        row = outbox.latest(conn, str(incident_id))
    return _public(row) if row is not None else None


def plan(engine: Engine, settings: Any, action_id: str) -> dict[str, Any] | None:
    """Decide an outbox row that has no decision yet, then notify or execute as decided."""
    cfg = config(settings)
    row = outbox.raw(engine, action_id)
    if row is not None and row.state in PLANNABLE:
        body = json.loads(row.body)
        opened = (body.get("incident") or {}).get("opened_at")
        diag = Diagnosis.from_dict(
            {**body["diagnosis"], "incident_id": row.incident_id, "job_id": row.job_id}
        )
        accounting.open_incident(engine, {"opened_at": opened}, diag, cfg.prometheus_url)
    state, action, row = planning.plan_row(engine, cfg, action_id)
    if state == "waiting_scheduler":
        failpoints.hit("waiting")
    elif state == "failed" and action is None and row is not None:
        _notify(
            engine,
            cfg,
            "GoodputNeedsPerson",
            outbox.raw(engine, action_id),
            None,
            f"Goodput could not plan an action for job {row.job_id}: the scheduler kept "
            f"failing ({(row.last_error or '')[:200]})",
            "warning",
            None,
        )
    if action is None:  # not decided here: waiting, failed, or planned by another process
        return get_action(engine, action_id)
    failpoints.hit("planned")
    accounting.mark_decided(engine, str(row.incident_id), row.updated_at)
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
            row.expires_at,
        )
    elif action.kind == "hold_for_person":
        _notify(
            engine,
            cfg,
            "GoodputNeedsPerson",
            row,
            action,
            f"Goodput needs a person for job {action.job_id} "
            f"({json.loads(row.body)['diagnosis']['outcome']}): {', '.join(action.reasons)}",
            "warning",
            None,
        )
    elif state == "ready":
        return execute(engine, settings, action_id)
    return get_action(engine, action_id)


# ---- execution -----------------------------------------------------------------------------
def _claim(
    engine: Engine,
    cfg: Config,
    action_id: str,
    from_states: tuple[str, ...],
    nodes: Any,
    owner: str | None = None,
) -> tuple[Any, str | None]:
    """Move the row to `executing` (ours, leased); with its drains checked against the blast
    radius under the budget lock. An `executing` row is taken over only from `owner` (the dead
    process `reconcile` saw holding it). Returns (row or None, the limit it would break)."""

    def write(conn: Connection) -> tuple[Any, str | None]:
        planning.lock_budget(conn)
        cur = outbox.raw(conn, action_id)
        if cur is None or cur.state not in from_states:
            return None, None
        if cur.state == "executing" and (owner is None or cur.owner != owner):
            return None, None  # its owner lives, or another receiver took it over first
        if nodes is not None and cur.state != "executing":
            why = planning.budget_violation(conn, cur, nodes, cfg.policy)
            if why is not None:
                return cur, str(why)
        n = conn.execute(
            update(actions_table)
            .where(actions_table.c.id == action_id, actions_table.c.state.in_(from_states))
            .values(
                state="executing",
                owner=OWNER,
                lease_until=_now(conn) + cfg.lease_s,
                updated_at=_now(conn),
                attempts=actions_table.c.attempts + 1,
            )
        ).rowcount
        if not n:
            return None, None
        row = outbox.raw(conn, action_id)
        audit.append(conn, "executing", {"attempt": row.attempts}, **_refs(row))
        return row, None

    result: tuple[Any, str | None] = outbox.write(engine, write)
    return result


def _finish(
    engine: Engine, row: Any, state: str, type_: str, payload: dict[str, Any], **values: Any
) -> None:
    """Record a step's outcome with its audit event (again after a lost audit-seq race)."""

    def write(conn: Connection) -> None:
        conn.execute(
            update(actions_table)
            .where(actions_table.c.id == row.id)
            .values(state=state, updated_at=_now(conn), **values)
        )
        audit.append(conn, type_, payload, **_refs(row))

    outbox.write(engine, write)


def _retry_or_fail(engine: Engine, cfg: Config, row: Any, exc: Exception, steps: list[str]) -> None:
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
            next_attempt_at=_now(engine) + delay,
        )
        return
    _finish(
        engine, row, "failed", "failed", {"error": str(exc), "steps": steps}, last_error=str(exc)
    )
    _notify(
        engine,
        cfg,
        "GoodputNeedsPerson",
        _raw(engine, row.id),
        None,
        f"Goodput's {row.kind} for job {row.job_id} failed: {str(exc)[:300]}",
        "warning",
        None,
    )


def execute(
    engine: Engine,
    settings: Any,
    action_id: str,
    from_states: tuple[str, ...] = ("ready", "approved"),
    owner: str | None = None,
) -> dict[str, Any] | None:
    """Execute one ready or approved action (a no-op if someone else holds it), or finish an
    executing one that `owner`, a dead process, left."""
    schema.upgrade(engine)
    cfg = config(settings)
    if is_paused(engine):
        r = _raw(engine, action_id)
        if r is not None and r.state in from_states:
            _finish(engine, r, "skipped", "skipped", {"reason": "paused"})
        return get_action(engine, action_id)
    # fail-open: while the watchdog does not act, ready and approved actions wait; one a dead
    # process left executing is finished (a drained node without its requeue helps nobody)
    if "executing" not in from_states and watchdog.current(engine) != watchdog.OK:
        return get_action(engine, action_id)
    r = _raw(engine, action_id)
    if r is None or r.state not in from_states:
        return get_action(engine, action_id)
    sched = cfg.scheduler
    action = json.loads(r.body)["action"]
    nodes = None
    if action.get("nodes") and r.state != "executing":
        try:  # the blast radius is checked again with the nodes as they are now
            nodes = sched.node_states()
        except SchedulerError as exc:
            row, _ = _claim(engine, cfg, action_id, from_states, None, owner)
            if row is not None:
                _retry_or_fail(engine, cfg, row, exc, [])
            return get_action(engine, action_id)
    row, over = _claim(engine, cfg, action_id, from_states, nodes, owner)
    if row is None:
        return get_action(engine, action_id)
    if over is not None:
        _finish(
            engine,
            row,
            "failed",
            "failed",
            {"error": f"blast radius: {over}", "steps": []},
            last_error=f"blast radius: {over}",
        )
        _notify(
            engine,
            cfg,
            "GoodputNeedsPerson",
            _raw(engine, action_id),
            None,
            f"Goodput did not {row.kind} for job {row.job_id}: it would break the blast "
            f"radius ({over}) now",
            "warning",
            None,
        )
        return get_action(engine, action_id)
    failpoints.hit("claimed")
    body = json.loads(row.body)
    steps: list[str] = []
    outcome = body.get("diagnosis", {}).get("outcome", "")
    capture = cfg.policy.return_to_service.capture
    try:
        for node in action.get("nodes", []):
            if capture is not None:
                _capture(engine, sched, row, capture, node)
            reason = f"goodput: {outcome} incident {row.incident_id} action {row.id}"
            steps.append(sched.drain(node, reason).detail)
        if action.get("nodes"):
            failpoints.hit("drained")
        kind = row.kind
        if kind in RESTARTS:
            steps.append(
                sched.requeue(
                    row.job_id,
                    tuple(action.get("exclude", [])),
                    expected_restarts=row.restarts_before,
                    delay_s=float(action.get("delay_s", 0.0)),
                    drop=tuple(action.get("exclusions_dropped", [])),
                ).detail
            )
        elif kind == "stop" and row.job_id:
            steps.append(sched.stop(row.job_id, expected_restarts=row.restarts_before).detail)
        elif kind == "resume_node":
            for node in action.get("resume", []):
                steps.append(sched.resume(node).detail)
    except (SchedulerError, ValueError) as exc:  # GuardRefused, SchedulerUnavailable included
        _retry_or_fail(engine, cfg, row, exc, steps)
        return get_action(engine, action_id)
    failpoints.hit("executed")
    result = {"steps": steps, "verified": _verify(sched, row, action)}
    _finish(engine, row, "executed", "executed", result, result=json.dumps(result))
    failpoints.hit("finished")
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


def _capture(engine: Engine, sched: Scheduler, row: Any, cmd: Any, node: str) -> None:
    """Diagnostics before Goodput touches the node (e.g. nvidia-bug-report.sh, dmesg): run once,
    before the first drain, bounded in time and size; kept in the audit log with the action."""
    state = sched.node_state(node)
    if state is None or state.drained:
        return  # a retry, or someone drained it already: it was captured, or is not ours
    result = node_health.run(cmd, node, level="capture")
    payload = {
        "node": node,
        "argv": list(cmd.argv),
        "exit_code": result.exit_code,
        "duration_s": round(result.duration_s, 3),
        "output": result.output,
    }
    audit.record(engine, "diagnostics_captured", payload, **outbox.refs(row))


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
    return outbox.raw(engine, action_id)


def get_action(engine: Engine, action_id: str) -> dict[str, Any] | None:
    schema.upgrade(engine)
    r = _raw(engine, action_id)
    return _public(r) if r else None


def list_actions(
    engine: Engine, state: str | None = None, job_id: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    schema.upgrade(engine)
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
    """Approve a pending action (recording who) and execute it. The blast radius is checked
    again first, with every other reserved drain and the nodes as the scheduler shows them."""
    schema.upgrade(engine)
    cfg = config(settings)
    row = _raw(engine, action_id)
    nodes = None
    if row is not None and json.loads(row.body).get("action", {}).get("nodes"):
        try:
            nodes = cfg.scheduler.node_states()
        except SchedulerError:
            nodes = None  # checked again at execution, which waits for the scheduler
    _decide_pending(engine, action_id, who, "approved", comment, (cfg.policy, nodes))
    failpoints.hit("approved")
    return execute(engine, settings, action_id, ("approved",)) or {}


def reject(engine: Engine, action_id: str, who: str, comment: str = "") -> dict[str, Any]:
    _decide_pending(engine, action_id, who, "rejected", comment)
    return get_action(engine, action_id) or {}


def _decide_pending(
    engine: Engine,
    action_id: str,
    who: str,
    verdict: str,
    comment: str,
    budget: tuple[Policy, Any] | None = None,
) -> None:
    schema.upgrade(engine)
    expire(engine)
    if not who or len(who) > 128:
        raise ActionError("who must be a non-empty name of at most 128 characters")

    def write(conn: Connection) -> None:
        if budget is not None:
            planning.lock_budget(conn)
        row = conn.execute(select(actions_table).where(actions_table.c.id == action_id)).first()
        if row is None:
            raise ActionError(f"no action {action_id}")
        if row.state != "pending_approval":
            raise ActionError(f"action {action_id} is {row.state}, not pending approval")
        if budget is not None and budget[1] is not None:
            why = planning.budget_violation(conn, row, budget[1], budget[0])
            if why is not None:
                raise ActionError(
                    f"approving {action_id} now would break the blast radius ({why}); "
                    "it stays pending"
                )
        conn.execute(
            update(actions_table)
            .where(actions_table.c.id == action_id)
            .values(state=verdict, decided_by=who, updated_at=_now(conn))
        )
        audit.append(conn, verdict, {"comment": comment[:1000]}, **_refs(row), actor=who)

    outbox.write(engine, write)


def expire(engine: Engine) -> int:
    """Expire pending approvals past their deadline (audited)."""
    now = _now(engine)
    with engine.connect() as conn:
        rows = conn.execute(
            select(actions_table).where(
                actions_table.c.state == "pending_approval", actions_table.c.expires_at < now
            )
        ).all()

    def write(conn: Connection, r: Any) -> int:
        done = conn.execute(
            update(actions_table)
            .where(actions_table.c.id == r.id, actions_table.c.state == "pending_approval")
            .values(state="expired", updated_at=now)
        ).rowcount
        if done:
            audit.append(conn, "expired", {"expires_at": r.expires_at}, **_refs(r))
        return int(done)

    return sum(outbox.write(engine, write, r) for r in rows)


def resume_node(
    engine: Engine, settings: Any, node: str, who: str, comment: str = ""
) -> dict[str, Any]:
    """Return a repaired node to service: an audited action, executed at once (not while
    paused); the port refuses nodes a person drained. `UnknownNode` if the scheduler does not
    know the node (nothing is recorded); an unreachable scheduler leaves the action retried."""
    schema.upgrade(engine)
    check_node(node)
    cfg = config(settings)
    try:
        known = [n.node for n in cfg.scheduler.node_states()]
    except SchedulerError:
        known = None
    if known is not None and node not in known:
        raise UnknownNode(f"node {node} is unknown to the scheduler")
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
    now = _now(engine)
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
        "startsAt": datetime.fromtimestamp(_now(engine), UTC).isoformat(),
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
    """Finish what is due: rows with no plan yet (a final diagnosis whose planner died, or one
    waiting for the scheduler), executing rows left by a dead process (`orphaned`), ready or
    approved rows whose retry time has come."""
    schema.upgrade(engine)
    expire(engine)
    now = _now(engine)
    single = engine.dialect.name == "sqlite"
    with engine.connect() as conn:
        rows = conn.execute(
            select(actions_table)
            .where(actions_table.c.state.in_((*RUNNABLE, *PLANNABLE)))
            .order_by(actions_table.c.created_at)
        ).all()
    n = 0
    for r in rows:
        if r.next_attempt_at and r.next_attempt_at > now and r.state != "executing":
            continue
        if r.state == "executing" and not orphaned(r, now, startup, single):
            continue  # executing is finished here only when a dead process left it
        if r.state in PLANNABLE:
            plan(engine, settings, r.id)  # in place: the row is never absent
        else:
            if startup or r.state == "executing":  # a restart, or a dead owner's lease
                was: dict[str, Any] = {"was": r.state}
                if r.state == "executing":
                    was["owner"] = r.owner  # the process that died holding it
                audit.record(
                    engine,
                    "reconciled",
                    was,
                    **_refs(r),
                )
            execute(engine, settings, r.id, (r.state,), r.owner)
        n += 1
    try:
        accounting.update_recoveries(engine, config(settings).scheduler)
    except SchedulerError:
        pass
    return n


def orphaned(row: Any, now: float, startup: bool, single: bool) -> bool:
    """Is this executing row left by a dead process? Yes once its owner's lease has expired
    (receivers in HA: the owner stopped renewing it), and at start-up when the row has no
    lease or the store has one receiver only (SQLite): the process that held it is gone."""
    if row.state != "executing" or row.owner == OWNER:
        return False
    if row.lease_until is not None and row.lease_until < now:
        return True
    return startup and (row.lease_until is None or single)


def start(
    engine: Engine, settings: Any, interval_s: float = 5.0, thread: bool | None = None
) -> None:
    """Once per process and engine: reconcile at start-up, then keep retrying every
    `interval_s`, in a daemon thread (so the receiver serves at once, whatever the scheduler
    does), or once in the caller when the thread is off (`GOODPUT_ACTIONS_THREAD=0`, in the
    environment or `settings.extra`; then the caller runs `reconcile`, the loop's one pass)."""
    with _lock:
        if engine in _running:
            return
        _running.add(engine)
    schema.upgrade(engine)
    if thread is None:
        flag = _setting(settings, "actions_thread", "GOODPUT_ACTIONS_THREAD", "1")
        thread = flag not in ("0", "false")

    def startup() -> None:
        try:
            reconcile(engine, settings, startup=True)
        except Exception:  # noqa: BLE001 - start-up must not take the receiver down
            log.exception("reconcile at start-up failed")

    if not thread:
        startup()
        return

    leases.start(engine, float(getattr(settings, "lease_s", leases.DEFAULT_S)))

    def loop() -> None:
        startup()
        while True:
            time.sleep(interval_s)
            try:
                reconcile(engine, settings)
            except Exception:  # noqa: BLE001
                log.exception("action retry loop")

    threading.Thread(target=loop, name="goodput-actions", daemon=True).start()


def counts(engine: Engine) -> dict[tuple[str, str], int]:
    """(kind, state) -> number of actions: for metrics."""
    schema.upgrade(engine)
    out: dict[tuple[str, str], int] = {}
    with engine.connect() as conn:
        for r in conn.execute(select(actions_table.c.kind, actions_table.c.state)).all():
            out[(r.kind, r.state)] = out.get((r.kind, r.state), 0) + 1
    return out


__all__ = [
    "DRAINS",
    "DRAIN_STATES",
    "DRAIN_WINDOW_S",
    "MAX_PLANS_PER_INCIDENT",
    "OPEN_STATES",
    "REPLANNABLE",
    "ActionError",
    "UnknownNode",
    "_history",
    "actions_table",
    "approve",
    "enqueue",
    "execute",
    "get_action",
    "is_paused",
    "list_actions",
    "metadata",
    "on_diagnosis",
    "plan",
    "reconcile",
    "reject",
    "resume_node",
    "set_paused",
    "start",
]

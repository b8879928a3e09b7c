"""The executor: a planned outbox row carried out in the scheduler, crash-safe.

`plan` decides a row (`recovery.planning`) and, by what was decided, tells on-call
(`recovery.notifier`) or `execute`s it: claim the row (`executing`, leased, its drains checked
against the blast radius under the budget lock), capture diagnostics, drain, requeue or stop,
verify, record. The row's id is the idempotency key and the scheduler port's guards (expected
restart count, drained-by-whom) make a repeated step a no-op, so a row a dead process left
`executing` is finished by running it again (`recovery.reconciler`), paused or not, once its
lease expired; each write is conditional on the row as this process read or claimed it, so a
late owner records nothing. Failpoints: `recovery.failpoints`.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, and_, false, or_, update

from recovery import (
    accounting,
    audit,
    failpoints,
    leases,
    node_health,
    outbox,
    planning,
    watchdog,
)
from recovery.action_config import Config, config, is_paused, retry_delay
from recovery.decide import Diagnosis
from recovery.notifier import notify
from recovery.outbox import PLANNABLE, actions_table, get_action
from recovery.policy import MODES, RESTARTS, narrower
from recovery.scheduler import Scheduler, SchedulerError, SchedulerUnavailable

log = logging.getLogger("goodput.actions")
MAX_ATTEMPTS = 50
ONE_RECEIVER = ("sqlite",)  # stores one receiver serves (`reconciler.orphaned`)


def _needs_person(engine: Engine, cfg: Config, action_id: str, text: str) -> None:
    """Tell on-call that a person must look at the action (as it is now in the store)."""
    notify(
        engine,
        cfg,
        "GoodputNeedsPerson",
        outbox.raw(engine, action_id),
        None,
        text,
        "warning",
        None,
    )


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
        _needs_person(
            engine,
            cfg,
            action_id,
            f"Goodput could not plan an action for job {row.job_id}: the scheduler kept "
            f"failing ({(row.last_error or '')[:200]})",
        )
    if action is None:  # not decided here: waiting, failed, or planned by another process
        return get_action(engine, action_id)
    failpoints.hit("planned")
    accounting.mark_decided(engine, str(row.incident_id), row.updated_at)
    if state == "pending_approval":
        notify(
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
        notify(
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


def _as_read(row: Any) -> list[Any]:
    """SQL: the row is still as this process read (or claimed) it: its state and owner."""
    t = actions_table.c
    return [t.id == row.id, t.state == row.state, t.owner.is_not_distinct_from(row.owner)]


def _orphan(conn: Connection, owner: str | None) -> Any:
    """SQL: an `executing` row this process may take over: held by `owner` (the process
    `reconcile` saw holding it) with no live lease (expired, or none), or by this process, or
    on a store one receiver serves (SQLite: another owner is a dead one). Checked in the
    claim's UPDATE: the reconciler's read can be old, and an owner that renewed since lives."""
    t = actions_table.c
    if owner is None:
        return false()
    if owner == leases.OWNER or conn.dialect.name in ONE_RECEIVER:
        return t.owner == owner
    return and_(t.owner == owner, or_(t.lease_until.is_(None), t.lease_until < outbox.now(conn)))


def _claim(
    engine: Engine,
    cfg: Config,
    action_id: str,
    from_states: tuple[str, ...],
    nodes: Any,
    owner: str | None = None,
    reconciled: dict[str, Any] | None = None,
) -> tuple[Any, str | None]:
    """Move the row to `executing` (ours, leased); with its drains checked against the blast
    radius under the budget lock. An `executing` row is taken over only from `owner` once its
    lease expired (`_orphan`); `reconciled` (the reconciler's note of what it found) is audited
    with the claim, so a takeover refused leaves no record of one. Returns (row or None, the
    limit it would break)."""

    def write(conn: Connection) -> tuple[Any, str | None]:
        planning.lock_budget(conn)
        cur = outbox.raw(conn, action_id)
        if cur is None or cur.state not in from_states:
            return None, None
        if nodes is not None and cur.state != "executing":
            why = planning.budget_violation(conn, cur, nodes, cfg.policy)
            if why is not None:
                return cur, str(why)
        takeover = [_orphan(conn, owner)] if cur.state == "executing" else []
        n = conn.execute(
            update(actions_table)
            .where(*_as_read(cur), *takeover)
            .values(
                state="executing",
                owner=leases.OWNER,
                lease_until=outbox.now(conn) + cfg.lease_s,
                updated_at=outbox.now(conn),
                attempts=actions_table.c.attempts + 1,
            )
        ).rowcount
        if not n:
            if takeover:
                log.info("action %s: %s holds it (a live lease): left to it", action_id, cur.owner)
            return None, None
        row = outbox.raw(conn, action_id)
        if reconciled is not None:
            audit.append(conn, "reconciled", reconciled, **outbox.refs(row))
        audit.append(conn, "executing", {"attempt": row.attempts}, **outbox.refs(row))
        return row, None

    result: tuple[Any, str | None] = outbox.write(engine, write)
    return result


def mode_now(policy: Any, row: Any) -> str:
    """The row's mode narrowed by the policy as it is now: an operator who turned Goodput
    back to monitor or approve after the action was planned is obeyed (never widened)."""
    parts = json.loads(row.body).get("action", {}).get("partitions") or []
    now = policy.mode_for(",".join(parts))
    return narrower(row.mode, now) if row.mode in MODES else now


def _narrowed(engine: Engine, cfg: Config, row: Any) -> bool:
    """A ready or approved row of the policy's whose mode is narrower now: skipped (monitor),
    or waiting for approval (a `ready` one, now approve); a person's own request (a node
    returned to service) runs in any mode. True when it was not executed for it."""
    action = json.loads(row.body).get("action", {})
    if "requested_by_person" in (action.get("reasons") or []):
        return False
    mode = mode_now(cfg.policy, row)
    if mode == "monitor":
        _finish(engine, row, "skipped", "skipped", {"reason": "mode_monitor", "mode": mode})
        return True
    if mode == "approve" and row.state == "ready":
        expires = outbox.now(engine) + cfg.policy.approval_expiry_s
        payload = {"reason": "mode_approve", "expires_at": expires}
        _finish(engine, row, "pending_approval", "pending_approval", payload, expires_at=expires)
        return True
    return False


def _finish(
    engine: Engine, row: Any, state: str, type_: str, payload: dict[str, Any], **values: Any
) -> bool:
    """Record a step's outcome with its audit event (again after a lost audit-seq race) while
    the row is as this process read or claimed it; False (logged) when it moved on: a late
    owner whose row was taken over records nothing over the winner's outcome."""

    def write(conn: Connection) -> bool:
        n = conn.execute(
            update(actions_table)
            .where(*_as_read(row))
            .values(state=state, updated_at=outbox.now(conn), **values)
        ).rowcount
        if n:
            audit.append(conn, type_, payload, **outbox.refs(row))
        return bool(n)

    done = bool(outbox.write(engine, write))
    if not done:
        log.warning("action %s moved on (taken over?): its %s not recorded", row.id, type_)
    return done


def _retry_or_fail(
    engine: Engine,
    cfg: Config,
    row: Any,
    exc: Exception,
    steps: list[str],
    drained: tuple[str, ...] = (),
) -> None:
    """Try again later (the scheduler unreachable), or fail the row, recording what it did
    before it failed: the nodes it drained and whether its job restarted (the blast radius
    and the retry budget count them as done)."""
    if isinstance(exc, SchedulerUnavailable) and row.attempts < MAX_ATTEMPTS:
        back = outbox.runnable_state(row)
        delay = retry_delay(cfg, exc, row.attempts)
        _finish(
            engine,
            row,
            back,
            "retry_scheduled",
            {"error": str(exc), "steps": steps, "retry_in_s": delay},
            last_error=str(exc),
            next_attempt_at=outbox.now(engine) + delay,
        )
        return
    done = {"steps": steps, "drained": list(drained), "restarted": _restarted(cfg, row)}
    payload = {"error": str(exc), **done}
    if not _finish(
        engine, row, "failed", "failed", payload, last_error=str(exc), result=json.dumps(done)
    ):
        return
    _needs_person(
        engine,
        cfg,
        row.id,
        f"Goodput's {row.kind} for job {row.job_id} failed: {str(exc)[:300]}",
    )


# The actions this process is executing now (id -> callers). An `executing` row this process
# owns but holds no more (a store error escaped mid-way) is an orphan like a dead process's:
# its lease, renewed by this process's heartbeat, would otherwise keep it executing for good.
_in_hand: Counter[str] = Counter()
_in_hand_lock = threading.Lock()


def _restarted(cfg: Config, row: Any) -> bool:
    """Whether a failed restart's job restarted all the same (a requeue Slurm carried out but
    did not show in time): its restart count moved past the plan's."""
    if row.kind not in RESTARTS or not row.job_id or row.restarts_before is None:
        return False
    try:
        job = cfg.scheduler.job_state(row.job_id)
    except SchedulerError:
        return False  # unknown: the budget counts what it knows
    return job is not None and job.restarts > row.restarts_before


def in_hand(action_id: str) -> bool:
    with _in_hand_lock:
        return _in_hand[action_id] > 0


@contextmanager
def _holding(action_id: str) -> Iterator[None]:
    with _in_hand_lock:
        _in_hand[action_id] += 1
    try:
        yield
    finally:
        with _in_hand_lock:
            _in_hand[action_id] -= 1
            if _in_hand[action_id] <= 0:
                del _in_hand[action_id]


def execute(
    engine: Engine,
    settings: Any,
    action_id: str,
    from_states: tuple[str, ...] = ("ready", "approved"),
    owner: str | None = None,
    reconciled: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Execute one ready or approved action (a no-op if someone else holds it), or finish an
    executing one that `owner`, a dead process, left (`reconciled`: audited with the claim)."""
    with _holding(action_id):
        return _execute(engine, settings, action_id, from_states, owner, reconciled)


def _execute(
    engine: Engine,
    settings: Any,
    action_id: str,
    from_states: tuple[str, ...],
    owner: str | None,
    reconciled: dict[str, Any] | None,
) -> dict[str, Any] | None:
    cfg = config(settings)
    r = outbox.raw(engine, action_id)
    if r is None or r.state not in from_states:
        return get_action(engine, action_id)
    # paused, ready and approved actions are skipped; while the watchdog does not act, they
    # wait. One a dead process left executing is finished either way: a step of it may be done
    # (a drained node without its requeue, a job left held helps nobody)
    if r.state != "executing" and is_paused(engine):
        _finish(engine, r, "skipped", "skipped", {"reason": "paused"})
        return get_action(engine, action_id)
    if r.state != "executing" and watchdog.current(engine) != watchdog.OK:
        return get_action(engine, action_id)
    if r.state != "executing" and _narrowed(engine, cfg, r):
        return get_action(engine, action_id)
    sched = cfg.scheduler
    action = json.loads(r.body)["action"]
    nodes = None
    if action.get("nodes") and r.state != "executing":
        try:  # the blast radius is checked again with the nodes as they are now
            nodes = sched.node_states()
        except SchedulerError as exc:
            row, _ = _claim(engine, cfg, action_id, from_states, None, owner, reconciled)
            if row is not None:
                _retry_or_fail(engine, cfg, row, exc, [])
            return get_action(engine, action_id)
    row, over = _claim(engine, cfg, action_id, from_states, nodes, owner, reconciled)
    if row is None:
        return get_action(engine, action_id)
    if over is not None:
        why = f"blast radius: {over}"
        if not _finish(
            engine, row, "failed", "failed", {"error": why, "steps": []}, last_error=why
        ):
            return get_action(engine, action_id)
        _needs_person(
            engine,
            cfg,
            action_id,
            f"Goodput did not {row.kind} for job {row.job_id}: it would break the blast "
            f"radius ({over}) now",
        )
        return get_action(engine, action_id)
    failpoints.hit("claimed")
    body = json.loads(row.body)
    steps: list[str] = []
    drained: list[str] = []
    job_op = None  # the job's step: its restart count after, for `controller_restart`
    outcome = body.get("diagnosis", {}).get("outcome", "")
    capture = cfg.policy.return_to_service.capture
    try:
        for node in action.get("nodes", []):
            if capture is not None:
                _capture(engine, sched, row, capture, node)
            reason = f"goodput: {outcome} incident {row.incident_id} action {row.id}"
            op = sched.drain(node, reason)
            steps.append(op.detail)
            drained += [node] if op.changed else []
        if action.get("nodes"):
            failpoints.hit("drained")
        kind = row.kind
        if kind in RESTARTS:
            job_op = sched.requeue(
                row.job_id,
                tuple(action.get("exclude", [])),
                expected_restarts=row.restarts_before,
                delay_s=float(action.get("delay_s", 0.0)),
                drop=tuple(action.get("exclusions_dropped", [])),
            )
        elif kind == "stop" and row.job_id:
            job_op = sched.stop(row.job_id, expected_restarts=row.restarts_before)
        elif kind == "resume_node":
            for node in action.get("resume", []):
                steps.append(sched.resume(node).detail)
        if job_op is not None:
            steps.append(job_op.detail)
    except (SchedulerError, ValueError) as exc:  # GuardRefused, SchedulerUnavailable included
        _retry_or_fail(engine, cfg, row, exc, steps, tuple(drained))
        return get_action(engine, action_id)
    failpoints.hit("executed")
    result: dict[str, Any] = {"steps": steps, "verified": _verify(sched, row, action)}
    if job_op is not None and job_op.restarts is not None:
        result["restarts_after"] = job_op.restarts
    if row.kind in RESTARTS and job_op is not None:  # not one when the job was requeued
        # already (by Slurm, a person, another incident's action) or only pending: the retry
        # budget counts this job's restarts, not Goodput's actions
        after, before = job_op.restarts, row.restarts_before
        result["restarted"] = job_op.changed and (None in (after, before) or after > before)
    done = _finish(engine, row, "executed", "executed", result, result=json.dumps(result))
    failpoints.hit("finished")
    if done and row.kind == "stop":
        notify(
            engine,
            cfg,
            "GoodputJobStopped",
            outbox.raw(engine, action_id),
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

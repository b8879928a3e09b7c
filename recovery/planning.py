"""Planning an outbox row, and the blast-radius budget that planning, approval and execution share.

`plan_row` reads the scheduler (outside any transaction), then decides and writes the plan in
one transaction that holds the budget lock, so two planners (threads, or receivers on one
PostgreSQL) never both spend the same budget. A drain is counted from the moment it is planned
(`pending_approval`, `ready`, `approved`, `executing`: reserved) until it is given up, and
`budget_violation` checks the same limits again when a person approves and when it executes.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from typing import Any

from sqlalchemy import Connection, Engine, select, update

from recovery import audit, outbox, watchdog
from recovery.action_config import retry_delay
from recovery.decide import (
    Action,
    Diagnosis,
    History,
    JobView,
    NodeView,
    Reason,
    blast_radius_violation,
    decide,
)
from recovery.directives import check_bounds, merge, parse_directive
from recovery.outbox import actions_table, switches
from recovery.policy import RESTARTS, Policy
from recovery.scheduler import SchedulerError, SchedulerUnavailable

# decide() counts drains in the hour before `now` (blast_radius_violation); older ones are not read.
DRAIN_WINDOW_S = 3600.0
MAX_PLAN_ATTEMPTS = 50


def lock_budget(conn: Connection) -> None:
    """Take the budget lock for the rest of `conn`'s transaction: a write to one row, so
    SQLite's writer lock or PostgreSQL's row lock serialises every budget decision."""
    conn.execute(
        update(switches).where(switches.c.name == "budget").values(updated_at=outbox.now(conn))
    )


def _paused(conn: Connection) -> bool:
    row = conn.execute(select(switches.c.value).where(switches.c.name == "pause")).first()
    return bool(row and row.value == "on")


def _history(
    db: Engine | Connection,
    cfg: Any,
    diag: Diagnosis,
    job: Any,
    nodes: list[Any],
    exclude_id: str | None = None,
) -> History:
    """What decide needs from the outbox: the job's restarts by Goodput (all of them: the retry
    budget is per job), the drains done or reserved in the last hour, and the nodes reserved by
    other open plans (the blast radius). A restart action counts where its job restarted (not
    one that found it requeued already; a failed one whose requeue Slurm carried out all the
    same), a drain where it drained (a failed row's drains done before its failure too)."""
    now = outbox.now(db)
    t = actions_table.c
    ctx = db.connect() if isinstance(db, Engine) else nullcontext(db)
    with ctx as conn:
        restart_rows = conn.execute(
            select(t.state, t.body, t.result)
            .where(
                t.job_id == diag.job_id,
                t.state.in_(("executed", "failed")),
                t.kind.in_(RESTARTS),
            )
            .order_by(t.created_at, t.id)
        ).all()
        # drains by when they ran, open plans whatever their age (an approval an hour late, a
        # scheduler outage); no upper bound: another receiver's clock may run ahead
        drains = conn.execute(
            select(t.id, t.state, t.updated_at, t.body, t.result).where(
                (t.state.in_(outbox.RESERVING))
                | (t.state.in_(("executed", "failed")) & (t.updated_at > now - DRAIN_WINDOW_S))
            )
        ).all()
        paused = _paused(conn)
        not_acting = watchdog.reason_in(conn)
    if not_acting == watchdog.OK or (not_acting == "scheduler_unreachable" and nodes):
        not_acting = ""  # the scheduler just answered this planner: it is reachable
    done = [r for r in restart_rows if _result(r).get("restarted", r.state == "executed")]
    bodies = [json.loads(r.body) for r in done]
    same = sum(1 for b in bodies if b.get("cause_key") == diag.cause_key)
    # every node an earlier restart excluded, in the order it was first excluded (oldest first)
    excluded_before = dict.fromkeys(
        n
        for r in restart_rows
        if r.state == "executed" or r in done
        for n in json.loads(r.body).get("action", {}).get("exclude", [])
    )
    drain_times: list[float] = []
    reserved: set[str] = set()
    for r in drains:
        if r.id == exclude_id:
            continue
        drain = json.loads(r.body).get("action", {}).get("nodes", [])
        if r.state == "failed":
            drain = _result(r).get("drained") or []
        if r.state in outbox.RESERVING:  # due to drain: it counts as of now
            reserved.update(drain)
        drain_times += [r.updated_at if r.state == "executed" else now] * len(drain)
    jv = None
    if job is not None:
        jv = JobView(
            job.state,
            job.restarts,
            job.exit_code,
            job.partition,
            job.start_time,
            node_count=job.node_count or len(job.nodes),
            end_time=job.end_time,
            nodes=tuple(job.nodes),
        )
    return History(
        now=now,
        job=jv,
        restarts_done=len(done),
        same_cause_restarts=same,
        drain_times=tuple(drain_times),
        nodes=tuple(NodeView(n.node, n.state, n.partitions) for n in nodes),
        paused=paused,
        reserved=tuple(sorted(reserved)),
        excluded_before=tuple(excluded_before),
        not_acting=not_acting,
    )


def _result(row: Any) -> dict[str, Any]:
    """An executed or failed row's result (what it did); {} when there is none."""
    try:
        found = json.loads(row.result or "{}")
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def budget_violation(conn: Connection, row: Any, nodes: list[Any], policy: Policy) -> Reason | None:
    """Would draining this row's nodes now break a blast-radius limit, counting every other
    reserved drain? Call it holding `lock_budget`."""
    drain = tuple(json.loads(row.body).get("action", {}).get("nodes", []))
    if not drain:
        return None
    diag = Diagnosis(str(row.incident_id or ""), row.job_id, "unknown", affected_nodes=drain)
    history = _history(conn, None, diag, None, nodes, exclude_id=row.id)
    why, _new = blast_radius_violation(drain, history, policy)
    return why


def _scheduler_failed(
    engine: Engine, row: Any, cfg: Any, exc: SchedulerError
) -> tuple[str, dict[str, Any]]:
    """The row waits for the scheduler (retried with backoff) or, past the budget, fails."""
    attempts = int(row.attempts or 0) + 1
    kind = "unreachable" if isinstance(exc, SchedulerUnavailable) else "error"
    if attempts >= MAX_PLAN_ATTEMPTS:
        state, event = "failed", "failed"
        payload: dict[str, Any] = {"error": f"scheduler {kind} while planning: {exc}"}
        values: dict[str, Any] = {}
    else:
        delay = retry_delay(cfg, exc, attempts - 1)  # the first retry after the base delay
        state, event = "waiting_scheduler", "retry_scheduled"
        payload = {"reason": f"scheduler {kind} while planning: {exc}", "retry_in_s": delay}
        values = {"next_attempt_at": outbox.now(engine) + delay}

    def write(conn: Connection) -> None:
        done = conn.execute(
            update(actions_table)
            .where(actions_table.c.id == row.id, actions_table.c.state.in_(outbox.PLANNABLE))
            .values(
                state=state,
                mode=cfg.policy.mode,
                attempts=attempts,
                last_error=str(exc)[:2000],
                updated_at=outbox.now(conn),
                **values,
            )
        ).rowcount
        if done:
            audit.append(conn, event, payload, **outbox.refs(row))

    outbox.write(engine, write)
    return state, payload


def plan_row(engine: Engine, cfg: Any, action_id: str) -> tuple[str, Action | None, Any]:
    """Decide the plan of a `planning`/`waiting_scheduler` row and commit it.

    Returns (state, action, row): the state the row is in afterwards (unchanged when another
    process planned it first, or a newer diagnosis replaced the one read here: its enqueuer
    plans it), the Action decided here (None if not decided here), the row.
    """
    row = outbox.raw(engine, action_id)
    if row is None or row.state not in outbox.PLANNABLE:
        return (row.state if row is not None else "missing"), None, row
    body = json.loads(row.body)
    diag = Diagnosis.from_dict(
        {**body["diagnosis"], "incident_id": row.incident_id, "job_id": row.job_id}
    )
    try:
        job = cfg.scheduler.job_state(diag.job_id) if diag.job_id else None
        nodes = cfg.scheduler.node_states()
    except SchedulerError as exc:  # unreachable, or an error: retried, audited either way
        state, _ = _scheduler_failed(engine, row, cfg, exc)
        return state, None, row
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

    def write(conn: Connection) -> tuple[str, Action | None]:
        lock_budget(conn)
        cur = outbox.raw(conn, action_id)
        if cur is None or cur.state not in outbox.PLANNABLE:
            return (cur.state if cur is not None else "missing"), None
        if cur.body != row.body:  # a newer diagnosis came meanwhile: its own planning decides
            return cur.state, None
        action = decide(diag, _history(conn, cfg, diag, job, nodes, exclude_id=action_id), policy)
        state = {
            "execute": "ready",
            "await_approval": "pending_approval",
            "plan_only": "planned_only",
        }.get(action.disposition, "no_action")
        now = outbox.now(conn)
        values: dict[str, Any] = {
            "kind": action.kind,
            "state": state,
            "mode": action.mode,
            "body": json.dumps({**body, "action": action.to_dict()}, default=str),
            "restarts_before": job.restarts if job else None,
            "updated_at": now,
            "next_attempt_at": None,
            "last_error": None,
            "attempts": 0,
        }
        if state == "pending_approval":
            values["expires_at"] = now + policy.approval_expiry_s
        conn.execute(update(actions_table).where(actions_table.c.id == action_id).values(**values))
        for type_, payload in [
            *events,
            ("planned", {**action.to_dict(), "state": state}),
            *(
                [("pending_approval", {"expires_at": values["expires_at"]})]
                if "expires_at" in values
                else []
            ),
        ]:
            audit.append(conn, type_, payload, **outbox.refs(cur))
        return state, action

    state, action = outbox.write(engine, write)
    return state, action, outbox.raw(engine, action_id)

"""After the scheduler's controller restarts: apply again what it forgot.

slurmctld writes its state to disk at most every 5 s (`SAVE_MAX_WAIT` in Slurm's
state_save.c), so a controller that dies (SIGKILL, the OOM killer, a lost host; a backup taking
over reads the same files) comes back without the changes of its last seconds: a drain, a
requeue, a hold that Goodput executed and verified. On the local stack a requeue-hold half a
second before slurmctld's SIGKILL came back as a running job with no restart counted.

Each reconcile pass reads when the controller started (`Scheduler.controller_started`); the
store keeps the start it saw last and when (`goodput_switches` row `scheduler_boot`). When the
start moved, every action executed from `MARGIN_S` before the old controller was last seen is
checked against the scheduler, and one whose effect is gone is due again: `executed` → `ready`
(or `approved`), audit event `effect_lost`, so the executor applies it once more with all its
guards. What came after the action is not an effect lost: a later action on the same job, a
node Goodput returned to service, a restart count that moved on. One receiver does it: the row
moves under a compare-and-set in the same transaction.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection, Engine, select, update

from recovery import audit, outbox, watchdog
from recovery.action_config import is_paused, probe_scheduler
from recovery.outbox import OPEN_STATES, actions_table, switches
from recovery.policy import RESTARTS
from recovery.scheduler import JobState, NodeState, SchedulerError

SWITCH = "scheduler_boot"
# A change this long before the controller was last seen answering was saved (5 s at most);
# the rest is room for a pass that ran late and for a large cluster's slow save.
MARGIN_S = 30.0


def lost(
    row: Any,
    job: JobState | None,
    nodes: dict[str, NodeState],
    returned: frozenset[str] = frozenset(),
) -> list[str]:
    """What of an executed action the scheduler no longer shows (empty: all of it holds).

    A node it drained is out of service (drained, down, failed, in maintenance or rebooting),
    unless Goodput returned it to service since (`returned`). A job it requeued or stopped has
    at least the restart count the action left (`restarts_after` in its result): a count only
    goes down in a controller that forgot, never by a person's hand, so a later release or
    requeue by anyone is not taken for a loss. A job Goodput requeued (its count moved) that
    is pending and held again lost its release. A job that ended after the action is not
    judged (what it shows is its own end), nor one that a later action has (`job` None)."""
    action = json.loads(row.body).get("action") or {}
    out = []
    for n in action.get("nodes", []):
        s = nodes.get(n)
        if s is not None and n not in returned and not _out_of_service(s):
            out.append(f"{n} is {s.state}, not drained")
    after = _restarts_after(json.loads(row.result or "{}"))
    if job is None or after is None:
        return out
    if not job.active and job.end_time is not None and job.end_time > row.updated_at:
        return out  # it ran and ended after the action: what it shows now is not the action's
    if job.restarts < after:
        out.append(f"job {job.job_id} is {job.state}, restarts {job.restarts} (was {after})")
    elif (
        row.kind in RESTARTS
        and after > (row.restarts_before or 0)
        and job.restarts == after
        and job.held
        and job.state.upper() == "PENDING"
    ):
        out.append(f"job {job.job_id} is requeued but held")
    return out


def _restarts_after(result: dict[str, Any]) -> int | None:
    """The job's restart count the action left: its own record, else (an action executed by an
    earlier version) the count read back after it."""
    after = result.get(
        "restarts_after", ((result.get("verified") or {}).get("job") or {}).get("restarts")
    )
    return after if isinstance(after, int) else None


def _out_of_service(s: NodeState) -> bool:
    return s.drained or any(w in s.state.upper() for w in ("DOWN", "FAIL", "MAINT", "REBOOT"))


def check(engine: Engine, settings: Any) -> list[str]:
    """Compare the controller's start with the one last seen; after a restart, make the
    actions whose effect is gone due again. Returns their ids (empty when nothing moved, the
    scheduler cannot say, or another receiver did it). While actions do not run (paused, or
    the watchdog not acting) the restart waits, and the window with it."""
    sched = probe_scheduler(settings)  # quick reads, no retries: a slow one waits a pass
    if sched is None:
        return []
    try:
        boot = sched.controller_started()
    except SchedulerError:
        return []
    if boot is None:
        return []
    now = outbox.now(engine)
    with engine.connect() as conn:
        seen = conn.execute(select(switches).where(switches.c.name == SWITCH)).first()
    if seen is None or seen.value == boot:
        outbox.write(engine, _remember, boot, now)
        return []
    if is_paused(engine) or watchdog.current(engine) != watchdog.OK:
        return []
    rows, later, passed = _since(engine, seen.updated_at - MARGIN_S)
    try:
        nodes = {n.node: n for n in sched.node_states()} if rows else {}
        found = {
            r.id: lost(
                r,
                None if not r.job_id or _superseded(r, later) else sched.job_state(r.job_id),
                nodes,
                _returned(r, rows, passed),
            )
            for r in rows
        }
    except SchedulerError:
        return []  # the next pass looks again: the store still has the old start
    due: list[str] = outbox.write(engine, _reopen, seen, boot, now, rows, found)
    return due


def _since(engine: Engine, t: float) -> tuple[list[Any], list[Any], list[tuple[float, str]]]:
    """The actions executed since `t` (oldest first), the restarts and stops of their jobs
    that are open or executed, and the nodes' passed checks since `t`."""
    a, e = actions_table.c, audit.audit.c
    with engine.connect() as conn:
        rows = list(
            conn.execute(
                select(actions_table)
                .where(a.state == "executed", a.updated_at >= t)
                .order_by(a.updated_at)
            ).all()
        )
        jobs = {r.job_id for r in rows if r.job_id}
        later = list(
            conn.execute(
                select(a.id, a.job_id, a.created_at).where(
                    a.job_id.in_(jobs),
                    a.kind.in_((*RESTARTS, "stop")),
                    a.state.in_((*OPEN_STATES, "executed")),
                )
            ).all()
        )
        checks = conn.execute(select(e.ts, e.payload).where(e.type == "check_passed", e.ts >= t))
        passed = [(c.ts, str(json.loads(c.payload).get("node"))) for c in checks]
    return rows, later, passed


def _superseded(row: Any, actions: list[Any]) -> bool:
    """Has the job a later restart or stop, open or executed? That one decides the job."""
    return any(x.job_id == row.job_id and x.created_at > row.created_at for x in actions)


def _returned(row: Any, rows: list[Any], passed: list[tuple[float, str]]) -> frozenset[str]:
    """The nodes Goodput returned to service after `row`: a later resume, a passed check."""
    later = [
        json.loads(r.body).get("action", {}).get("resume", [])
        for r in rows
        if r.updated_at > row.updated_at
    ]
    return frozenset(
        [n for names in later for n in names] + [n for t, n in passed if t > row.updated_at]
    )


def _remember(conn: Connection, boot: str, now: float) -> None:
    """The first start seen (a row another receiver wrote first wins), or when it was last
    seen (each pass: one small write every few seconds)."""
    s = switches.c
    if not conn.execute(select(s.name).where(s.name == SWITCH)).first():
        conn.execute(
            switches.insert().values(
                name=SWITCH, value=boot, updated_at=now, updated_by="reconciler"
            )
        )
        return
    conn.execute(update(switches).where(s.name == SWITCH, s.value == boot).values(updated_at=now))


def _reopen(
    conn: Connection,
    seen: Any,
    boot: str,
    now: float,
    rows: list[Any],
    found: dict[str, list[str]],
) -> list[str]:
    moved = conn.execute(
        update(switches)
        .where(switches.c.name == SWITCH, switches.c.value == seen.value)
        .values(value=boot, updated_at=now, updated_by="reconciler")
    ).rowcount
    if not moved:
        return []  # another receiver saw the restart first
    due = []
    t = actions_table.c
    for r in rows:
        if not found[r.id]:
            continue
        done = conn.execute(
            update(actions_table)
            .where(t.id == r.id, t.state == "executed", t.updated_at == r.updated_at)
            .values(state=outbox.runnable_state(r), updated_at=now, next_attempt_at=None)
        ).rowcount
        if done:
            payload = {"lost": found[r.id], "controller_started": boot, "was": "executed"}
            audit.append(conn, "effect_lost", payload, **outbox.refs(r))
            due.append(r.id)
    return due

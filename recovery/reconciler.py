"""The reconciler: finishing what is due, at start-up and then every few seconds.

`reconcile` plans every outbox row still `planning` or `waiting_scheduler` (a planner that died,
a scheduler that was down), finishes every action that was ready, approved or executing when a
process died, against the scheduler's real state, expires overdue approvals and updates the
recoveries' accounting. Rows waiting out a retry delay are due at once when the scheduler
answers again (`wake_on_return`); an executed action whose effect a restarted controller forgot
is due again (`controller_restart`). `start` runs it once per process and engine, in a daemon
thread.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Engine, select, update
from sqlalchemy.exc import SQLAlchemyError

from recovery import accounting, audit, controller_restart, leases, outbox
from recovery.action_config import config, probe_scheduler, setting
from recovery.executor import execute, in_hand, plan
from recovery.outbox import PLANNABLE, RUNNABLE, actions_table, expire
from recovery.scheduler import SchedulerError

log = logging.getLogger("goodput.actions")
_running: weakref.WeakSet[Engine] = weakref.WeakSet()
_lock = threading.Lock()
# Per engine: this process's failed scheduler probes in a row and when the last one failed; a
# new process counts as after an outage (it has not seen the scheduler answer).
_failed: weakref.WeakKeyDictionary[Engine, tuple[int, float]] = weakref.WeakKeyDictionary()
OUTAGE_PROBES = 2  # failed probes in a row that make an outage (one is a blip: no wake)
FORGET_S = 60.0  # a failed probe older than this is not "in a row" with the next one


def _finish(engine: Engine, settings: Any, r: Any, startup: bool) -> None:
    if r.state in PLANNABLE:
        plan(engine, settings, r.id)  # in place: the row is never absent
        return
    was: dict[str, Any] | None = None
    if startup or r.state == "executing":  # a restart, or a dead owner's lease
        was = {"was": r.state}
        if r.state == "executing":
            was["owner"] = r.owner  # the process that died holding it
    execute(engine, settings, r.id, (r.state,), r.owner, was)  # audited only if it claims


def reconcile(engine: Engine, settings: Any, startup: bool = False) -> int:
    """Finish what is due: rows with no plan yet (a final diagnosis whose planner died, or one
    waiting for the scheduler), executing rows left by a dead process (`orphaned`), ready or
    approved rows whose retry time has come, executed rows whose effect a restarted controller
    forgot (`controller_restart`)."""
    expire(engine)
    try:  # after a controller restart: what it forgot is due again
        controller_restart.check(engine, settings)
    except SQLAlchemyError:
        raise
    except Exception:  # noqa: BLE001 - a defect there must not stall every pass
        log.exception("checking for a restarted scheduler controller failed")
    now = outbox.now(engine)
    single = engine.dialect.name == "sqlite"
    with engine.connect() as conn:
        rows = conn.execute(
            select(actions_table)
            .where(actions_table.c.state.in_((*RUNNABLE, *PLANNABLE)))
            .order_by(actions_table.c.created_at)
        ).all()
    woken = wake_on_return(engine, settings, rows, now)
    n = 0
    for r in rows:
        if _waiting(r, now) and r.id not in woken:
            continue
        if r.state == "executing" and not orphaned(r, now, startup, single):
            continue  # executing is finished here only when a dead process left it
        try:
            _finish(engine, settings, r, startup)
        except SQLAlchemyError:
            raise  # the store itself: no row can be finished, the loop retries the pass
        except Exception:  # noqa: BLE001 - one row's defect must not stall the rows after it
            log.exception("action %s could not be finished (retried next pass)", r.id)
            continue
        n += 1
    try:
        accounting.update_recoveries(engine, config(settings).scheduler)
    except SchedulerError:
        pass
    return n


def _waiting(r: Any, now: float) -> bool:
    """Is this row waiting out a retry delay (not executing, its retry time still ahead)?"""
    return r.state != "executing" and bool(r.next_attempt_at) and r.next_attempt_at > now


def wake_on_return(engine: Engine, settings: Any, rows: Sequence[Any], now: float) -> set[str]:
    """The ids of the rows waiting out a retry delay (after a scheduler failure) that are due
    now because the scheduler answers again after an outage (`OUTAGE_PROBES` failed probes in
    a row, or a process that has not seen it answer yet).

    The delay doubles with each failed try, so after an outage it can be minutes long; a
    slurmctld restart must not cost that. A row refused while the scheduler answered (Slurm's
    "try again"), or through a probe that fails now and then, keeps its delay."""
    parked = [r for r in rows if _waiting(r, now)]
    if not parked:
        return set()
    failed, last = _failed.get(engine, (OUTAGE_PROBES, now))
    if now - last > FORGET_S:
        failed = 0
    probe = probe_scheduler(settings)
    if probe is None or not probe.reachable():
        _failed[engine] = (failed + 1, now)
        return set()
    if failed < OUTAGE_PROBES:
        _failed[engine] = (0, now)
        return set()
    woken = {r.id for r in parked if _advance(engine, r, now)}
    _failed[engine] = (0, now)  # after the writes: a store error leaves the wake to the next pass
    return woken


def _advance(engine: Engine, r: Any, now: float) -> bool:
    """Make one waiting row due now (unless another process moved it), with an audit event."""

    def write(conn: Connection) -> bool:
        t = actions_table.c
        done = conn.execute(
            update(actions_table)
            .where(t.id == r.id, t.state == r.state, t.next_attempt_at == r.next_attempt_at)
            .values(next_attempt_at=now)
        ).rowcount
        if done:
            payload = {"retry_in_s": 0.0, "reason": "the scheduler answers again"}
            audit.append(conn, "retry_scheduled", payload, **outbox.refs(r))
        return bool(done)

    return bool(outbox.write(engine, write))


def orphaned(row: Any, now: float, startup: bool, single: bool) -> bool:
    """Is this executing row left by a dead process? Yes once its owner's lease has expired
    (receivers in HA: the owner stopped renewing it), and at start-up when the row has no
    lease or the store has one receiver only (SQLite): the process that held it is gone. One
    this process owns is an orphan when it is no longer in hand (an error escaped mid-way)."""
    if row.state != "executing":
        return False
    if row.owner == leases.OWNER:
        return not in_hand(row.id)
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
    if thread is None:
        flag = setting(settings, "actions_thread", "GOODPUT_ACTIONS_THREAD", "1")
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

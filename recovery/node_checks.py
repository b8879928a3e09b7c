"""The return-to-service loop: a node Goodput drained gets its health check once it is empty.

`tick(engine, scheduler, policy, ...)` is called by the receiver's background loop. For each
node that Goodput drained (reason `goodput: …`) and that runs no job any more (`DRAINED`), once
per drain: in monitor or approve mode it plans the check (audited, nothing runs); in act mode it
holds the node for the Prolog, runs the check (`node_health.run`), and then resumes the node,
keeps it drained as `goodput: failed <level>`, or calls the RMA hook — every step audited, the
check's output kept in `goodput_node_checks` as evidence. A check that was running when the
process died is run again after its time limit.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Column, Engine, Float, Integer, String, Table, Text, func, select

from recovery import audit, clock, node_health, slurm_hooks
from recovery.policy import Policy
from recovery.scheduler.base import (
    REASON_PREFIX,
    NodeState,
    Scheduler,
    SchedulerError,
    clean_reason,
)
from recovery.schema import metadata

log = logging.getLogger(__name__)
checks = Table(
    "goodput_node_checks",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("node", String(64), nullable=False, index=True),
    Column("drain_reason", String(256), nullable=False),
    Column("level", String(64), nullable=False),
    Column("state", String(16), nullable=False),  # planned|running|passed|failed|held|rma
    Column("mode", String(16), nullable=False),
    Column("started_at", Float, nullable=False),
    Column("finished_at", Float, nullable=True),
    Column("exit_code", Integer, nullable=True),
    Column("output", Text, nullable=False, default=""),
    Column("step", String(256), nullable=False, default=""),
)
FAILED_PREFIX = f"{REASON_PREFIX} failed"  # a check verdict: failed, or failed N times: RMA
OPEN = ("planned", "running")
WAIT = ("rma", "held")  # verdicts after which the node waits for a person
GRACE_S = 60.0  # beyond a check's own time limit before a `running` row counts as abandoned


def due(engine: Engine, node: NodeState, recheck_after_s: float | None, now: float) -> bool:
    """Drained by Goodput and empty; after a failed check only once `recheck_after_s` passed,
    and after an RMA or hold verdict never (that node waits for a person)."""
    if not (node.drained_by_goodput and node.state.upper().startswith("DRAINED")):
        return False
    if node.reason.startswith(node_health.HELD_PREFIX):
        return False  # a repeat offender: a person decides
    last = _last_finished(engine, node.node)
    if last is not None and last.state in WAIT and _wrote(last.step, node.reason):
        return False  # sent to RMA or held, by a rule or by failures: a person decides
    if not node.reason.startswith(FAILED_PREFIX):
        return True  # a new drain (a person returned the node to service since any verdict)
    if recheck_after_s is None:
        return False
    return last is None or now - last.finished_at >= recheck_after_s


def _last_finished(engine: Engine, node: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            select(checks.c.state, checks.c.finished_at, checks.c.step)
            .where(checks.c.node == node, checks.c.finished_at.is_not(None))
            .order_by(checks.c.id.desc())
            .limit(1)
        ).first()


def _wrote(step: str, reason: str) -> bool:
    """The node's reason is still the verdict this check relabelled it with (the row's `step`
    starts with it, as `relabel` cleaned it), not a drain that came after."""
    return bool(reason) and clean_reason(step).startswith(reason)


def _open_row(engine: Engine, node: NodeState, now: float, limit_s: float, acting: bool) -> Any:
    """The check already planned or running for this drain, if any; a plan made while not
    acting (monitor, approve, paused) does not hold back a run once Goodput acts."""
    with engine.connect() as conn:
        row = conn.execute(
            select(checks)
            .where(checks.c.node == node.node, checks.c.drain_reason == node.reason[:256])
            .order_by(checks.c.id.desc())
            .limit(1)
        ).first()
    if row is None or row.state not in OPEN or (acting and row.state == "planned"):
        return None
    if row.state == "running" and now - row.started_at > limit_s + GRACE_S:
        return None  # the process that ran it died: run it again
    return row


def failures_since_pass(engine: Engine, node: str) -> int:
    with engine.connect() as conn:
        states = conn.execute(
            select(checks.c.state).where(checks.c.node == node).order_by(checks.c.id.desc())
        ).scalars()
        n = 0
        for s in states:
            if s == "passed":
                break
            n += s in ("failed", "rma")
    return n


def _record(engine: Engine, type_: str, payload: dict[str, Any]) -> None:
    audit.record(engine, type_, payload, actor="goodput-node-checks")


def tick(
    engine: Engine,
    scheduler: Scheduler,
    policy: Policy,
    *,
    paused: bool = False,
    hold_dir: Path | None = None,
    events: dict[str, list[node_health.NodeEvent]] | None = None,
    now: float | None = None,
) -> list[dict[str, Any]]:
    """One pass over the nodes; returns what was planned or done, one dict per node."""
    cfg = policy.return_to_service
    if not cfg.enabled:
        return []
    now = clock.now(engine) if now is None else now
    done = []
    for node in scheduler.node_states():
        if hold_dir is not None and not node.drained and slurm_hooks.held(hold_dir, node.node):
            # back in service (a person resumed it): Goodput's hold must not refuse its jobs
            slurm_hooks.release(hold_dir, node.node)
            _record(engine, "hold_released", {"node": node.node, "state": node.state})
        if not due(engine, node, cfg.recheck_failed_after_s, now):
            continue
        history = (events or {}).get(node.node, [])
        level = node_health.check_level(history, cfg, now)
        spec = cfg.checks[level]
        mode = policy.mode_for(node.partitions)  # the narrowest of its partitions'
        acting = mode == "act" and not paused
        if _open_row(engine, node, now, spec.timeout_s, acting) is not None:
            continue
        base = {"node": node.node, "level": level, "drain_reason": node.reason, "mode": mode}
        if not acting:
            with engine.begin() as conn:
                conn.execute(checks.insert().values(**base, state="planned", started_at=now))
            _record(engine, "check_planned", {**base, "paused": paused})
            done.append({**base, "state": "planned"})
            continue
        broken = node_health.escalations(history, cfg.repeat_offenders, now)
        done.append(_run_one(engine, scheduler, cfg, node, level, base, hold_dir, now, broken))
    return done


def _run_one(
    engine: Engine,
    scheduler: Scheduler,
    cfg: node_health.ReturnToService,
    node: NodeState,
    level: str,
    base: dict[str, Any],
    hold_dir: Path | None,
    now: float,
    broken: list[tuple[node_health.OffenderRule, str]],
) -> dict[str, Any]:
    with engine.begin() as conn:
        key = conn.execute(
            checks.insert().values(**base, state="running", started_at=now)
        ).inserted_primary_key
    row_id = key[0] if key else None
    if hold_dir is not None:
        slurm_hooks.hold(hold_dir, node.node, f"{REASON_PREFIX} checking ({level})")
    _record(engine, "check_started", base)
    result = node_health.run(cfg.checks[level], node.node, level=level)
    failures = failures_since_pass(engine, node.node)
    step = node_health.after_check(result, failures, True, cfg, broken)
    detail = step.reason
    try:
        if step.kind == "resume":
            detail = scheduler.resume(node.node).detail
        elif step.kind in ("keep_drained", "hold", "rma"):
            scheduler.relabel(node.node, step.reason)
            if hold_dir is not None:  # the hold says the verdict, not "checking"
                slurm_hooks.hold(hold_dir, node.node, step.reason)
            if step.kind == "rma" and cfg.rma_hook is not None:
                hook = node_health.run(cfg.rma_hook, node.node, level=level, reason=step.reason)
                detail = f"{step.reason}; RMA hook exit {hook.exit_code}: {hook.output[-500:]}"
    except (SchedulerError, ValueError) as e:
        detail = f"{step.reason}; the scheduler refused: {e}"
    finally:
        if step.kind == "resume" and hold_dir is not None:  # passed: no hold, resumed or not
            slurm_hooks.release(hold_dir, node.node)
    states = {"resume": "passed", "keep_drained": "failed", "hold": "held", "rma": "rma"}
    state = states.get(step.kind, "failed")
    with engine.begin() as conn:
        conn.execute(
            checks.update()
            .where(checks.c.id == row_id)
            .values(
                state=state,
                finished_at=now + result.duration_s,
                exit_code=result.exit_code,
                output=result.output,
                step=detail[:256],
            )
        )
    payload = {**base, "state": state, "exit_code": result.exit_code, "detail": detail}
    _record(engine, f"check_{state}", {**payload, "duration_s": round(result.duration_s, 3)})
    return payload


FINISHED = ("passed", "failed", "held", "rma")


def latest_states(engine: Engine) -> dict[str, str]:
    """node -> the state of its newest finished check (passed, failed, held, rma)."""
    newest = (
        select(func.max(checks.c.id)).where(checks.c.state.in_(FINISHED)).group_by(checks.c.node)
    )
    with engine.connect() as conn:
        found = conn.execute(select(checks.c.node, checks.c.state).where(checks.c.id.in_(newest)))
        return {r.node: r.state for r in found}


def rows(engine: Engine, node: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """The latest checks (of one node), newest first: for the console and the CLI."""
    q = select(checks).order_by(checks.c.id.desc()).limit(max(1, min(limit, 1000)))
    if node is not None:
        q = q.where(checks.c.node == node)
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(q).all()]


def start(
    engine: Engine,
    current: Callable[[], tuple[Policy, Scheduler]],
    paused: Callable[[], bool],
    history: Callable[[float], dict[str, list[node_health.NodeEvent]]],
    interval_s: float = 10.0,
) -> threading.Thread | None:
    """Run `tick` every `interval_s` in a daemon thread (off when `GOODPUT_ACTIONS_THREAD=0`).
    `current()` gives the policy and scheduler of the moment (the policy file may change),
    `history(now)` each node's recent events; the Prolog holds go to `$GOODPUT_HOLD_DIR`."""
    if os.environ.get("GOODPUT_ACTIONS_THREAD", "1") in ("0", "false"):
        return None
    hold = os.environ.get("GOODPUT_HOLD_DIR")

    def loop() -> None:
        while True:
            time.sleep(interval_s)
            try:
                policy, scheduler = current()
                if not policy.return_to_service.enabled:
                    continue
                now = clock.now(engine)
                tick(engine, scheduler, policy, paused=paused(), events=history(now),
                     hold_dir=Path(hold) if hold else None, now=now)  # fmt: skip
            except Exception:  # noqa: BLE001 - the loop outlives any one failure
                log.exception("node check loop")

    thread = threading.Thread(target=loop, name="goodput-node-checks", daemon=True)
    thread.start()
    return thread

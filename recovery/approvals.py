"""What a person decides about actions: approve (then execute) or reject a pending one, and
return a repaired node to service (`resume_node`). Every decision is audited with who made it."""

from __future__ import annotations

import json
import uuid
from typing import Any

from sqlalchemy import Connection, Engine, select, update

from recovery import audit, failpoints, outbox, planning
from recovery.action_config import config
from recovery.decide import Action
from recovery.executor import execute
from recovery.outbox import actions_table, expire, get_action
from recovery.policy import Policy
from recovery.scheduler import SchedulerError
from recovery.scheduler.base import check_node


class ActionError(ValueError):
    """A request about an action that cannot be honoured (unknown id, wrong state)."""


class UnknownNode(ActionError):
    """The scheduler does not know the node."""


class UnknownAction(ActionError):
    """No action has the id."""


def approve(
    engine: Engine, settings: Any, action_id: str, who: str, comment: str = ""
) -> dict[str, Any]:
    """Approve a pending action (recording who) and execute it. The blast radius is checked
    again first, with every other reserved drain and the nodes as the scheduler shows them."""
    cfg = config(settings)
    row = outbox.raw(engine, action_id)
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
    expire(engine)
    if not who or len(who) > 128:
        raise ActionError("who must be a non-empty name of at most 128 characters")

    def write(conn: Connection) -> None:
        if budget is not None:
            planning.lock_budget(conn)
        row = conn.execute(select(actions_table).where(actions_table.c.id == action_id)).first()
        if row is None:
            raise UnknownAction(f"no action {action_id}")
        if row.state != "pending_approval":
            raise ActionError(f"action {action_id} is {row.state}, not pending approval")
        if budget is not None and budget[1] is not None:
            why = planning.budget_violation(conn, row, budget[1], budget[0])
            if why is not None:
                raise ActionError(
                    f"approving {action_id} now would break the blast radius ({why}); "
                    "it stays pending"
                )
        t = actions_table.c
        moved = conn.execute(  # a person's verdict or an expiry on another receiver may be first
            update(actions_table)
            .where(t.id == action_id, t.state == "pending_approval")
            .values(state=verdict, decided_by=who, updated_at=outbox.now(conn))
        ).rowcount
        if not moved:
            raise ActionError(f"action {action_id} was decided meanwhile, not {verdict}")
        audit.append(conn, verdict, {"comment": comment[:1000]}, **outbox.refs(row), actor=who)

    outbox.write(engine, write)


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
            audit.append(conn, type_, payload, **outbox.refs(row), actor=actor)
        return True

    return bool(outbox.write(engine, write))


def resume_node(
    engine: Engine, settings: Any, node: str, who: str, comment: str = ""
) -> dict[str, Any]:
    """Return a repaired node to service: an audited action (who, and the comment: what was
    repaired), executed at once (not while paused). Refused with nothing recorded: a node the
    scheduler does not know (`UnknownNode`), one not drained nor down, one a person drained
    (`ActionError`; the port refuses the last again at execution); an unreachable scheduler
    leaves the action recorded and retried."""
    check_node(node)
    cfg = config(settings)
    try:
        known = {n.node: n for n in cfg.scheduler.node_states()}
    except SchedulerError:
        known = None  # unreachable: recorded, and the executor retries it
    if known is not None:
        if node not in known:
            raise UnknownNode(f"node {node} is unknown to the scheduler")
        now_in = known[node]
        if not now_in.drained and "DOWN" not in now_in.state.upper():
            raise ActionError(f"node {node} is not drained ({now_in.state}): nothing to return")
        if now_in.drained and not now_in.drained_by_goodput:
            raise ActionError(
                f"node {node} was drained by a person ({now_in.reason!r}): theirs to return"
            )
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
    now = outbox.now(engine)
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
    _insert(engine, row, [("planned", {**body["action"], "comment": body["comment"]})], actor=who)
    return execute(engine, settings, action_id) or {}

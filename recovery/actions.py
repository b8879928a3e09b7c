"""Recovery actions: plan -> (approve) -> execute -> verify -> record, crash-safe.

A final diagnosis reaches the outbox (`recovery.outbox`) in the same transaction that stores
it; `on_diagnosis` then plans it (`recovery.executor.plan`, deciding with `recovery.planning`)
and, by mode, executes it or queues it for a person (`recovery.approvals`), telling on-call
where one is needed (`recovery.notifier`). The outbox row's id is the idempotency key (one
action per incident, `-N` when re-planned). `recovery.reconciler`, which the receiver starts
(`recovery.app`: at start-up, then every few seconds in a background thread), finishes what a
dead process or a down scheduler left; planning here starts no thread.
Settings: `recovery.action_config`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from recovery import outbox
from recovery.executor import plan


def on_diagnosis(
    engine: Engine, settings: Any, incident: dict[str, Any], diagnosis: dict[str, Any]
) -> dict[str, Any] | None:
    """Enqueue (if the diagnosis' transaction has not already) and plan the action for one
    final diagnosis; by mode, execute it or queue it for approval.

    Idempotent per incident. Never raises for bad input: it is audited and None returned.
    """
    action_id = outbox.write(engine, outbox.enqueue, incident, diagnosis)
    if action_id is None:
        return outbox.incident_action(
            engine, str(incident.get("id", diagnosis.get("incident_id", "")))
        )
    return plan(engine, settings, action_id)

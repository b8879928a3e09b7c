"""Leases: which receiver works on a diagnosis or an action, and until when.

Receivers in HA share one PostgreSQL store. A receiver claims a due diagnosis
(`incidents.claim_diagnoses`, `SELECT … FOR UPDATE SKIP LOCKED`) or an action
(`executor._claim`, under the budget lock) for `lease_s` seconds, recording itself as the
owner; while it lives, `Heartbeat` renews every lease it holds each `lease_s / 3`. A receiver
that dies (SIGKILL, a lost host) stops renewing, and once its lease has expired another
receiver takes the work over: the diagnosis is made again, the action executed again (the
scheduler port's guards make a repeated step a no-op). Settings: `GOODPUT_RECEIVER_LEASE_S`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
import weakref

from sqlalchemy import Engine, update

from recovery import clock

log = logging.getLogger("goodput.leases")
OWNER = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"  # this process, in the store's owner columns
DEFAULT_S = 30.0
_running: weakref.WeakSet[Engine] = weakref.WeakSet()
_lock = threading.Lock()


def renew(engine: Engine, lease_s: float, owner: str = OWNER, now: float | None = None) -> int:
    """Move the leases `owner` holds `lease_s` ahead; returns how many rows were renewed."""
    from recovery.outbox import actions_table as a
    from recovery.store import incidents as i

    until = (clock.now(engine) if now is None else now) + lease_s
    with engine.begin() as conn:
        n = conn.execute(
            update(i)
            .where(i.c.diagnosis_owner == owner, i.c.diagnosis_lease.is_not(None))
            .values(diagnosis_lease=until)
        ).rowcount
        n += conn.execute(
            update(a).where(a.c.owner == owner, a.c.state == "executing").values(lease_until=until)
        ).rowcount
    return int(n or 0)


def start(engine: Engine, lease_s: float) -> None:
    """Renew this process' leases in a daemon thread (once per engine)."""
    with _lock:
        if engine in _running:
            return
        _running.add(engine)

    def loop() -> None:
        while True:
            time.sleep(lease_s / 3)
            try:
                renew(engine, lease_s)
            except Exception:  # noqa: BLE001 - the store is down: the next beat tries again
                log.exception("lease heartbeat")

    threading.Thread(target=loop, name="goodput-leases", daemon=True).start()

"""Retention, as policy data (`retention:` in the policy): prune stored webhook bodies and
exported audit events (and the console's logouts once their cookies expired); a daemon thread
applies it every `prune_every_s` while the receiver runs.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from recovery import audit, clock, logouts, store
from recovery.policy import DEFAULT_FILE, Policy, Retention, load_policy

log = logging.getLogger("goodput.receiver.retention")


def apply(engine: Engine, rules: Retention, now: float | None = None) -> dict[str, int]:
    """Prune now; returns the rows deleted per kind."""
    now = clock.now(engine) if now is None else now
    return {
        "payloads": store.prune_payloads(engine, rules.payload_days, now),
        "audit": audit.prune(engine, rules.audit_days, now),
        "logouts": logouts.prune(engine, now),
    }


def rules_for(settings: Any) -> Retention:
    """The retention rules of the policy in force (the settings' own, else the policy file)."""
    policy = getattr(settings, "policy", None)
    if not isinstance(policy, Policy):
        env = {**os.environ, **(getattr(settings, "extra", None) or {})}
        chosen = getattr(settings, "policy_file", None) or env.get("GOODPUT_POLICY_FILE")
        policy = load_policy(Path(chosen or DEFAULT_FILE), env=env)
    return policy.retention


class Pruner:
    """Applies the retention rules at start and then every `prune_every_s` (daemon thread)."""

    def __init__(self, engine: Engine, settings: Any) -> None:
        self.engine, self.settings = engine, settings
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="goodput-retention", daemon=True)

    def start(self) -> Pruner:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        every = 3600.0
        while not self._stop.is_set():
            try:
                rules = rules_for(self.settings)
                every = rules.prune_every_s
                deleted = apply(self.engine, rules)
                if any(deleted.values()):
                    log.info("retention pruned %s", deleted)
            except Exception:
                log.exception("retention pass failed (retried in %.0f s)", every)
            self._stop.wait(every)

"""What recovery actions run under: the policy, the scheduler adapter, the notification and
Prometheus URLs (`config`), and the global pause switch.

Settings are read from attributes of `settings` (getattr) or the environment:
`GOODPUT_MODE`, `GOODPUT_POLICY_FILE`, `GOODPUT_SCHEDULER`, `GOODPUT_SIM_URL`,
`GOODPUT_ALERTMANAGER_URL`, `GOODPUT_PROMETHEUS_URL`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, select, update

from recovery import audit, leases, outbox
from recovery.outbox import switches
from recovery.policy import DEFAULT_FILE, Policy, PolicyError, load_policy
from recovery.scheduler import Scheduler, SchedulerBusy, from_settings
from recovery.scheduler.slurm import SlurmScheduler


@dataclass(frozen=True)
class Config:
    policy: Policy
    scheduler: Scheduler
    alertmanager_url: str | None
    prometheus_url: str | None
    retry_base_s: float
    lease_s: float = leases.DEFAULT_S


def setting(settings: Any, attr: str, env: str, default: str | None = None) -> str | None:
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
        kind = setting(settings, "scheduler", "GOODPUT_SCHEDULER", "slurm") or "slurm"
        if kind not in _sched_cache:
            _sched_cache[kind] = from_settings(settings)
        sched = _sched_cache[kind]
    return Config(
        policy=policy,
        scheduler=sched,
        alertmanager_url=setting(settings, "alertmanager_url", "GOODPUT_ALERTMANAGER_URL"),
        prometheus_url=setting(settings, "prometheus_url", "GOODPUT_PROMETHEUS_URL"),
        retry_base_s=float(getattr(settings, "action_retry_s", 5.0)),
        lease_s=float(getattr(settings, "lease_s", leases.DEFAULT_S)),
    )


def probe_scheduler(settings: Any) -> Scheduler | None:
    """A scheduler adapter for a quick health probe (short timeout, no retries), or None."""
    try:
        sched = config(settings).scheduler
    except (PolicyError, ValueError):
        return None
    if isinstance(sched, SlurmScheduler):
        return SlurmScheduler(timeout_s=3.0, retries=0, env=sched.env)
    return sched


BUSY_MAX_DELAY_S = 60.0  # the longest wait after Slurm's "try again"


def retry_delay(cfg: Config, exc: Exception, attempts: int) -> float:
    """Seconds before the next try after `attempts` failed ones: the base delay doubling per
    try, up to 64 times it (never over 10 minutes; `reconciler.wake_on_return` ends it when
    the scheduler answers again), or up to 1 minute when it answered "try again"."""
    cap = BUSY_MAX_DELAY_S if isinstance(exc, SchedulerBusy) else 600.0
    return min(cfg.retry_base_s * 2 ** min(attempts, 6), cap)


def is_paused(engine: Engine) -> bool:
    with engine.connect() as conn:
        row = conn.execute(select(switches.c.value).where(switches.c.name == "pause")).first()
    return bool(row and row.value == "on")


def set_paused(engine: Engine, paused: bool, who: str, reason: str = "") -> None:
    """Flip the global pause switch (audited)."""
    value = "on" if paused else "off"

    def write(conn: Connection) -> None:
        t = outbox.now(conn)
        done = conn.execute(
            update(switches)
            .where(switches.c.name == "pause")
            .values(value=value, updated_at=t, updated_by=who[:128])
        ).rowcount
        if not done:
            conn.execute(
                switches.insert().values(
                    name="pause", value=value, updated_at=t, updated_by=who[:128]
                )
            )
        audit.append(conn, "paused" if paused else "resumed", {"reason": reason[:500]}, actor=who)

    outbox.write(engine, write)

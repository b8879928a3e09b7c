"""Fail-open: when the receiver's own health fails, Goodput stops acting and says so.

Every `interval_s` the watchdog probes what acting depends on: the scheduler, the evidence
sources the policy requires (those configured), and the alert flow (a webhook delivery within
`alert_silence_s`, for a site that routes a heartbeat alert to the receiver). After
`failures_before_stop` bad probes in a row it stops acting: new plans are made as in monitor
mode (reason `watchdog`), ready and approved actions wait, `goodput_receiver_acting{reason}`
is 0, the console shows a banner and on-call gets `GoodputReceiverNotActing`. One good probe
resumes acting. Both changes are audited. The state is the `watchdog` switch in the outbox,
shared by every receiver on the store: a receiver that stops acting keeps its stop fresh
while its probes stay bad, and only it resumes, or anyone once the stop is `STALE_INTERVALS`
intervals old (its receiver gone). So receivers that see different things do not flip the
switch every tick, and one restarted while stopped stays stopped until a good probe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import Connection, Engine, func, select, update

from recovery import action_config, audit, leases, notifier, outbox, store
from recovery.policy import WatchdogPolicy

log = logging.getLogger(__name__)
OK = "ok"
# The metric's reason label takes only these values.
REASONS = (OK, "scheduler_unreachable", "evidence_unreachable", "alert_flow_stopped")
SWITCH = "watchdog"
STALE_INTERVALS = 3  # a stop its receiver has not renewed for this many intervals is anyone's


@dataclass(frozen=True)
class State:
    acting: bool = True
    reason: str = OK
    bad: int = 0  # bad probes in a row


def verdict(
    rows: list[dict[str, Any]],
    policy: WatchdogPolicy,
    last_alert_at: float | None,
    now: float,
) -> tuple[str, str]:
    """(reason, detail) of one probe: `ok`, or why acting must stop, the most basic cause
    first. `rows` are console health rows ({source, status: ok|error|off, detail})."""
    by = {r["source"]: r for r in rows}
    sched = by.get("scheduler")
    if "scheduler" in policy.required and sched and sched["status"] == "error":
        return "scheduler_unreachable", f"scheduler: {sched['detail']}"
    bad = [
        f"{s}: {by[s]['detail']}"
        for s in policy.required
        if s != "scheduler" and s in by and by[s]["status"] == "error"
    ]
    if bad:
        return "evidence_unreachable", "; ".join(bad)
    silence = policy.alert_silence_s
    if silence is not None and (last_alert_at is None or now - last_alert_at > silence):
        since = "never" if last_alert_at is None else f"{now - last_alert_at:.0f} s ago"
        return "alert_flow_stopped", f"last webhook delivery {since} (limit {silence:.0f} s)"
    return OK, ""


def step(state: State, reason: str, failures_before_stop: int) -> State:
    """The next state after a probe: stop after enough bad probes in a row, resume on a good one."""
    if reason == OK:
        return State()
    bad = state.bad + 1
    if bad >= failures_before_stop:
        return State(False, reason, bad)
    return State(state.acting, state.reason, bad)


# ---- the switch (read by planning, execution, the console and /metrics) ----------------------
def reason_in(conn: Connection) -> str:
    """`ok`, or why the receiver does not act now."""
    row = conn.execute(
        select(outbox.switches.c.value).where(outbox.switches.c.name == SWITCH)
    ).first()
    return row.value if row and row.value in REASONS else OK


def current(engine: Engine) -> str:
    with engine.connect() as conn:
        return reason_in(conn)


def _stop_of(conn: Connection) -> tuple[str | None, float]:
    """Who wrote the switch, and when."""
    row = conn.execute(
        select(outbox.switches.c.updated_by, outbox.switches.c.updated_at).where(
            outbox.switches.c.name == SWITCH
        )
    ).first()
    return (row.updated_by, float(row.updated_at or 0.0)) if row else (None, 0.0)


def _write(
    engine: Engine, reason: str, detail: str, who: str, stale_s: float | None = None
) -> bool:
    """Set the switch to `reason` (audited); a stop is renewed by its writer. With `stale_s`,
    another receiver's stop is left alone unless not renewed for that long. Whether the
    switch now says `reason`."""

    def write(conn: Connection) -> bool:
        was = reason_in(conn)
        by, at = _stop_of(conn)
        now = outbox.now(conn)
        t = outbox.switches
        if was == reason:
            if reason != OK and by == who:  # still stopped: renew it
                conn.execute(update(t).where(t.c.name == SWITCH).values(updated_at=now))
            return True
        if stale_s is not None and was != OK and by != who and now - at <= stale_s:
            return False  # another receiver's stop, renewed lately: theirs to end
        values = {"value": reason, "updated_at": now, "updated_by": who[:128]}
        if not conn.execute(update(t).where(t.c.name == SWITCH).values(**values)).rowcount:
            conn.execute(t.insert().values(name=SWITCH, **values))
        event = "watchdog_resumed" if reason == OK else "watchdog_stopped"
        audit.append(conn, event, {"reason": reason, "was": was, "detail": detail[:1000]})
        return True

    return bool(outbox.write(engine, write))


def last_delivery(engine: Engine) -> float | None:
    """When the webhook last received a payload (any)."""
    p = store.payloads.c
    with engine.connect() as conn:
        v = conn.execute(select(func.max(func.coalesce(p.last_seen, p.received_at)))).scalar()
    return float(v) if v is not None else None


class Watchdog:
    """The shell: `tick()` probes once and records a change; `start()` runs it in a thread."""

    def __init__(
        self,
        engine: Engine,
        settings: Any,
        policy: Callable[[], WatchdogPolicy],
        probe: Callable[[], list[dict[str, Any]]] | None = None,
        clock: Callable[[], float] | None = None,
        owner: str | None = None,
    ) -> None:
        self.engine, self.settings, self.policy = engine, settings, policy
        self.clock = clock or (lambda: outbox.now(engine))  # the store's clock by default
        self.probe = probe or self._probe
        self.started_at = self.clock()
        self.who = f"goodput-watchdog {owner or leases.OWNER}"
        self.state: State | None = None  # read from the store at the first tick

    def _probe(self) -> list[dict[str, Any]]:
        from recovery.console import health

        rows, _nodes = health.probe(self.settings, action_config.probe_scheduler(self.settings))
        return rows

    def tick(self) -> State:
        pol = self.policy()
        if not pol.enabled:
            self.state = State()
            _write(self.engine, OK, "watchdog disabled", self.who)
            return self.state
        now = self.clock()
        last = None
        if pol.alert_silence_s is not None:  # no flow is expected before the watchdog started
            last = max(last_delivery(self.engine) or self.started_at, self.started_at)
        reason, detail = verdict(self.probe(), pol, last, now)
        before = current(self.engine)
        if self.state is None:  # a restart while stopped stays stopped until a good probe
            stopped = State(False, before, pol.failures_before_stop)
            self.state = stopped if before != OK else State()
        self.state = step(self.state, reason, pol.failures_before_stop)
        after = self.state.reason if not self.state.acting else OK
        stale_s = STALE_INTERVALS * pol.interval_s
        if after == before and after == OK:
            return self.state
        if _write(self.engine, after, detail, self.who, stale_s) and after != before:
            self._tell(after, detail)
        return self.state

    def _tell(self, reason: str, detail: str) -> None:
        cfg = action_config.config(self.settings)
        row = {"id": SWITCH, "job_id": None, "incident_id": None, "kind": "none"}
        if reason == OK:
            text, until = "Goodput acts again: its own health checks pass.", self.clock() + 1.0
        else:  # the notice lasts until it acts again (endsAt after startsAt ends it)
            text, until = f"Goodput stopped acting ({reason}): {detail}. It plans only.", None
        name = "GoodputReceiverNotActing"
        notifier.notify(self.engine, cfg, name, row, None, text, "warning", until)

    def start(self) -> threading.Thread:
        def loop() -> None:
            while True:
                try:
                    self.tick()
                except Exception:  # noqa: BLE001 - the watchdog must not take the receiver down
                    log.exception("watchdog probe")
                time.sleep(self.policy().interval_s)

        t = threading.Thread(target=loop, name="goodput-watchdog", daemon=True)
        t.start()
        return t


class ActingCollector(Collector):
    """`goodput_receiver_acting{reason}`: 1 while Goodput acts (reason `ok`), else 0 with why."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily(
            "goodput_receiver_acting",
            "1 while the receiver acts; 0 while its watchdog stopped it (reason says why).",
            labels=["reason"],
        )
        try:
            reason = current(self.engine)
        except Exception:  # noqa: BLE001 - a scrape must not fail because the DB is busy
            reason = ""
        if reason:
            g.add_metric([reason], 1.0 if reason == OK else 0.0)
        yield g

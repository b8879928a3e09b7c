"""The diagnosis worker: a background thread that diagnoses incidents once they settle.

Pending diagnoses live in the store (`diagnosis_state='pending'`, `diagnosis_due`), so a
restarted receiver resumes them; each is claimed with a lease (`recovery.leases`), so of two
receivers on one store one makes it, and the other takes over if the first dies. A final
diagnosis (not one superseded by a newer alert, nor an inconclusive one, nor one made while
Slurm was down, still to be rechecked) is stored together with its action's outbox row
(`recovery.outbox.enqueue`, one transaction); then
`recovery.actions.on_diagnosis` plans it, and if this process dies first, `reconcile` does.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any

from sqlalchemy import Engine

from recovery import (
    actions,
    attribution,
    clock,
    evidence,
    failpoints,
    incidents,
    leases,
    outbox,
)
from recovery.metrics import ReceiverMetrics
from recovery.settings import Settings

log = logging.getLogger("goodput.receiver.worker")
# A diagnosis made while Slurm was unreachable is made again (every recheck_s) up to this many
# diagnoses of the incident: 30 x 10 s covers a 5-minute outage of the controller.
INCOMPLETE_MAX = 30


def diagnose(settings: Settings, incident: dict[str, Any]) -> dict[str, Any]:
    """Collect evidence for `incident` from every configured source and attribute it, within
    the job's run it is about (`run`: Goodput's restarts before and after it, `run_bounds`)."""
    ctx = evidence.Context.from_incident(incident, settings)
    since, until = incident.get("run") or (None, None)
    if since is not None:
        ctx.start = max(ctx.start, since)
    if until is not None:
        ctx.end = max(ctx.start, min(ctx.end, until))
    bundle = evidence.collect_live(ctx, settings)
    return attribution.attribute(bundle, ctx, incident_id=incident["id"])


def run_once(
    engine: Engine,
    settings: Settings,
    metrics: ReceiverMetrics | None = None,
    now: float | None = None,
) -> list[int]:
    """Diagnose every due incident once; returns the ids diagnosed (final or not). One pass
    of the worker thread; `now` defaults to the store's clock (`recovery.clock`)."""
    now = clock.now(engine) if now is None else now
    done = []
    lease_s = float(getattr(settings, "lease_s", leases.DEFAULT_S))
    for incident_id, gen in incidents.claim_diagnoses(engine, leases.OWNER, lease_s, now):
        inc = incidents.incident(engine, incident_id)
        if inc is None:
            continue
        first = inc.get("first_alert_at") or inc["opened_at"]
        inc["run"] = outbox.run_bounds(engine, inc.get("job_id"), first)
        t0 = time.monotonic()
        try:
            doc = diagnose(settings, inc)
        except Exception:
            log.exception("diagnosis of incident %s failed", incident_id)
            incidents.record_failure(engine, incident_id, now=now, owner=leases.OWNER, gen=gen)
            continue
        if metrics is not None:
            metrics.diagnosis_duration.observe(time.monotonic() - t0)
            for rep in doc.get("connector_reports", []):
                if rep["status"] == "error":
                    metrics.connector_errors.labels(connector=rep["connector"]).inc()
            if doc.get("onset") and inc.get("first_alert_at"):
                metrics.time_to_detect.observe(max(0.0, inc["first_alert_at"] - doc["onset"]))
        stored = incidents.store_diagnosis(
            engine,
            incident_id,
            gen,
            doc,
            settings.recheck_s,
            settings.recheck_max,
            now,
            on_final=functools.partial(outbox.enqueue, incident=inc, diagnosis=doc),
            incomplete_max=INCOMPLETE_MAX if settings.slurm_enabled else 0,
            owner=leases.OWNER,
        )
        done.append(incident_id)
        if stored != "done":  # superseded, rechecked later, or inconclusive and over
            log.info("incident %s: diagnosis %s; no action planned on it", incident_id, stored)
            continue
        failpoints.hit("diagnosed")  # the outbox row is durable: reconcile plans it if we die
        current = incidents.incident(engine, incident_id)  # with the stored outcome
        if current is None:
            continue
        try:
            actions.on_diagnosis(engine, settings, current, doc)
        except Exception:
            log.exception("recovery.actions.on_diagnosis failed for incident %s", incident_id)
    return done


class DiagnosisWorker:
    """Polls the store every `settings.worker_poll_s` and diagnoses due incidents."""

    def __init__(
        self, engine: Engine, settings: Settings, metrics: ReceiverMetrics | None = None
    ) -> None:
        self.engine, self.settings, self.metrics = engine, settings, metrics
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="goodput-diagnosis", daemon=True)

    def start(self) -> None:
        if self.engine.dialect.name == "sqlite":  # one receiver per SQLite store
            incidents.release_claims(self.engine, leases.OWNER)
        leases.start(self.engine, float(getattr(self.settings, "lease_s", leases.DEFAULT_S)))
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                run_once(self.engine, self.settings, self.metrics)
            except Exception:
                log.exception("diagnosis worker cycle failed")
            self._stop.wait(self.settings.worker_poll_s)

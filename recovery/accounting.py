"""Goodput accounting per incident: onset -> detected -> decided -> running again, and the
GPU-hours lost (the job's GPUs idle from onset to running again, plus the work since the last
checkpoint before the onset, from the log metrics when Prometheus has them).

`AccountingCollector(engine)` exposes the numbers (and the action counts) on a registry.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import Column, Engine, Float, Integer, String, Table, select, update
from sqlalchemy.exc import IntegrityError

from catalogue import promql
from clients.prometheus import PromClient, PromError
from recovery import clock
from recovery.outbox import OPEN_STATES, counts, retrying
from recovery.scheduler.base import JOB_RE
from recovery.schema import metadata

incidents = Table(
    "goodput_accounting",
    metadata,
    Column("incident_id", String(64), primary_key=True),
    Column("job_id", String(32), nullable=True),
    Column("onset", Float, nullable=True),
    Column("detected_at", Float, nullable=True),
    Column("decided_at", Float, nullable=True),
    Column("running_again_at", Float, nullable=True),
    Column("checkpoint_at", Float, nullable=True),
    Column("gpus", Integer, nullable=False, default=0),
    Column("gpu_hours_lost", Float, nullable=True),
)


CHECKPOINT = "goodput_job_last_checkpoint_timestamp_seconds"


def _checkpoint(prom_url: str | None, job_id: str | None) -> float | None:
    if not prom_url or not job_id or not JOB_RE.match(job_id):
        return None
    try:
        with PromClient(prom_url, timeout=3) as prom:
            result = prom.query("max(" + promql.selector(CHECKPOINT, job_id=job_id) + ")")
    except (PromError, ValueError):
        return None
    return result[0][1] if result else None


def open_incident(
    engine: Engine, incident: dict[str, Any], diag: Any, prom_url: str | None
) -> None:
    """Record onset and detection (idempotent, also against a concurrent planner: the
    reconciler thread may plan the same action); job_id was validated by the caller."""
    iid = str(diag.incident_id)
    try:
        with engine.begin() as conn:
            if conn.execute(
                select(incidents.c.incident_id).where(incidents.c.incident_id == iid)
            ).first():
                return
            opened = incident.get("opened_at")
            detected = float(opened) if isinstance(opened, int | float) else clock.now(engine)
            conn.execute(
                incidents.insert().values(
                    incident_id=iid,
                    job_id=diag.job_id,
                    onset=diag.onset,
                    detected_at=detected,
                    checkpoint_at=_checkpoint(prom_url, diag.job_id),
                    gpus=0,
                )
            )
    except IntegrityError:  # another planner recorded it between the check and the insert
        return


def mark_decided(engine: Engine, incident_id: str, at: float) -> None:
    with engine.begin() as conn:
        conn.execute(
            update(incidents)
            .where(incidents.c.incident_id == str(incident_id), incidents.c.decided_at.is_(None))
            .values(decided_at=at)
        )


def gpu_hours_lost(
    onset: float | None, running_again: float, gpus: int, checkpoint_at: float | None
) -> float:
    """Idle GPU time from onset to running again, plus work since the last checkpoint."""
    if onset is None or gpus <= 0:
        return 0.0
    idle = max(running_again - onset, 0.0)
    redo = max(onset - checkpoint_at, 0.0) if checkpoint_at is not None else 0.0
    return gpus * (idle + redo) / 3600.0


CAUSES = ("detection", "decision", "recovery", "redone_work")


def lost_by_cause(row: Any) -> dict[str, float]:
    """GPU-seconds one incident cost, by cause: onset → alert (detection), alert → decision,
    decision → running again (recovery), and the work since the last checkpoint (redone_work).
    Each stage ends within [onset, running again] (a missing stage takes no time; a decision
    after the job was back counts up to that moment), so their sum is `gpu_hours_lost` × 3600.
    Nothing counts before the job runs again (its GPUs are known then)."""
    gpus = row.gpus or 0
    if row.running_again_at is None or row.onset is None:
        return dict.fromkeys(CAUSES, 0.0)
    onset = row.onset
    back = max(row.running_again_at, onset)
    marks = [onset]
    for t in (row.detected_at, row.decided_at):
        marks.append(min(max(marks[-1] if t is None else t, marks[-1]), back))
    marks.append(back)
    redo = max(onset - row.checkpoint_at, 0.0) if row.checkpoint_at is not None else 0.0
    spans = [b - a for a, b in zip(marks, marks[1:], strict=False)] + [redo]
    return {c: gpus * span for c, span in zip(CAUSES, spans, strict=True)}


DAY = 86400.0  # an incident whose job has not run again in a day: closed, not polled
JOB_SERIES_S = 6 * 3600.0  # a job's lost-time series outlives its last incident by this long


def update_recoveries(engine: Engine, scheduler: Any) -> int:
    """Fill in `running_again_at` for jobs that run again after their incident's onset: the
    job's latest incident before that start takes it; its earlier ones (the job ran on through
    them: a hold, a drain alone) close with nothing lost (`gpu_hours_lost` 0, no recovery), as
    does one whose job ended (stopped, gone from Slurm) or has not run again in a `DAY`: days
    of running are never charged to an old incident, and old ones are not polled for ever."""
    c = incidents.c
    with engine.connect() as conn:
        rows = conn.execute(
            select(incidents).where(
                c.running_again_at.is_(None), c.gpu_hours_lost.is_(None), c.job_id.is_not(None)
            )
        ).all()
    now, n = clock.now(engine), 0
    for job_id in dict.fromkeys(r.job_id for r in rows):
        mine = [r for r in rows if r.job_id == job_id]
        job = scheduler.job_state(job_id)
        start: float = job.start_time if job and job.state == "RUNNING" and job.start_time else 0.0
        before = sorted((r for r in mine if start > _since(r)), key=_since)
        for r in mine:
            if before and r is before[-1]:
                lost = gpu_hours_lost(r.onset, start, job.gpus, r.checkpoint_at)
                _close(engine, r, running_again_at=start, gpus=job.gpus, gpu_hours_lost=lost)
                n += 1
            elif r in before or not (job and job.active) or now - (r.detected_at or now) > DAY:
                _close(engine, r, gpu_hours_lost=0.0)
    return n


def _since(row: Any) -> float:
    return float(row.onset or row.detected_at or 0.0)


def _close(engine: Engine, row: Any, **values: Any) -> None:
    with engine.begin() as conn:
        conn.execute(
            update(incidents).where(incidents.c.incident_id == row.incident_id).values(**values)
        )


def get(engine: Engine, incident_id: str) -> dict[str, Any] | None:
    with engine.connect() as conn:
        r = conn.execute(
            select(incidents).where(incidents.c.incident_id == str(incident_id))
        ).first()
    if r is None:
        return None
    d = dict(r._mapping)
    for a, b, key in (
        ("onset", "detected_at", "time_to_detect_s"),
        ("onset", "decided_at", "time_to_decide_s"),
        ("onset", "running_again_at", "time_to_recover_s"),
    ):
        d[key] = (d[b] - d[a]) if d[a] is not None and d[b] is not None else None
    return d


def _current_jobs(rows: Sequence[Any], since: float) -> set[str]:
    """Jobs with an incident still open or touched (detected, decided, running again) since."""
    return {
        r.job_id
        for r in rows
        if r.job_id
        and (
            r.gpu_hours_lost is None
            or max(r.detected_at or 0.0, r.decided_at or 0.0, r.running_again_at or 0.0) >= since
        )
    }


class AccountingCollector(Collector):
    """`goodput_actions_total{action,result}`, `goodput_actions_pending`,
    `goodput_actions_retrying`,
    `goodput_incident_time_to_recover_seconds` (summary), `goodput_gpu_hours_lost_total`,
    `goodput_gpu_seconds_lost_total{cause}` and `goodput_job_gpu_seconds_lost_total{job_id,cause}`
    (the numerator of ETTR; the recording rules `goodput:*_ettr:*` divide). A job's series is
    exposed while one of its incidents is open or was last touched within `JOB_SERIES_S`:
    the hour's `increase()` still sees its last step, and a site's years of jobs do not each
    keep a series for ever."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Any]:
        total = CounterMetricFamily(
            "goodput_actions", "Recovery actions by kind and state.", labels=["action", "result"]
        )
        pending = GaugeMetricFamily(
            "goodput_actions_pending", "Actions waiting for approval, execution or a retry."
        )
        retry = GaugeMetricFamily(
            "goodput_actions_retrying",
            "Actions waiting to try again after the scheduler failed a try (unreachable, or "
            "answering 'try again').",
        )
        recover = SummaryMetricFamily(
            "goodput_incident_time_to_recover_seconds", "Fault onset to the job running again."
        )
        lost = CounterMetricFamily("goodput_gpu_hours_lost", "GPU-hours lost to incidents.")
        by_cause = CounterMetricFamily(
            "goodput_gpu_seconds_lost",
            "GPU-seconds lost to incidents by cause (detection, decision, recovery, redone_work).",
            labels=["cause"],
        )
        by_job = CounterMetricFamily(
            "goodput_job_gpu_seconds_lost",
            "GPU-seconds a job lost to incidents, by cause.",
            labels=["job_id", "cause"],
        )
        try:
            c, n_retry = counts(self.engine), retrying(self.engine)
            with self.engine.connect() as conn:
                rows = conn.execute(select(incidents)).all()
        except Exception:  # noqa: BLE001 - a scrape must not fail because the DB is busy
            return  # no series this scrape: zeros would read as counter resets to increase()
        n_pending = 0
        for (kind, state), n in sorted(c.items()):
            total.add_metric([kind, state], float(n))
            if state in OPEN_STATES:
                n_pending += n
        pending.add_metric([], float(n_pending))
        retry.add_metric([], float(n_retry))
        done = [r for r in rows if r.running_again_at is not None and r.onset is not None]
        recover.add_metric([], len(done), float(sum(r.running_again_at - r.onset for r in done)))
        lost.add_metric([], float(sum(r.gpu_hours_lost or 0.0 for r in rows)))
        cluster: dict[str, float] = dict.fromkeys(CAUSES, 0.0)
        jobs: dict[tuple[str, str], float] = {}
        current = _current_jobs(rows, clock.now(self.engine) - JOB_SERIES_S)
        for r in rows:
            for cause, gpu_s in lost_by_cause(r).items():
                cluster[cause] += gpu_s
                if r.job_id in current:
                    jobs[(r.job_id, cause)] = jobs.get((r.job_id, cause), 0.0) + gpu_s
        for cause, gpu_s in cluster.items():
            by_cause.add_metric([cause], gpu_s)
        for (job_id, cause), gpu_s in sorted(jobs.items()):
            by_job.add_metric([job_id, cause], gpu_s)
        yield from (total, pending, retry, recover, lost, by_cause, by_job)

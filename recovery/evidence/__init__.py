"""Evidence collectors: each returns observations plus a connector report, and each is optional.

Observations come in three shapes shared by the live collectors (Prometheus, log files or Loki,
Slurm) and the offline recording reader, so attribution runs the same on both:
`LogLine` (one line of a job or kernel log), `Series` (one metric series over the window) and
`SlurmFacts` (job and node states). A collector never raises: a failure becomes an `error`
report and an empty result.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from recovery import validate
from recovery.clock import WALL
from recovery.settings import Settings


@dataclass
class LogLine:
    path: str  # file path, or the Loki query that returned the line
    line: int | None
    text: str
    time: float | None = None
    node: str | None = None
    job_id: str | None = None
    kind: str = "job"  # job | kernel


@dataclass
class Series:
    name: str
    points: list[tuple[float, float]]
    node: str | None = None
    gpu: str | None = None
    job_id: str | None = None
    query: str = ""


@dataclass
class SlurmFacts:
    job: dict[str, Any] = field(default_factory=dict)  # job_id, name, state, exit_code, ...
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)  # node -> {state, reason}
    query: str = ""


@dataclass
class Report:
    connector: str
    status: str  # ok | empty | error
    reason: str = ""
    latency_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "connector": self.connector,
            "status": self.status,
            "reason": self.reason[:500],
            "latency_s": round(self.latency_s, 4),
        }


@dataclass
class Bundle:
    lines: list[LogLine] = field(default_factory=list)
    series: list[Series] = field(default_factory=list)
    slurm: SlurmFacts = field(default_factory=SlurmFacts)
    reports: list[Report] = field(default_factory=list)

    def extend(self, other: Bundle) -> None:
        self.lines += other.lines
        self.series += other.series
        if other.slurm.job or other.slurm.nodes:
            self.slurm.job.update(other.slurm.job)
            self.slurm.nodes.update(other.slurm.nodes)
            self.slurm.query = self.slurm.query or other.slurm.query
        self.reports += other.reports


@dataclass
class Context:
    """What an incident is about: validated ids and the time window."""

    job_id: str | None
    nodes: list[str]
    start: float
    end: float
    job_name: str | None = None
    gpus: list[tuple[str, str]] = field(default_factory=list)
    alerts: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.job_id is not None:
            validate.job_id(self.job_id)
        for n in self.nodes:
            validate.node(n)
        for n, g in self.gpus:
            validate.node(n)
            validate.gpu(g)

    @classmethod
    def from_incident(
        cls, incident: dict[str, Any], settings: Settings, now: float | None = None
    ) -> Context:
        now = getattr(settings, "clock", WALL).now() if now is None else now
        alerts = incident.get("alerts", [])
        nodes = sorted(
            {a["node"] for a in alerts if a.get("node")}
            | ({incident["node"]} if incident.get("node") else set())
        )
        gpus = sorted({(a["node"], a["gpu"]) for a in alerts if a.get("node") and a.get("gpu")})
        first = incident.get("first_alert_at") or incident.get("opened_at") or now
        return cls(
            job_id=incident.get("job_id"),
            nodes=nodes,
            gpus=gpus,
            start=first - settings.lookback_s,
            end=min(now, first + settings.lookahead_s) if first < now else now,
            alerts=alerts,
        )


class Sources(Protocol):
    """Slurm and Prometheus evidence from elsewhere than the live services (`Settings.sources`:
    the benchmark's simulation, behind the same types); logs are read from `log_dir` either way."""

    def slurm(self, ctx: Context, settings: Settings) -> Bundle: ...

    def prometheus(self, ctx: Context, settings: Settings) -> Bundle: ...

    def jobs_on_node(self, node: str) -> list[str]: ...


def timed(connector: str, fn: Callable[[], Bundle]) -> Bundle:
    """Run a collector; any exception becomes an `error` report."""
    t0 = time.monotonic()
    try:
        out = fn()
    except Exception as exc:  # noqa: BLE001 - a collector never blocks the verdict
        return Bundle(
            reports=[
                Report(connector, "error", f"{type(exc).__name__}: {exc}", time.monotonic() - t0)
            ]
        )
    for r in out.reports:
        if r.connector == connector and not r.latency_s:
            r.latency_s = time.monotonic() - t0
    return out


def collect_live(ctx: Context, settings: Settings) -> Bundle:
    """Slurm first (it names the job's nodes), then logs and Prometheus over those nodes."""
    from recovery.evidence import logs, prometheus, slurm

    src = getattr(settings, "sources", None)
    slurm_collect = slurm.collect if src is None else src.slurm
    prometheus_collect = prometheus.collect if src is None else src.prometheus
    bundle = Bundle()
    if settings.slurm_enabled:
        bundle.extend(timed("slurm", lambda: slurm_collect(ctx, settings)))
    else:
        bundle.reports.append(Report("slurm", "error", "Slurm evidence is disabled"))
    job_nodes = [n for n in bundle.slurm.job.get("nodes") or [] if validate.NODE.fullmatch(n)]
    # Slurm's order first: rank r runs on job_nodes[r // gpus_per_node]
    ctx.nodes[:] = job_nodes + [n for n in ctx.nodes if n not in job_nodes]
    ctx.job_name = ctx.job_name or bundle.slurm.job.get("name")
    bundle.extend(timed("logs", lambda: logs.collect(ctx, settings)))
    if settings.loki_url:
        bundle.extend(timed("loki", lambda: logs.collect_loki(ctx, settings)))
    bundle.extend(timed("prometheus", lambda: prometheus_collect(ctx, settings)))
    return bundle

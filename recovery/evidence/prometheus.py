"""Prometheus evidence: range queries around the incident for the job's nodes and GPUs.

DCGM fields (selected by `hpc_job` for a job, and by the host label on its nodes where no
series carries `hpc_job`: dcgm-exporter maps jobs only when told to), the detector's scores
and the log-derived job metrics. The first transport error ends the collection with an
`error` report: a Prometheus that is down costs one timeout, not one per query.
"""

from __future__ import annotations

from catalogue import promql
from clients.prometheus import PromClient, PromError
from recovery import validate
from recovery.evidence import Bundle, Context, Report, Series
from recovery.settings import Settings

DCGM_FIELDS = (
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_THERMAL_VIOLATION",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_FB_USED",  # memory held: an idle GPU of a live process (hang), not a dead one
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",  # hardware slowdown bits (the hw_slowdown prior)
)
JOB_METRICS = (
    "goodput_job_last_progress_timestamp_seconds",
    "goodput_job_iteration",
    "goodput_job_iteration_seconds",
    "goodput_job_nan_iterations_total",
)
PRESENCE = "DCGM_FI_DEV_GPU_UTIL"
DETECTOR_METRICS = (
    "goodput_node_suspect_score",
    "goodput_gpu_anomaly_score",
    "goodput_job_baseline_iteration_seconds",  # the job's learned step time (`slowdown` rule)
    "goodput_job_baseline_gpu_utilization_percent",  # and busy utilisation (`host_bound`)
    "goodput_job_pause_allowance_seconds",  # how long its open pause may last (`pause_overrun`)
)
HOSTS = ("Hostname", "hostname")  # dcgm-exporter's host label, old and new spelling


def queries(ctx: Context) -> list[str]:
    """The PromQL expressions for `ctx` (ids validated, then quoted by `catalogue.promql`)."""
    sel = promql.selector
    out: list[str] = []
    nodes = [validate.node(n) for n in ctx.nodes]
    if ctx.job_id:
        j = validate.job_id(ctx.job_id)
        for m in DCGM_FIELDS:  # the job's GPUs by hpc_job, or, where dcgm-exporter maps no
            # jobs (its default), its nodes' GPUs without the label
            unmapped = [sel(m, **{h: nodes}, hpc_job="") for h in HOSTS] if nodes else []
            out.append(" or ".join([sel(m, hpc_job=j), *unmapped]))
        out += [sel(m, job_id=j) for m in JOB_METRICS + DETECTOR_METRICS]
    if nodes and not ctx.job_id:
        for m in DCGM_FIELDS:
            out += [sel(m, Hostname=nodes), sel(m, hostname=nodes)]
    if nodes:
        out.append(sel("goodput_node_xid_errors_total", node=nodes))
        # one series per (node, gpu) whatever job runs there: hpc_job changes split series
        out += [f"max by ({h}, gpu) ({sel(PRESENCE, **{h: nodes})})" for h in HOSTS]
    return out


def _series(
    name: str, metric: dict[str, str], points: list[tuple[float, float]], query: str
) -> Series | None:
    node = metric.get("node") or metric.get("Hostname") or metric.get("hostname")
    gpu = metric.get("gpu")
    job = metric.get("job_id") or metric.get("hpc_job")
    if node is not None and not validate.NODE.fullmatch(node):
        return None
    if gpu is not None and not validate.GPU.fullmatch(gpu):
        gpu = None
    if job is not None and not validate.JOB_ID.fullmatch(job):
        job = None
    return Series(name=name, points=points, node=node, gpu=gpu, job_id=job, query=query)


def collect(ctx: Context, settings: Settings) -> Bundle:
    if not settings.prometheus_url:
        return Bundle(reports=[Report("prometheus", "error", "Prometheus is not configured")])
    prom = PromClient(settings.prometheus_url, timeout=settings.http_timeout_s)
    step = max(5.0, (ctx.end - ctx.start) / 300.0)
    series: list[Series] = []
    failed = []
    for q in queries(ctx):
        try:
            result = prom.query_range(q, ctx.start, ctx.end, step)
        except PromError as exc:
            if exc.status is None:  # no answer: the next query would wait as long
                return Bundle(
                    series=series, reports=[Report("prometheus", "error", str(exc)[:300])]
                )
            failed.append(f"{q}: HTTP {exc.status}: {exc.reason[:100]}")
            continue
        for metric, points in result:
            name = metric.get("__name__") or q.split("{", 1)[0]
            if q.startswith("max by ("):
                name = "node_presence"  # the nodes' GPUs whatever job runs there
            s = _series(name, metric, points, q)
            if s is not None and s.points:
                series.append(s)
    if failed and not series:
        return Bundle(reports=[Report("prometheus", "error", "; ".join(failed)[:300])])
    status = "ok" if series else "empty"
    reason = "; ".join(failed)[:300] if failed else ("" if series else "no series in window")
    return Bundle(series=series, reports=[Report("prometheus", status, reason)])

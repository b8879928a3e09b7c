"""Goodput's Grafana dashboards as code (grafana-foundation-sdk, Grafana 11.6 schema).

`build_all()` returns {file name: dashboard JSON dict}; `goodput dashboards generate` writes
them to dashboards/generated/ (committed; a test regenerates and expects no diff). Data
sources are referenced by uid, as compose/grafana provisions them: `goodput-prometheus` and
`goodput-loki`. Template variables: `job_id` and `node`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from grafana_foundation_sdk.builders import dashboard as d
from grafana_foundation_sdk.builders import logs, loki, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    VariableRefresh,
    VariableSort,
)

PROM = DataSourceRef(type_val="prometheus", uid="goodput-prometheus")
LOKI = DataSourceRef(type_val="loki", uid="goodput-loki")
CONSOLE = "http://127.0.0.1:19430"
JOB = 'job_id=~"$job_id"'
NODE = 'node=~"$node"'


def q(expr: str, legend: str = "", instant: bool = False) -> prometheus.Dataquery:
    query = prometheus.Dataquery().expr(expr).datasource(PROM)
    if legend:
        query = query.legend_format(legend)
    return query.instant() if instant else query.range()


def ts(title: str, *queries: prometheus.Dataquery, unit: str = "", w: int = 12, h: int = 8):
    p = timeseries.Panel().title(title).datasource(PROM).span(w).height(h)
    for query in queries:
        p = p.with_target(query)
    return p.unit(unit) if unit else p


def st(title: str, expr: str, unit: str = "", w: int = 4) -> stat.Panel:
    p = stat.Panel().title(title).datasource(PROM).span(w).height(4).with_target(q(expr))
    return p.unit(unit) if unit else p


def tbl(title: str, expr: str, w: int = 24, h: int = 8) -> table.Panel:
    query = q(expr, instant=True).format("table")  # type: ignore[arg-type]
    return table.Panel().title(title).datasource(PROM).span(w).height(h).with_target(query)


def var(name: str, label: str, query: str, multi: bool) -> d.QueryVariable:
    v = (
        d.QueryVariable(name)
        .label(label)
        .datasource(PROM)
        .query(query)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
    )
    return v.multi(True).include_all(True).all_value(".*") if multi else v


def base(uid: str, title: str, description: str) -> d.Dashboard:
    return (
        d.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["goodput"])
        .time("now-30m", "now")
        .refresh("10s")
        .timezone("browser")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .link(d.DashboardLink("Goodput").type("dashboards").tags(["goodput"]).as_dropdown(True))  # type: ignore[arg-type]
        .link(d.DashboardLink("Recovery Console").type("link").url(f"{CONSOLE}/incidents"))  # type: ignore[arg-type]
    )


def cluster() -> d.Dashboard:
    return (
        base("goodput-cluster", "Goodput / Cluster overview", "GPUs, jobs, health, incidents.")
        .with_row(d.Row("Now"))
        .with_panel(st("GPUs reporting", "count(goodput:dcgm_gpu_util:by_gpu) or vector(0)"))
        .with_panel(
            st("GPUs in jobs", 'count(goodput:dcgm_gpu_util:by_gpu{job_id!=""}) or vector(0)')
        )
        .with_panel(
            st(
                "Running jobs",
                'count(goodput_slurm_job_state{state=~"(?i)running"} == 1) or vector(0)',
            )
        )
        .with_panel(
            st(
                "Nodes drained or down",
                'count(goodput_slurm_node_state{state=~"(?i).*(drain|down).*"} == 1) or vector(0)',
            )
        )
        .with_panel(
            st(
                "Goodput alerts firing",
                'count(ALERTS{alertstate="firing", alertname=~"Goodput.+"}) or vector(0)',
            )
        )
        .with_panel(st("Open incidents", 'sum(goodput_incidents{state="open"}) or vector(0)'))
        .with_panel(st("ETTR (last hour)", "goodput:cluster_ettr:1h", "percentunit"))
        .with_row(d.Row("Health"))
        .with_panel(
            ts(
                "GPU utilisation by node",
                q("avg by (node) (goodput:dcgm_gpu_util:by_gpu)", "{{node}}"),
                unit="percent",
            )
        )
        .with_panel(
            ts(
                "GPU power by node",
                q("sum by (node) (goodput:dcgm_power_watts:by_gpu)", "{{node}}"),
                unit="watt",
            )
        )
        .with_panel(
            ts(
                "Job anomaly score (combined; 1 = alert threshold)",
                q('max by (job_id) (goodput_job_anomaly_score{detector="combined"})', "{{job_id}}"),
            )
        )
        .with_panel(
            ts(
                "GPUs per node",
                q("goodput:node_gpus:count", "{{node}}"),
            )
        )
        .with_row(d.Row("Incidents and actions"))
        .with_panel(
            tbl(
                "Firing Goodput alerts",
                'ALERTS{alertstate="firing", alertname=~"Goodput.+"}',
            )
        )
        .with_panel(
            ts(
                "Recovery actions",
                q("sum by (action, result) (goodput_actions_total)", "{{action}} {{result}}"),
            )
        )
        .with_panel(
            ts(
                "Incidents by state",
                q("sum by (state) (goodput_incidents)", "{{state}}"),
            )
        )
    )


def job() -> d.Dashboard:
    return (
        base(
            "goodput-job",
            "Goodput / Job drill-down",
            "One job: progress, per-GPU and per-node metrics with anomaly scores, events, logs.",
        )
        .with_variable(
            var("job_id", "Job", "label_values(goodput:dcgm_gpu_util:by_gpu, job_id)", False)
        )
        .with_variable(
            var(
                "node",
                "Node",
                'label_values(goodput:dcgm_gpu_util:by_gpu{job_id=~"$job_id"}, node)',
                True,
            )
        )
        .with_row(d.Row("Progress"))
        .with_panel(
            ts("Iteration", q(f"max by (job_id) (goodput_job_iteration{{{JOB}}})", "{{job_id}}"))
        )
        .with_panel(
            ts(
                "Seconds since last progress",
                q(
                    "time() - max by (job_id) "
                    f"(goodput_job_last_progress_timestamp_seconds{{{JOB}}})",
                    "{{job_id}}",
                ),
                unit="s",
            )
        )
        .with_panel(
            ts(
                "Iteration time",
                q(f"goodput_job_iteration_seconds{{{JOB}}}", "{{job_id}}"),
                unit="s",
                w=8,
            )
        )
        .with_panel(
            ts(
                "Throughput",
                q(f"goodput_job_throughput_samples_per_second{{{JOB}}}", "{{job_id}}"),
                w=8,
            )
        )
        .with_panel(ts("Loss", q(f"goodput_job_loss{{{JOB}}}", "{{job_id}}"), w=8))
        .with_row(d.Row("Anomaly scores (1 = alert threshold)"))
        .with_panel(
            ts(
                "Job score by detector",
                q(f"goodput_job_anomaly_score{{{JOB}}}", "{{detector}}"),
                w=8,
            )
        )
        .with_panel(
            ts(
                "Node suspect score",
                q(f"goodput_node_suspect_score{{{JOB}, {NODE}}}", "{{node}}"),
                w=8,
            )
        )
        .with_panel(
            ts(
                "GPU anomaly score",
                q(f"goodput_gpu_anomaly_score{{{JOB}, {NODE}}}", "{{node}}/{{gpu}}"),
                w=8,
            )
        )
        .with_panel(
            ts(
                "Node score by detector",
                q(f"goodput_node_anomaly_score{{{JOB}, {NODE}}}", "{{node}} {{detector}}"),
                w=12,
            )
        )
        .with_panel(
            ts(
                "GPUs over their alert level, by the detector that drives them",
                q(
                    f"goodput_gpu_anomaly_driver_score{{{JOB}, {NODE}}}",
                    "{{node}}/{{gpu}} {{detector}}",
                ),
                w=12,
            )
        )
        .with_row(d.Row("GPUs"))
        .with_panel(
            ts(
                "GPU utilisation",
                q(f"goodput:dcgm_gpu_util:by_gpu{{{JOB}, {NODE}}}", "{{node}}/{{gpu}}"),
                unit="percent",
            )
        )
        .with_panel(
            ts(
                "SM active",
                q(f"goodput:dcgm_sm_active:by_gpu{{{JOB}, {NODE}}}", "{{node}}/{{gpu}}"),
                unit="percentunit",
            )
        )
        .with_panel(
            ts(
                "Power",
                q(f"goodput:dcgm_power_watts:by_gpu{{{JOB}, {NODE}}}", "{{node}}/{{gpu}}"),
                unit="watt",
            )
        )
        .with_panel(
            ts(
                "Temperature",
                q(
                    f"goodput:dcgm_gpu_temp_celsius:by_gpu{{{JOB}, {NODE}}}",
                    "{{node}}/{{gpu}}",
                ),
                unit="celsius",
            )
        )
        .with_panel(
            ts(
                "Power per node (job)",
                q(
                    f"sum by (node) (goodput:dcgm_power_watts:by_gpu{{{JOB}, {NODE}}})",
                    "{{node}}",
                ),
                unit="watt",
            )
        )
        .with_panel(
            ts(
                "SM clock",
                q(f"goodput:dcgm_sm_clock_mhz:by_gpu{{{JOB}, {NODE}}}", "{{node}}/{{gpu}}"),
                unit="rotmhz",
            )
        )
        .with_row(d.Row("Events"))
        .with_panel(
            ts(
                "Log pattern matches",
                q(
                    f"sum by (pattern, node) (goodput_log_pattern_matches_total{{{JOB}}})",
                    "{{pattern}} {{node}}",
                ),
            )
        )
        .with_panel(
            ts(
                "Last XID per GPU",
                q(
                    f"goodput:dcgm_xid_last:by_gpu{{{JOB}, {NODE}}} > 0",
                    "{{node}}/{{gpu}}",
                ),
            )
        )
        .with_panel(
            tbl(
                "Goodput alerts for this job",
                f'ALERTS{{alertname=~"Goodput.+", {JOB}}}',
                w=12,
            )
        )
        .with_panel(
            ts(
                "Restarts",
                q(f"goodput_slurm_job_restarts{{{JOB}}}", "{{job_id}}"),
                w=12,
            )
        )
        .with_row(d.Row("Logs"))
        .with_panel(
            logs.Panel()
            .title("Job log (Loki)")
            .datasource(LOKI)
            .span(24)
            .height(12)
            .with_target(loki.Dataquery().expr('{job_id=~"$job_id"}').datasource(LOKI))
        )
    )


def incidents() -> d.Dashboard:
    return (
        base(
            "goodput-incidents",
            "Goodput / Incidents and actions",
            "The recovery receiver: incidents, diagnoses, actions, and goodput accounting.",
        )
        .with_row(d.Row("Goodput accounting"))
        .with_panel(st("GPU-hours lost", "sum(goodput_gpu_hours_lost_total) or vector(0)", w=6))
        .with_panel(
            st(
                "Mean time to recover",
                "sum(goodput_incident_time_to_recover_seconds_sum)"
                " / clamp_min(sum(goodput_incident_time_to_recover_seconds_count), 1)",
                unit="s",
                w=6,
            )
        )
        .with_panel(
            st(
                "Median time to detect",
                "histogram_quantile(0.5, sum by (le) "
                "(goodput_incident_time_to_detect_seconds_bucket))",
                unit="s",
                w=6,
            )
        )
        .with_panel(st("Actions pending", "sum(goodput_actions_pending) or vector(0)", w=6))
        .with_row(d.Row("Effective training time ratio (ETTR)"))
        .with_panel(st("Cluster ETTR (last hour)", "goodput:cluster_ettr:1h", "percentunit", w=6))
        .with_panel(
            ts(
                "ETTR (last hour): cluster and per job",
                q("goodput:cluster_ettr:1h", "cluster"),
                q("goodput:job_ettr:1h", "job {{job_id}}"),
                unit="percentunit",
                w=18,
            )
        )
        .with_panel(
            ts(
                "GPU-seconds lost by cause (last hour)",
                q(
                    "sum by (cause) (increase(goodput_gpu_seconds_lost_total[1h]))",
                    "{{cause}}",
                ),
                unit="s",
            )
        )
        .with_panel(
            ts(
                "Receiver acting (0: its watchdog stopped it)",
                q("goodput_receiver_acting", "{{reason}}"),
            )
        )
        .with_row(d.Row("Incidents"))
        .with_panel(ts("Incidents by state", q("sum by (state) (goodput_incidents)", "{{state}}")))
        .with_panel(
            ts("Incidents by outcome", q("sum by (outcome) (goodput_incidents)", "{{outcome}}"))
        )
        .with_panel(
            ts(
                "Alerts received",
                q(
                    "sum by (status) "
                    "(rate(goodput_receiver_alerts_received_total[$__rate_interval]))",
                    "{{status}}",
                ),
                unit="reqps",
            )
        )
        .with_panel(
            ts(
                "Diagnosis latency",
                q(
                    "histogram_quantile(0.95, sum by (le) "
                    "(rate(goodput_diagnosis_duration_seconds_bucket[$__rate_interval])))",
                    "p95",
                ),
                q(
                    "histogram_quantile(0.5, sum by (le) "
                    "(rate(goodput_diagnosis_duration_seconds_bucket[$__rate_interval])))",
                    "p50",
                ),
                unit="s",
            )
        )
        .with_row(d.Row("Actions"))
        .with_panel(
            ts(
                "Actions by kind and result",
                q("sum by (action, result) (goodput_actions_total)", "{{action}} {{result}}"),
            )
        )
        .with_panel(
            ts(
                "GPU-hours lost",
                q("sum(goodput_gpu_hours_lost_total)", "GPU-hours"),
            )
        )
        .with_panel(
            ts(
                "Evidence connector errors",
                q(
                    "sum by (connector) (rate(goodput_connector_errors_total[$__rate_interval]))",
                    "{{connector}}",
                ),
                w=24,
            )
        )
    )


def detector() -> d.Dashboard:
    return (
        base(
            "goodput-detector",
            "Goodput / Detector and exporters health",
            "Is Goodput itself working: detector cycles, query errors, scrape health.",
        )
        .with_panel(st("Detector up", 'max(up{job="goodput-detector"}) or vector(0)', w=6))
        .with_panel(
            st(
                "Seconds since last detector cycle",
                "time() - max(goodput_detector_last_cycle_timestamp_seconds)",
                unit="s",
                w=6,
            )
        )
        .with_panel(st("Series scored", "sum(goodput_detector_series_scored)", w=6))
        .with_panel(st("Slurm readable", "max(goodput_slurm_up) or vector(0)", w=6))
        .with_panel(
            ts(
                "Detector cycle time, per replica",
                q(
                    "goodput_detector_cycle_seconds * on (instance) group_left (shard) "
                    "goodput_detector_shard_info",
                    "shard {{shard}}",
                ),
                unit="s",
            )
        )
        .with_panel(
            ts(
                "Detector cycle phases (slowest replica)",
                q("max by (phase) (goodput_detector_cycle_phase_seconds)", "{{phase}}"),
                unit="s",
            )
        )
        .with_panel(
            ts(
                "Detector query errors",
                q("rate(goodput_detector_query_errors_total[$__rate_interval])", "errors/s"),
            )
        )
        .with_panel(
            ts(
                "Scrape targets up",
                q('up{job=~"goodput-.+|dcgm"}', "{{job}} {{instance}}"),
            )
        )
        .with_panel(
            ts(
                "Slurm exporter scrape duration",
                q("goodput_slurm_scrape_duration_seconds", "scrape"),
                unit="s",
            )
        )
        .with_panel(
            ts(
                "Log lines read",
                q("sum(rate(goodput_log_lines_total[$__rate_interval]))", "lines/s"),
            )
        )
        .with_panel(
            ts(
                "Goodput alerts firing, by name",
                q(
                    'count by (alertname) (ALERTS{alertstate="firing", alertname=~"Goodput.+"})',
                    "{{alertname}}",
                ),
            )
        )
    )


DASHBOARDS: dict[str, Callable[[], d.Dashboard]] = {
    "cluster-overview.json": cluster,
    "job-drilldown.json": job,
    "incidents-actions.json": incidents,
    "detector-health.json": detector,
}


def to_dict(dash: d.Dashboard) -> dict[str, Any]:
    """The dashboard JSON, with unique panel ids and query refIds (A, B, ...) filled in."""
    model = json.loads(json.dumps(dash.build(), cls=JSONEncoder))
    for i, p in enumerate(panels(model), start=1):
        p["id"] = i
        for j, t in enumerate(p.get("targets", [])):
            t["refId"] = t.get("refId") or chr(ord("A") + j)
    return model


def build_all() -> dict[str, dict[str, Any]]:
    """{file name: dashboard JSON} for every Goodput dashboard."""
    return {name: to_dict(make()) for name, make in DASHBOARDS.items()}


def dumps(model: dict[str, Any]) -> str:
    return json.dumps(model, indent=2, sort_keys=True) + "\n"


def panels(model: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel of a dashboard JSON, rows' nested panels included."""
    for p in model.get("panels", []):
        yield p
        yield from p.get("panels", [])


def queries(model: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(panel title, datasource type, expr) for every query target, variables included."""
    for p in panels(model):
        for t in p.get("targets", []):
            ds = (t.get("datasource") or p.get("datasource") or {}).get("type", "")
            if t.get("expr"):
                yield p.get("title", ""), ds, t["expr"]
    for v in model.get("templating", {}).get("list", []):
        if isinstance(v.get("query"), str):
            yield f"variable {v['name']}", "prometheus-variable", v["query"]

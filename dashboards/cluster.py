"""Goodput / Cluster overview: GPUs, jobs, health, incidents."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as d

from alertdsl.spec import threshold
from dashboards.panels import INCIDENTS, base, once, q, st, tbl, ts

OPEN = once('goodput_incidents{state="open"}', "outcome")


def dashboard() -> d.Dashboard:
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
        .with_panel(
            st(
                "Open incidents",
                f"sum({OPEN}) or vector(0)",
            )
        )
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
                f"Job anomaly score (combined; alert at {threshold('GoodputJobAnomaly'):g})",
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
                q(once("goodput_actions_total", "action, result"), "{{action}} {{result}}"),
            )
        )
        .with_panel(
            ts(
                "Incidents by state",
                q(f"sum by (state) ({INCIDENTS})", "{{state}}"),
            )
        )
    )

"""Goodput / Incidents and actions: the recovery receiver, ETTR and goodput accounting."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as d

from dashboards.panels import INCIDENTS, base, once, q, st, ts


def dashboard() -> d.Dashboard:
    return (
        base(
            "goodput-incidents",
            "Goodput / Incidents and actions",
            "The recovery receiver: incidents, diagnoses, actions, and goodput accounting.",
        )
        .with_row(d.Row("Goodput accounting"))
        .with_panel(
            st("GPU-hours lost", once("goodput_gpu_hours_lost_total") + " or vector(0)", w=6)
        )
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
        .with_panel(st("Actions pending", once("goodput_actions_pending") + " or vector(0)", w=3))
        .with_panel(
            st("Retrying on the scheduler", "max(goodput_actions_retrying) or vector(0)", w=3)
        )
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
                q("goodput:gpu_seconds_lost:1h", "{{cause}}"),
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
        .with_panel(
            ts(
                "Incidents by state",
                q(f"sum by (state) ({INCIDENTS})", "{{state}}"),
            )
        )
        .with_panel(
            ts(
                "Incidents by outcome",
                q(f"sum by (outcome) ({INCIDENTS})", "{{outcome}}"),
            )
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
                q(once("goodput_actions_total", "action, result"), "{{action}} {{result}}"),
            )
        )
        .with_panel(
            ts(
                "GPU-hours lost",
                q(once("goodput_gpu_hours_lost_total"), "GPU-hours"),
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

"""Goodput / Detector and exporters health: is Goodput itself working."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as d

from dashboards.panels import base, q, st, ts


def dashboard() -> d.Dashboard:
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

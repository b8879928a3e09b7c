"""Goodput / Job drill-down: progress, per-GPU and per-node metrics with anomaly scores, events,
logs."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as d
from grafana_foundation_sdk.builders import logs, loki

from alertdsl.spec import threshold
from dashboards.panels import JOB, LOKI, NODE, base, q, tbl, ts, var


def dashboard() -> d.Dashboard:
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
        .with_row(
            d.Row(
                "Anomaly scores (1 = each detector's nominal alarm level; alerts at "
                f"{threshold('GoodputJobAnomaly'):g} combined, "
                f"{threshold('GoodputJobHung'):g} progress)"
            )
        )
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

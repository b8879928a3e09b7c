"""The recording directory format shared by the simulator's recorder and `goodput
export-recording` (docs/contracts.md): its version tag and the per-job metric columns of
`job_metrics.csv.gz`, in order."""

from __future__ import annotations

FORMAT = "goodput-recording/1"
JOB_METRICS = (
    "goodput_job_iteration",
    "goodput_job_last_progress_timestamp_seconds",
    "goodput_job_iteration_seconds",
    "goodput_job_throughput_samples_per_second",
    "goodput_job_loss",
    "goodput_job_nan_iterations_total",
    "goodput_job_skipped_iterations_total",
    "goodput_job_last_checkpoint_timestamp_seconds",
    "goodput_job_last_pause_timestamp_seconds",
)

"""The metrics the detector reads, as data: which DCGM fields, their scale floors, the events.

Scale floors keep a robust z-score sane when healthy ranks are nearly identical (MAD ~ 0): a
difference smaller than the floor is never more than one "sigma". Units are dcgm-exporter's.
"""

from __future__ import annotations

from dataclasses import dataclass

import catalogue


@dataclass(frozen=True)
class Field:
    name: str
    floor: float  # smallest scale (one robust sigma) in the field's unit
    default: bool  # on in dcgm-exporter's default counters file


# Gauges scored by the deviation and peer detectors (the "12 metrics").
GAUGES: tuple[Field, ...] = (
    Field("DCGM_FI_DEV_GPU_UTIL", 5.0, True),
    Field("DCGM_FI_DEV_POWER_USAGE", 25.0, True),
    Field("DCGM_FI_DEV_SM_CLOCK", 60.0, True),
    Field("DCGM_FI_DEV_MEM_CLOCK", 60.0, True),
    Field("DCGM_FI_DEV_GPU_TEMP", 3.0, True),
    Field("DCGM_FI_DEV_MEMORY_TEMP", 3.0, True),
    Field("DCGM_FI_DEV_MEM_COPY_UTIL", 5.0, True),
    Field("DCGM_FI_DEV_FB_USED", 2048.0, True),
    Field("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.05, True),
    Field("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.05, True),
    Field("DCGM_FI_PROF_DRAM_ACTIVE", 0.05, True),
    Field("DCGM_FI_PROF_SM_ACTIVE", 0.05, False),
)

# Hardware evidence. "gauge" fields score their value; "counter" fields score the increase over
# the GPU's fitted baseline. `weight` is the score one unit (or the XID table) yields.
XID_FIELD = "DCGM_FI_DEV_XID_ERRORS"
COUNTERS: dict[str, float] = {  # field -> increase that scores 1.0 (the nominal alarm level)
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0.5,  # any double-bit error: score 2
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0.5,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0.5,
    "DCGM_FI_DEV_ROW_REMAP_PENDING": 1.0,
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 100.0,
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 4.0,
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 50.0,
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 100.0,
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 50.0,
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 5.0,
}
# Score of the last XID seen (dcgm's XID gauge): its class's `detector_weight` in
# catalogue/xid.yaml (hardware 2, degradation 1). Application errors (13, 31) and consequences
# (43, 45) score 0: they are left to the logs.
XID_SCORES: dict[int, float] = {
    code: x.weight for code, x in catalogue.default().xids.items() if x.weight > 0
}

# Clock event reasons (a bitmask; read by the physics priors). Newer dcgm-exporter releases
# call it DCGM_FI_DEV_CLOCKS_EVENT_REASONS: readers accept both (`ALIASES`).
THROTTLE = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
ALIASES: dict[str, str] = {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS": THROTTLE}

# Log-derived progress, joined onto every GPU row of the job.
ITER_SECONDS = "goodput_job_iteration_seconds"
ITERATION = "goodput_job_iteration"  # counter; replay derives last progress from it too
LAST_PROGRESS = "goodput_job_last_progress_timestamp_seconds"
STALL_SECONDS = "goodput_job_stall_seconds"  # derived: row time - the job's last progress
# the last line that begins a pause (checkpoint save/load, start-up: catalogue symptom "pause")
LAST_PAUSE = "goodput_job_last_pause_timestamp_seconds"
# derived: seconds since the last pause began (NaN: the job never logged one); the pause is open
# while this is <= the stall (it began at or after the last progress)
SINCE_PAUSE = "goodput_job_since_pause_seconds"
JOB_AGE = "goodput_job_age_seconds"  # derived by the engine: since it first saw the job
PROGRESS: tuple[str, ...] = (ITER_SECONDS, STALL_SECONDS, SINCE_PAUSE, JOB_AGE)

# What the GPU's processes do on the host (the NVML exporter's counter: user + system seconds
# of the processes holding the GPU and their descendants); the detector reads its rate in
# cores, per GPU (derived: PromQL rate(), or per-GPU differences in a recording).
HOST_CPU_COUNTER = "goodput_gpu_process_cpu_seconds_total"
HOST_CPU = "goodput_gpu_process_cpu_cores"
# read as irate() over this window: the latest two samples (a change shows a scrape later),
# of the 4 a 15 s scrape keeps in it (a missed scrape leaves no gap)
HOST_CPU_WINDOW_S = 60.0
DERIVED: tuple[str, ...] = (STALL_SECONDS, SINCE_PAUSE, JOB_AGE, HOST_CPU)  # columns, not metrics

GAUGE_NAMES: tuple[str, ...] = tuple(f.name for f in GAUGES)
ALL_FIELDS: tuple[str, ...] = (
    GAUGE_NAMES + (XID_FIELD, *COUNTERS, THROTTLE) + PROGRESS + (HOST_CPU,)
)
DCGM_FIELDS: tuple[str, ...] = GAUGE_NAMES + (XID_FIELD, *COUNTERS, THROTTLE)
UTIL = "DCGM_FI_DEV_GPU_UTIL"

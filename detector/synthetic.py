"""Synthetic healthy frames (H200-like numbers from the reference measurements) for examples,
tests and the benchmark. Faults are injected by the caller by editing `frame.values`."""

from __future__ import annotations

import numpy as np

from detector import fields as F
from detector.frame import Frame

# field -> (mean, sd) for a healthy training GPU
HEALTHY = {
    "DCGM_FI_DEV_GPU_UTIL": (99.0, 0.5),
    "DCGM_FI_DEV_POWER_USAGE": (690.0, 8.0),
    "DCGM_FI_DEV_SM_CLOCK": (1530.0, 15.0),
    "DCGM_FI_DEV_MEM_CLOCK": (2619.0, 0.0),
    "DCGM_FI_DEV_GPU_TEMP": (58.0, 0.7),
    "DCGM_FI_DEV_MEMORY_TEMP": (62.0, 0.7),
    "DCGM_FI_DEV_MEM_COPY_UTIL": (40.0, 2.0),
    "DCGM_FI_DEV_FB_USED": (70000.0, 50.0),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": (0.96, 0.01),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": (0.72, 0.015),
    "DCGM_FI_PROF_DRAM_ACTIVE": (0.5, 0.015),
    "DCGM_FI_PROF_SM_ACTIVE": (0.96, 0.01),
}


def healthy_frame(
    jobs: int = 1,
    nodes: int = 2,
    gpus: int = 8,
    steps: int = 10,
    seed: int = 0,
    start: float = 0.0,
    interval: float = 5.0,
    step_s: float = 0.5,
    first_job: int = 100,
) -> Frame:
    """`jobs` jobs, each on its own `nodes` x `gpus` GPUs, sampled `steps` times."""
    rng = np.random.default_rng(seed)
    per = nodes * gpus
    n_inst = jobs * per
    n = n_inst * steps
    time = np.repeat(start + interval * np.arange(steps), n_inst)
    job_idx = np.tile(np.repeat(np.arange(jobs), per), steps)
    job = np.array([str(first_job + j) for j in range(jobs)], dtype=object)[job_idx]
    node_idx = np.tile(np.repeat(np.arange(jobs * nodes), gpus), steps)
    node = np.array([f"node{i + 1}" for i in range(jobs * nodes)], dtype=object)[node_idx]
    gpu = np.tile(np.arange(gpus), jobs * nodes * steps).astype(np.int64)
    values = np.full((n, len(F.ALL_FIELDS)), np.nan)
    for name, (mu, sd) in HEALTHY.items():
        values[:, F.ALL_FIELDS.index(name)] = rng.normal(mu, sd, n)
    util = F.ALL_FIELDS.index(F.UTIL)
    values[:, util] = np.minimum(values[:, util], 100.0)
    values[:, F.ALL_FIELDS.index(F.XID_FIELD)] = 0.0
    for c in F.COUNTERS:
        values[:, F.ALL_FIELDS.index(c)] = 0.0
    # progress is per job and instant: the same on every GPU row of the job
    it = rng.normal(step_s, step_s * 0.01, (steps, jobs))
    stall = rng.uniform(0, 10 * step_s, (steps, jobs))
    values[:, F.ALL_FIELDS.index(F.ITER_SECONDS)] = np.repeat(it, per, axis=1).ravel()
    values[:, F.ALL_FIELDS.index(F.STALL_SECONDS)] = np.repeat(stall, per, axis=1).ravel()
    return Frame(time.astype(float), job, node, gpu, values)

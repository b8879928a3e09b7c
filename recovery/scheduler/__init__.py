"""Scheduler port (`base.Scheduler`) and its adapters: `slurm`, `simulated`."""

from __future__ import annotations

import os
from typing import Any

from recovery.scheduler.base import (
    GuardRefused,
    JobState,
    NodeState,
    Scheduler,
    SchedulerBusy,
    SchedulerError,
    SchedulerUnavailable,
)

__all__ = [
    "GuardRefused",
    "JobState",
    "NodeState",
    "Scheduler",
    "SchedulerBusy",
    "SchedulerError",
    "SchedulerUnavailable",
    "from_settings",
]


def from_settings(settings: Any = None) -> Scheduler:
    """The adapter named by `GOODPUT_SCHEDULER` (slurm | simulated; default slurm)."""
    kind = getattr(settings, "scheduler", None) or os.environ.get("GOODPUT_SCHEDULER", "slurm")
    if kind == "simulated":
        from recovery.scheduler.simulated import SimulatedScheduler

        url = getattr(settings, "sim_url", None) or os.environ.get(
            "GOODPUT_SIM_URL", "http://127.0.0.1:19400"
        )
        return SimulatedScheduler(url)
    if kind == "slurm":
        from recovery.scheduler.slurm import SlurmScheduler

        return SlurmScheduler()
    raise ValueError(f"GOODPUT_SCHEDULER={kind!r} is not one of slurm, simulated")

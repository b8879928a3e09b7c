"""Fault kinds as data: ground truth, log/exit behaviour and timing defaults per kind."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FaultKind:
    """What a fault kind is and what the right answer to it is (ground truth)."""

    outcome: str
    culprit: str  # "node": the node (and GPU) are to blame; "none": nobody's hardware is
    action: str
    root_cause: str
    xid: int | None = None
    needs: str = "node"  # "node": target a node (GPU optional); "job": a running job; "none"
    exit_code: int | None = None  # batch script exit status when the job dies (134 = abort)
    defaults: dict[str, Any] = field(default_factory=dict)


FAULT_KINDS: dict[str, FaultKind] = {
    "xid79_off_bus": FaultKind(
        "gpu_hardware_fault",
        "node",
        "drain_and_requeue",
        "GPU fell off the bus",
        79,
        exit_code=1,
        defaults={"crash_after_s": 10},
    ),
    "ecc_dbe": FaultKind(
        "gpu_hardware_fault",
        "node",
        "drain_and_requeue",
        "double-bit ECC error",
        48,
        exit_code=1,
        defaults={"crash_after_s": 5},
    ),
    "gsp_timeout": FaultKind(
        "gpu_hardware_fault",
        "node",
        "drain_and_requeue",
        "GSP RPC timeout",
        119,
        exit_code=1,
        defaults={"crash_after_s": 45},
    ),
    "nvlink_error": FaultKind(
        "gpu_hardware_fault",
        "node",
        "drain_and_requeue",
        "fatal NVLink error",
        74,
        exit_code=1,
        defaults={"crash_after_s": 8},
    ),
    "app_fault": FaultKind(
        "workload_crash",
        "none",
        "requeue",
        "application illegal memory access",
        13,
        needs="job",
        exit_code=134,
        defaults={"crash_after_s": 3, "xid": 13},
    ),
    "degradation": FaultKind(
        "gpu_degradation",
        "node",
        "drain",
        "rising correctable ECC and pending row remap",
        needs="node",
        defaults={"sbe_per_min": 40.0, "remap_after_s": 240, "replays_per_min": 30.0},
    ),
    "ib_flap": FaultKind(
        "network_fault",
        "node",
        "drain_and_requeue",
        "InfiniBand link flapping",
        exit_code=1,
        defaults={"error_after_s": 90, "flaps": 3},
    ),
    "thermal_straggler": FaultKind(
        "straggler",
        "node",
        "drain_and_requeue",
        "one GPU thermally throttled",
        defaults={"slowdown": 1.4},
    ),
    "host_straggler": FaultKind(
        "straggler",
        "node",
        "drain_and_requeue",
        "one host slower than its peers",
        defaults={"slowdown": 1.6},
    ),
    "spin_hang": FaultKind(
        "workload_hang",
        "node",
        "requeue",
        "one rank stuck; peers spin in a collective",
        exit_code=1,
        # culprit_spins=1: the culprit spins on the GPU too (a kernel busy-waiting; one GPU)
        defaults={"timeout_s": 600, "culprit_spins": 0},
    ),
    "dataloader_stall": FaultKind(
        "workload_hang",
        "none",
        "requeue",
        "all ranks stuck on the host (data loader)",
        needs="job",
        defaults={},
    ),
    "node_lost": FaultKind(
        "node_lost",
        "node",
        "drain_and_requeue",
        "node lost power",
        defaults={"slurmd_timeout_s": 10},
    ),
    "fs_stall": FaultKind(
        "filesystem",
        "none",
        "hold_for_person",
        "shared filesystem stall",
        needs="none",
        defaults={"duration_s": 0},
    ),
    "cuda_oom": FaultKind(
        "workload_oom",
        "none",
        "stop",
        "CUDA out of memory",
        needs="job",
        exit_code=1,
        defaults={"crash_after_s": 2},
    ),
    "nan_divergence": FaultKind(
        "workload_divergence",
        "none",
        "stop",
        "loss diverged to NaN",
        needs="job",
    ),
    "segfault": FaultKind(
        "workload_crash",
        "none",
        "requeue",
        "segmentation fault (signal 11)",
        needs="job",
        exit_code=139,
        defaults={"crash_after_s": 1},
    ),
    # any catalogue log pattern (params.pattern): the catalogue gives the line only; outcome,
    # action and culprit are the scenario's `truth` (exporters/sim/signature.py), not from
    # here and never the catalogue's. persists=1: the cause outlives a restart (a missing
    # file): every later run fails the same way once its start-up is over
    "log_signature": FaultKind(
        "stated",
        "stated",
        "stated",
        "the catalogue log signature params.pattern names",
        needs="job",
        exit_code=1,
        defaults={"crash_after_s": 1, "persists": 0},
    ),
}

# "healthy" is a scenario label, not an injectable fault: its truth is a run without faults.
HEALTHY_TRUTH = {"outcome": "healthy", "culprit": "none", "action": "none"}


def kind(name: str) -> FaultKind:
    """The fault kind called `name`; ValueError naming the valid kinds otherwise."""
    try:
        return FAULT_KINDS[name]
    except KeyError:
        raise ValueError(
            f"kind: unknown fault kind {name!r}; one of {sorted(FAULT_KINDS)}"
        ) from None

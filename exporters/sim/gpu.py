"""One simulated GPU: identity, counters and per-tick metric dynamics (failures.md values)."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporters.sim.dcgm import FIELD_NAMES, INDEX, label_string

if TYPE_CHECKING:
    from exporters.sim.background import Trickle


@dataclass(frozen=True)
class Load:
    """What the GPU is doing this tick: util %, ratios 0..1, power W, SM clock MHz, FB share,
    and the CPU cores its processes use on the host (NaN: no process holds the GPU)."""

    util: float
    sm: float
    tensor: float
    power: float
    dram: float
    clock: float
    fb: float
    host: float = 1.0

    def mix(self, other: Load, frac_other: float) -> Load:
        a, b = 1.0 - frac_other, frac_other
        return Load(
            *(
                x * a + y * b
                for x, y in zip(self.__dict__.values(), other.__dict__.values(), strict=True)
            )
        )


# Measured on one H200 (failures.md); NCCL_WAIT is a peer waiting in a collective (a few SMs busy).
# Host cores as measured of real PyTorch processes (tests/data/real/host-cpu/): a process that
# works (start-up, a save, the training loop's host thread, a synchronize that spins while a
# rank waits) about a core; one stuck on the host (HOST_STALL) under 0.01.
NO_PROCESS = float("nan")
IDLE = Load(0, 0, 0, 81, 0, 345, 0.004, NO_PROCESS)
EXITED = Load(0, 0, 0, 124, 0, 1980, 0.004, NO_PROCESS)  # the process ended, power settling
INIT = Load(0, 0, 0, 124, 0.01, 1980, 0.35)  # process alive, NCCL init / data loading
TRAIN = Load(99, 0.96, 0.72, 690, 0.55, 1530, 0.74)
NAN = Load(99, 0.96, 0.70, 630, 0.52, 1560, 0.74)
EVAL = Load(97, 0.85, 0.55, 520, 0.45, 1700, 0.74)
CKPT = Load(0, 0.0, 0.0, 135, 0.0, 1980, 0.74)  # a save: 0 % at 128-147 W (measured)
SPIN = Load(100, 0.008, 0.0, 125, 0.0, 1980, 0.74)
HOST_STALL = Load(0, 0, 0, 124, 0, 1980, 0.74, 0.005)
NCCL_WAIT = Load(100, 0.12, 0.0, 180, 0.05, 1980, 0.74)
THROTTLED = Load(99, 0.95, 0.70, 470, 0.50, 1100, 0.74)

HOST_CPU_COUNTER = "goodput_gpu_process_cpu_seconds_total"  # the NVML exporter's
_BUSES = [0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB]
THROTTLE_SW_POWER_CAP = 0x4
THROTTLE_HW_THERMAL = 0x40
THROTTLE_SW_THERMAL = 0x20


class GPU:
    """A GPU's identity and state. `values` holds the current sample in dcgm.FIELDS order."""

    def __init__(self, node_name: str, index: int, model_name: str, fb_total_mib: int) -> None:
        self.node_name = node_name
        self.index = index
        self.model_name = model_name
        self.fb_total = fb_total_mib
        h = hashlib.sha256(f"{node_name}/{index}".encode()).hexdigest()
        self.uuid = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
        self.pci_bus_id = f"00000000:{_BUSES[index % 8]:02X}:00.0"
        self.job_id = ""
        self.off_bus = False
        self.thermal = False  # throttled by temperature (thermal straggler)
        self.exit_t = -1e18  # when the last process on it ended
        self.temp = 34.0
        self.power_bias = 1.0 + (int(h[32:34], 16) - 128) / 128 * 0.02
        self.counters = dict.fromkeys(FIELD_NAMES, 0.0)
        self.xid = 0
        self.degrade: dict[str, float] | None = None  # rates while degrading
        self.trickle: Trickle | None = None  # benign background errors (sim/background.py)
        self.values = [0.0] * len(FIELD_NAMES)
        self._labels: dict[tuple[str, str], str] = {}

    def labels(self, host_label: str) -> str:
        key = (self.job_id, host_label)
        s = self._labels.get(key)
        if s is None:
            if len(self._labels) > 8:
                self._labels.clear()
            s = self._labels[key] = label_string(self, host_label)
        return s

    def bump(self, field: str, amount: float) -> None:
        self.counters[field] += amount

    def update(self, load: Load, now: float, dt: float, rng: random.Random) -> None:
        """Advance counters and temperature by dt under `load`; write `values`."""
        if load is IDLE and now - self.exit_t < 90:
            load = EXITED.mix(IDLE, (now - self.exit_t) / 90)
        throttle = 0
        if self.thermal and load.util > 50:
            load = THROTTLED
            throttle = THROTTLE_HW_THERMAL | THROTTLE_SW_THERMAL
            target_temp = 88.0
            self.bump("DCGM_FI_DEV_THERMAL_VIOLATION", dt * 1e9 * 0.8)  # ns, as DCGM counts
        else:
            target_temp = 33.0 + (load.power - 80.0) * 0.04
        if load.power > 650:
            throttle |= THROTTLE_SW_POWER_CAP
            self.bump("DCGM_FI_DEV_POWER_VIOLATION", dt * 1e6 * 0.3)
        j = rng.gauss
        power = max(60.0, load.power * self.power_bias * (1 + j(0, 0.012)))
        self.temp += (target_temp - self.temp) * min(1.0, dt / 40.0)
        util = min(100.0, max(0.0, round(load.util + (j(0, 0.6) if 0 < load.util < 100 else 0))))
        busy = load.util > 0
        c = self.counters
        c["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] += power * dt * 1000
        c["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] += (load.tensor * 4.5e5 * dt) if busy else 0
        if self.degrade:
            self._degrade(dt, rng)
        if self.trickle is not None:  # its own generator: `rng`'s stream stays
            self.trickle.tick(c, now)
        v = self.values
        v[INDEX["DCGM_FI_DEV_SM_CLOCK"]] = round(load.clock + (j(0, 8) if busy else 0))
        v[INDEX["DCGM_FI_DEV_MEM_CLOCK"]] = 3201 if load.power > 100 else 1593
        v[INDEX["DCGM_FI_DEV_GPU_TEMP"]] = round(self.temp + j(0, 0.3))
        v[INDEX["DCGM_FI_DEV_MEMORY_TEMP"]] = round(self.temp + 4 + j(0, 0.3))
        v[INDEX["DCGM_FI_DEV_POWER_USAGE"]] = power
        v[INDEX["DCGM_FI_DEV_GPU_UTIL"]] = util
        v[INDEX["DCGM_FI_DEV_MEM_COPY_UTIL"]] = round(load.dram * 60)
        v[INDEX["DCGM_FI_DEV_ENC_UTIL"]] = 0
        v[INDEX["DCGM_FI_DEV_DEC_UTIL"]] = 0
        v[INDEX["DCGM_FI_DEV_XID_ERRORS"]] = self.xid
        used = round(self.fb_total * min(0.995, load.fb) + (j(0, 40) if load.fb > 0.1 else 0))
        v[INDEX["DCGM_FI_DEV_FB_USED"]] = used
        v[INDEX["DCGM_FI_DEV_FB_FREE"]] = self.fb_total - used
        v[INDEX["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"]] = throttle
        # the graphics engine is active while any kernel is resident (as util says), even when
        # one spinning kernel keeps a single SM busy: GR_ENGINE follows util, SM_ACTIVE the SMs
        v[INDEX["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]] = _ratio(util / 100 + j(0, 0.004) * busy)
        v[INDEX["DCGM_FI_PROF_SM_ACTIVE"]] = _ratio(load.sm + j(0, 0.006) * busy)
        v[INDEX["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]] = _ratio(load.tensor + j(0, 0.006) * busy)
        v[INDEX["DCGM_FI_PROF_DRAM_ACTIVE"]] = _ratio(load.dram + j(0, 0.005) * busy)
        v[INDEX["DCGM_FI_PROF_PCIE_TX_BYTES"]] = round(2.0e8 * load.dram + 1.2e6)
        v[INDEX["DCGM_FI_PROF_PCIE_RX_BYTES"]] = round(3.5e8 * load.dram + 1.5e6)
        for name in _COUNTER_FIELDS:
            v[INDEX[name]] = c[name]
        if load.host == load.host:  # a process holds the GPU: its CPU time grows (no draw
            c[HOST_CPU_COUNTER] += load.host * dt  # from `rng`: the scenarios' streams stay)
            v[INDEX[HOST_CPU_COUNTER]] = c[HOST_CPU_COUNTER]
        else:  # none: no sample (the exporter's counter goes on from here when one comes)
            v[INDEX[HOST_CPU_COUNTER]] = NO_PROCESS

    def _degrade(self, dt: float, rng: random.Random) -> None:
        d = self.degrade or {}
        d["age"] = d.get("age", 0.0) + dt
        growth = 1.0 + d["age"] / 300.0  # the error rate accelerates
        sbe = _poisson(rng, d.get("sbe_per_min", 40.0) / 60.0 * dt * growth)
        self.bump("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", sbe)
        self.bump("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", sbe)
        self.bump(
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
            _poisson(rng, d.get("replays_per_min", 30.0) / 60.0 * dt),
        )
        if d["age"] >= d.get("remap_after_s", 240.0) and not d.get("remapped"):
            d["remapped"] = 1.0
            self.bump("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 1)
            self.counters["DCGM_FI_DEV_ROW_REMAP_PENDING"] = 1

    def repair(self) -> None:
        """A GPU reset: the XID, pending remaps and off-bus state clear; counters persist."""
        self.off_bus = False
        self.thermal = False
        self.degrade = None
        self.xid = 0
        self.counters["DCGM_FI_DEV_ROW_REMAP_PENDING"] = 0


_COUNTER_FIELDS = [
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_POWER_VIOLATION",
    "DCGM_FI_DEV_THERMAL_VIOLATION",
]


def _ratio(x: float) -> float:
    return min(1.0, max(0.0, x))


def _poisson(rng: random.Random, lam: float) -> int:
    """Small-lambda Poisson draw (Knuth); lam is clipped for safety."""
    lam = min(lam, 50.0)
    n, p, limit = 0, 1.0, 2.718281828459045 ** (-lam)
    while True:
        p *= rng.random()
        if p <= limit:
            return n
        n += 1

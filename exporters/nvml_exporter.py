"""NVML exporter: dcgm-exporter's metric names and labels, read through nvidia-ml-py.

For nodes with NVIDIA GPUs but no DCGM. Default port 19412 (dcgm-exporter uses 9400). Exposes
what NVML can provide under the DCGM names (all as gauges, names exactly as dcgm-exporter's):
utilisation, memory, power, energy, temperatures, clocks, throttle reasons, the time held back
for heat (`DCGM_FI_DEV_THERMAL_VIOLATION`, in ns: NVML's and DCGM's unit, as dcgm-exporter
documents it since NVIDIA/dcgm-exporter#589), ECC counts, retired pages, remapped rows, PCIe
replays, NVLink errors summed over the GPU's links
(`DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL`, `..._REPLAY_...`, `..._RECOVERY_...`), XID
events (an `nvmlEventSet` thread: the last XID per GPU in
`DCGM_FI_DEV_XID_ERRORS`, a count per code in `DCGM_EXP_XID_ERRORS_COUNT{xid}`; a GPU set up at
a later scrape joins it), and on Hopper and newer the GPM ratios `DCGM_FI_PROF_SM_ACTIVE`,
`DCGM_FI_PROF_SM_OCCUPANCY`, `DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`, `DCGM_FI_PROF_DRAM_ACTIVE`,
`DCGM_FI_PROF_GR_ENGINE_ACTIVE` (0..1, measured between two consecutive scrapes). A field the GPU
does not support is left out.
One counter of its own: `goodput_gpu_process_cpu_seconds_total`, the CPU time of the GPU's
compute processes and their descendants (exporters/proctree.py), which tells a GPU idle while
its process works on the host (a compile, a checkpoint load) from one whose process waits.

Labels: `gpu`, `UUID`, `device` (nvidiaN), `modelName`, `pci_bus_id`, `Hostname` (Slurm node
name: `$GOODPUT_NODE_NAME`, else the short host name), `DCGM_FI_DRIVER_VERSION`, and `hpc_job`
when `--hpc-job-mapping-dir` is given (a file per GPU index holding the job id, as
dcgm-exporter reads it; a file that cannot be read or decoded: no job). Without a GPU or
driver, `NvmlUnavailable` says why (exit status 2). A GPU NVML cannot answer for at start (lost)
is left out, logged, and set up again at a later scrape; the node's other GPUs are reported.
"""

from __future__ import annotations

import ctypes
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from catalogue import names
from exporters.proctree import PROC, Gains, Snapshot

log = logging.getLogger(__name__)
DEFAULT_PORT = 19412
LABELS = ["gpu", "UUID", "device", "modelName", "pci_bus_id", "Hostname", "DCGM_FI_DRIVER_VERSION"]
JOB_ID = names.JOB_ID
# GPM metric (pynvml constant name) -> DCGM field; GPM reports percent, DCGM a 0..1 ratio.
GPM_FIELDS = {
    "NVML_GPM_METRIC_SM_UTIL": "DCGM_FI_PROF_SM_ACTIVE",
    "NVML_GPM_METRIC_SM_OCCUPANCY": "DCGM_FI_PROF_SM_OCCUPANCY",
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "NVML_GPM_METRIC_DRAM_BW_UTIL": "DCGM_FI_PROF_DRAM_ACTIVE",
    "NVML_GPM_METRIC_GRAPHICS_UTIL": "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
}
# DCGM's NVLink error totals -> the pynvml counter each sums over the GPU's links
NVLINK_ERRORS = {
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "NVML_NVLINK_ERROR_DL_CRC_FLIT",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "NVML_NVLINK_ERROR_DL_REPLAY",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "NVML_NVLINK_ERROR_DL_RECOVERY",
}
HELP = {
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "Memory utilization (in %).",
    "DCGM_FI_DEV_ENC_UTIL": "Encoder utilization (in %).",
    "DCGM_FI_DEV_DEC_UTIL": "Decoder utilization (in %).",
    "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
    "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
    "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W).",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "Total energy consumption since boot (in mJ).",
    "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C).",
    "DCGM_FI_DEV_MEMORY_TEMP": "Memory temperature (in C).",
    "DCGM_FI_DEV_SM_CLOCK": "SM clock frequency (in MHz).",
    "DCGM_FI_DEV_MEM_CLOCK": "Memory clock frequency (in MHz).",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "Current clock throttle reasons (bitmask).",
    "DCGM_FI_DEV_THERMAL_VIOLATION": "Throttling duration due to thermal constraints (in ns).",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "Total number of PCIe retries.",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "Single-bit volatile ECC errors.",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "Double-bit volatile ECC errors.",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "Single-bit persistent ECC errors.",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "Double-bit persistent ECC errors.",
    "DCGM_FI_DEV_RETIRED_SBE": "Pages retired for single-bit errors.",
    "DCGM_FI_DEV_RETIRED_DBE": "Pages retired for double-bit errors.",
    "DCGM_FI_DEV_RETIRED_PENDING": "Pages pending retirement.",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "Rows remapped for correctable errors.",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "Rows remapped for uncorrectable errors.",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "1 if a row remap is pending (needs a GPU reset).",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "1 if a row remap failed.",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "Total NVLink flow-control CRC errors.",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "Total number of NVLink retries.",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "Total number of NVLink recovery errors.",
    "DCGM_FI_DEV_XID_ERRORS": "Value of the last XID error encountered.",
    "DCGM_FI_PROF_SM_ACTIVE": "Ratio of cycles an SM has at least 1 warp assigned (GPM).",
    "DCGM_FI_PROF_SM_OCCUPANCY": "Ratio of resident warps to the maximum (GPM).",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "Ratio of cycles the tensor pipes are active (GPM).",
    "DCGM_FI_PROF_DRAM_ACTIVE": "Ratio of cycles the memory interface is active (GPM).",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "Ratio of time the graphics engine is active (GPM).",
}


class NvmlUnavailable(RuntimeError):
    """No NVIDIA driver, no GPU, or nvidia-ml-py missing."""


def load_nvml() -> ModuleType:
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailable(
            "nvidia-ml-py is not installed (pip install 'goodput[nvml]')"
        ) from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML cannot start (no NVIDIA driver or GPU here?): {exc}") from None
    count = pynvml.nvmlDeviceGetCount()
    if count == 0:
        raise NvmlUnavailable("NVML found no GPU on this machine")
    return pynvml


def _top_pid_namespace(proc: Path) -> bool:
    """Whether this process sees the host's pids (its `NSpid` has one level; unknown: yes)."""
    try:
        status = (proc / "self" / "status").read_text(errors="replace")
    except OSError:
        return True
    ns = next((ln.split()[1:] for ln in status.splitlines() if ln.startswith("NSpid:")), [])
    return len(ns) <= 1


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class Gpu:
    index: int
    handle: Any
    labels: list[str]
    gpm: bool = False
    gpm_sample: Any = None
    last_xid: int = 0
    xids: dict[int, int] = field(default_factory=dict)
    cpu_total: float = 0.0  # the host-side counter: what its processes gained, scrape by scrape


class NvmlCollector(Collector):
    """Reads every GPU at scrape time; XID events arrive on a background thread."""

    def __init__(
        self,
        nvml: ModuleType,
        hostname: str | None = None,
        job_map_dir: Path | None = None,
        proc: Path = PROC,
    ) -> None:
        self.nvml = nvml
        self.proc = proc  # /proc: the processes' CPU time (`host_cpu`)
        self.gains = Gains()
        self.host_pids = _top_pid_namespace(proc)
        if not self.host_pids:
            log.warning(
                "in a nested PID namespace: no host-side CPU counter (NVML's pids are the host's)"
            )
        self.hostname = (
            hostname or os.environ.get("GOODPUT_NODE_NAME") or (socket.gethostname().split(".")[0])
        )
        self.job_map_dir = job_map_dir
        self.driver = _text(nvml.nvmlSystemGetDriverVersion())
        self.errors = 0  # GPUs that failed to set up, try by try
        self.missing = dict.fromkeys(range(nvml.nvmlDeviceGetCount()), 0)  # index -> tries
        self.gpus: list[Gpu] = []
        self._lock = threading.Lock()
        self.set_up()

    def set_up(self) -> None:
        """Set up each GPU not yet set up, one by one: one that NVML cannot answer for (lost
        at start) is left out, logged and counted in `errors`, and tried again at the next
        scrape; the node's other GPUs are reported meanwhile."""
        added = []
        for i in list(self.missing):
            try:
                added.append(self._gpu(i))
            except self.nvml.NVMLError as exc:
                self.errors += 1
                self.missing[i] += 1
                if self.missing[i] == 1:
                    log.warning("GPU %d: not set up, tried again at each scrape: %s", i, exc)
                continue
            if self.missing.pop(i):
                log.warning("GPU %d: set up after all", i)
        if added:  # a new list: a reader of the old one is not disturbed
            self.gpus = sorted([*self.gpus, *added], key=lambda g: g.index)

    def _gpu(self, i: int) -> Gpu:
        n = self.nvml
        h = n.nvmlDeviceGetHandleByIndex(i)
        labels = [
            str(i),
            _text(n.nvmlDeviceGetUUID(h)),
            f"nvidia{i}",
            _text(n.nvmlDeviceGetName(h)),
            _text(n.nvmlDeviceGetPciInfo(h).busId),
            self.hostname,
            self.driver,
        ]
        return Gpu(i, h, labels, gpm=self._gpm_supported(h))

    # ------------------------------------------------------------------ reading
    def _try(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self.nvml, fn)(*args)
        except self.nvml.NVMLError:
            return None
        except AttributeError:  # an older nvidia-ml-py without this call
            return None

    def _gpm_supported(self, h: Any) -> bool:
        support = self._try("nvmlGpmQueryDeviceSupport", h)
        return bool(support is not None and getattr(support, "isSupportedDevice", 0))

    def read(self, gpu: Gpu) -> dict[str, float]:
        n, h, out = self.nvml, gpu.handle, {}
        util = self._try("nvmlDeviceGetUtilizationRates", h)
        if util is not None:
            out["DCGM_FI_DEV_GPU_UTIL"] = util.gpu
            out["DCGM_FI_DEV_MEM_COPY_UTIL"] = util.memory
        for name, fn in (
            ("ENC", "nvmlDeviceGetEncoderUtilization"),
            ("DEC", "nvmlDeviceGetDecoderUtilization"),
        ):
            v = self._try(fn, h)
            if v is not None:
                out[f"DCGM_FI_DEV_{name}_UTIL"] = v[0]
        mem = self._try("nvmlDeviceGetMemoryInfo", h)
        if mem is not None:
            out["DCGM_FI_DEV_FB_FREE"] = mem.free / 2**20
            out["DCGM_FI_DEV_FB_USED"] = mem.used / 2**20
        temp, sm, memclk = (
            getattr(n, "NVML_TEMPERATURE_GPU", 0),
            getattr(n, "NVML_CLOCK_SM", 1),
            getattr(n, "NVML_CLOCK_MEM", 2),
        )
        simple = {
            "DCGM_FI_DEV_POWER_USAGE": ("nvmlDeviceGetPowerUsage", (h,), 1e-3),
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": (
                "nvmlDeviceGetTotalEnergyConsumption",
                (h,),
                1,
            ),
            "DCGM_FI_DEV_GPU_TEMP": ("nvmlDeviceGetTemperature", (h, temp), 1),
            "DCGM_FI_DEV_SM_CLOCK": ("nvmlDeviceGetClockInfo", (h, sm), 1),
            "DCGM_FI_DEV_MEM_CLOCK": ("nvmlDeviceGetClockInfo", (h, memclk), 1),
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": (
                "nvmlDeviceGetCurrentClocksThrottleReasons",
                (h,),
                1,
            ),
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("nvmlDeviceGetPcieReplayCounter", (h,), 1),
        }
        for name, (fn, args, scale) in simple.items():
            v = self._try(fn, *args)
            if v is not None:
                out[name] = v * scale
        policy = getattr(n, "NVML_PERF_POLICY_THERMAL", 1)
        thermal = self._try("nvmlDeviceGetViolationStatus", h, policy)
        if thermal is not None:  # ns, as NVML counts it and DCGM's field holds it
            out["DCGM_FI_DEV_THERMAL_VIOLATION"] = thermal.violationTime
        out.update(self._nvlink_errors(h))
        mt = self._field(h, getattr(n, "NVML_FI_DEV_MEMORY_TEMP", None))
        if mt is not None:
            out["DCGM_FI_DEV_MEMORY_TEMP"] = mt
        for kind, err in (
            ("SBE", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
            ("DBE", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"),
        ):
            for scope, counter in (("VOL", "NVML_VOLATILE_ECC"), ("AGG", "NVML_AGGREGATE_ECC")):
                v = self._try(
                    "nvmlDeviceGetTotalEccErrors", h, getattr(n, err, 0), getattr(n, counter, 0)
                )
                if v is not None:
                    out[f"DCGM_FI_DEV_ECC_{kind}_{scope}_TOTAL"] = v
        for kind, cause in (
            ("SBE", "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS"),
            ("DBE", "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR"),
        ):
            pages = self._try("nvmlDeviceGetRetiredPages", h, getattr(n, cause, 0))
            if pages is not None:
                out[f"DCGM_FI_DEV_RETIRED_{kind}"] = len(pages)
        pending = self._try("nvmlDeviceGetRetiredPagesPendingStatus", h)
        if pending is not None:
            out["DCGM_FI_DEV_RETIRED_PENDING"] = int(pending)
        rows = self._try("nvmlDeviceGetRemappedRows", h)
        if rows is not None:
            corr, unc, is_pending, failed = rows
            out["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] = corr
            out["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] = unc
            out["DCGM_FI_DEV_ROW_REMAP_PENDING"] = int(bool(is_pending))
            out["DCGM_FI_DEV_ROW_REMAP_FAILURE"] = int(bool(failed))
        out["DCGM_FI_DEV_XID_ERRORS"] = gpu.last_xid
        if gpu.gpm:
            out.update(self._gpm(gpu))
        return out

    def _nvlink_errors(self, h: Any) -> dict[str, float]:
        """Each NVLink error counter summed over the GPU's links. A link NVML has no counter
        for (NotSupported; InvalidArgument: no such link) is skipped; none at all: no series.
        Any other error leaves the counter out this scrape: a partial sum would read as a
        counter reset."""
        n, out = self.nvml, {}
        no_counter = ("NVMLError_NotSupported", "NVMLError_InvalidArgument")
        absent = tuple(getattr(n, e) for e in no_counter if hasattr(n, e))
        for name, kind in NVLINK_ERRORS.items():
            counter, total, seen = getattr(n, kind, None), 0.0, False
            if counter is None:
                continue
            try:
                for link in range(getattr(n, "NVML_NVLINK_MAX_LINKS", 18)):
                    try:
                        total += n.nvmlDeviceGetNvLinkErrorCounter(h, link, counter)
                        seen = True
                    except absent:
                        continue
            except (n.NVMLError, AttributeError):  # lost mid-read, or an older nvidia-ml-py
                continue
            if seen:
                out[name] = total
        return out

    def _field(self, h: Any, field_id: int | None) -> float | None:
        if field_id is None:
            return None
        values = self._try("nvmlDeviceGetFieldValues", h, [field_id])
        if not values or values[0].nvmlReturn != 0:
            return None
        fv = values[0]
        kind = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}
        return float(getattr(fv.value, kind.get(fv.valueType, "ullVal")))

    def _gpm(self, gpu: Gpu) -> dict[str, float]:
        n = self.nvml
        sample = self._try("nvmlGpmSampleAlloc")
        if sample is None:
            return {}
        if self._try("nvmlGpmSampleGet", gpu.handle, sample) is None:
            self._try("nvmlGpmSampleFree", sample)  # else one leaks a scrape while it fails
            return {}
        prev, gpu.gpm_sample = gpu.gpm_sample, sample
        if prev is None:
            return {}
        out: dict[str, float] = {}
        try:
            ids = [(getattr(n, k), v) for k, v in GPM_FIELDS.items() if hasattr(n, k)]
            mg = n.c_nvmlGpmMetricsGet_t()
            mg.version = n.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(ids)
            mg.sample1, mg.sample2 = prev, sample
            for i, (mid, _) in enumerate(ids):
                mg.metrics[i].metricId = mid
            n.nvmlGpmMetricsGet(mg)
            for i, (_, name) in enumerate(ids):
                if mg.metrics[i].nvmlReturn == 0:
                    out[name] = max(0.0, min(1.0, mg.metrics[i].value / 100.0))
        except n.NVMLError as exc:
            log.debug("GPM read failed: %s", exc)
        finally:
            self._try("nvmlGpmSampleFree", prev)
        return out

    def job_of(self, gpu: Gpu) -> str:
        if self.job_map_dir is None:
            return ""
        try:
            text = (self.job_map_dir / str(gpu.index)).read_text().split()
        except (OSError, UnicodeDecodeError):  # unreadable or not text: no job
            return ""
        return text[0] if text and JOB_ID.match(text[0]) else ""

    def collect(self) -> Iterator:
        labels = LABELS + (["hpc_job"] if self.job_map_dir is not None else [])
        families: dict[str, GaugeMetricFamily] = {}
        cpu = CounterMetricFamily(  # Goodput's own: Goodput's label names
            "goodput_gpu_process_cpu_seconds",  # _total: prometheus_client adds it
            "User and system CPU seconds of the processes using the GPU and their descendants.",
            labels=["node", "gpu", "model_name"]
            + (["job_id"] if self.job_map_dir is not None else []),
        )
        xid_count = GaugeMetricFamily(
            "DCGM_EXP_XID_ERRORS_COUNT", "XID errors seen, by code.", labels=labels + ["xid"]
        )
        with self._lock:
            self.set_up()
            labels_of = {  # each GPU's labels, read once a scrape (the job mapping may change)
                gpu.index: gpu.labels + ([self.job_of(gpu)] if self.job_map_dir is not None else [])
                for gpu in self.gpus
            }
            for gpu in self.gpus:
                for name, value in self.read(gpu).items():
                    fam = families.get(name)
                    if fam is None:
                        fam = families[name] = GaugeMetricFamily(
                            name, HELP.get(name, name), labels=labels
                        )
                    fam.add_metric(labels_of[gpu.index], float(value))
            for index, seconds in self.host_cpu().items():
                dcgm = dict(zip(labels, labels_of[index], strict=True))
                own = [dcgm["Hostname"], dcgm["gpu"], dcgm["modelName"]]
                cpu.add_metric(own + ([dcgm["hpc_job"]] if "hpc_job" in dcgm else []), seconds)
            for gpu in self.gpus:
                for xid, count in sorted(gpu.xids.items()):
                    xid_count.add_metric(labels_of[gpu.index] + [str(xid)], count)
        yield from families.values()
        yield cpu
        yield xid_count

    def host_cpu(self) -> dict[int, float]:
        """Each GPU's host-side counter: the CPU seconds its compute processes and their
        descendants gained, scrape by scrape (`proctree.Gains`: a process that joins brings
        no history, one that leaves takes none away, a reaped child counts once; never a
        reset), from one /proc snapshot. A process NVML lists on several GPUs (a rank that
        also made a context on GPU 0) belongs to the one where it holds the most memory, and
        a tree stops at another GPU's process (rank 0 as the parent of the node's other
        ranks). No entry for a GPU no process holds, and none at all in a nested PID namespace
        (NVML's pids are the host's: a container needs the host's PID namespace)."""
        if not self.host_pids:
            return {}
        owner: dict[int, tuple[int, float]] = {}  # pid -> (GPU index, memory it holds there)
        for gpu in self.gpus:
            for p in self._try("nvmlDeviceGetComputeRunningProcesses", gpu.handle) or []:
                mem = float(getattr(p, "usedGpuMemory", None) or 0)
                if p.pid not in owner or mem > owner[p.pid][1]:
                    owner[p.pid] = (gpu.index, mem)
        snap = Snapshot.take(self.proc) if owner else Snapshot({})
        children = snap.children()
        trees = {
            gpu.index: snap.tree(
                [p for p, (g, _) in owner.items() if g == gpu.index],
                [p for p, (g, _) in owner.items() if g != gpu.index],
                children,
            )
            for gpu in self.gpus
        }
        gained = self.gains.seconds(snap, {i: keys for i, keys in trees.items() if keys})
        out = {}
        for gpu in self.gpus:
            if gpu.index in gained:
                gpu.cpu_total += gained[gpu.index]
                out[gpu.index] = gpu.cpu_total
        return out

    # ------------------------------------------------------------------ XID events
    def watch_xids(self, stop: threading.Event) -> None:
        """Block on nvmlEventSetWait until `stop`; record each critical XID per GPU. A GPU set
        up at a later scrape (the driver not ready at start, a GPU back after a reset) joins
        the event set at the watch's next turn (within a second); while no GPU has joined, the
        watch waits for one."""
        n = self.nvml
        try:
            es = n.nvmlEventSetCreate()
        except n.NVMLError as exc:
            log.warning("XID events unavailable: %s", exc)
            return
        by_uuid: dict[str, Gpu] = {}
        asked: set[int] = set()  # GPUs registered, or refused (not asked again)
        try:
            while not stop.is_set():
                for gpu in self.gpus:  # here, between waits: not from a scrape while one blocks
                    if gpu.index in asked:
                        continue
                    asked.add(gpu.index)
                    try:
                        n.nvmlDeviceRegisterEvents(gpu.handle, n.nvmlEventTypeXidCriticalError, es)
                        by_uuid[gpu.labels[1]] = gpu
                    except n.NVMLError as exc:
                        log.warning("GPU %d: XID events unavailable: %s", gpu.index, exc)
                if not by_uuid:
                    stop.wait(0.5)
                    continue
                try:
                    data = n.nvmlEventSetWait_v2(es, 500)
                except n.NVMLError_Timeout:
                    continue
                except n.NVMLError as exc:
                    log.warning("XID wait failed: %s", exc)
                    time.sleep(1)
                    continue
                hit = self._event_gpu(data.device, by_uuid)
                if hit is None:
                    continue
                with self._lock:
                    hit.last_xid = int(data.eventData)
                    hit.xids[hit.last_xid] = hit.xids.get(hit.last_xid, 0) + 1
                log.warning("GPU %d: XID %d", hit.index, data.eventData)
        finally:
            self._try("nvmlEventSetFree", es)

    def _event_gpu(self, device: Any, by_uuid: dict[str, Gpu]) -> Gpu | None:
        """The GPU an event came from: by its UUID, or, when it answers nothing any more (it
        fell off the bus: XID 79, the event that matters most), by its handle."""
        try:
            return by_uuid.get(_text(self.nvml.nvmlDeviceGetUUID(device)))
        except self.nvml.NVMLError:
            key = _handle_key(device)
            return next((g for g in by_uuid.values() if _handle_key(g.handle) == key), None)


def _handle_key(handle: Any) -> Any:
    """A device handle's identity: its address (pynvml makes a new ctypes object per call)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return handle


def serve(
    port: int = DEFAULT_PORT,
    host: str = "127.0.0.1",
    job_map_dir: Path | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Expose /metrics until `stop`; raises NvmlUnavailable when there is no GPU."""
    from prometheus_client import CollectorRegistry, start_http_server

    nvml = load_nvml()
    collector = NvmlCollector(nvml, job_map_dir=job_map_dir)
    registry = CollectorRegistry()
    registry.register(collector)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    log.info(
        "NVML exporter on http://%s:%d/metrics: %d GPU(s) (%d not set up), driver %s, GPM on %d",
        host, port, len(collector.gpus), len(collector.missing), collector.driver,
        sum(g.gpm for g in collector.gpus),
    )  # fmt: skip
    stop = stop or threading.Event()
    try:
        collector.watch_xids(stop)
        stop.wait()
    finally:
        server.shutdown()
        nvml.nvmlShutdown()

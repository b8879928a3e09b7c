"""dcgm-exporter's fields and a fast text exposition (one buffer per node, prebuilt labels)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from exporters.sim.gpu import GPU
    from exporters.sim.model import Node

DRIVER_VERSION = "550.90.07"

# (name, type, help) in dcgm-exporter's words; the order is the recording's column order.
FIELDS: list[tuple[str, str, str]] = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory frequency (in MHz)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
    ),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
    ),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
    (
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "counter",
        "Total number of single-bit persistent ECC errors.",
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "counter",
        "Total number of double-bit persistent ECC errors.",
    ),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors",
    ),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether remapping of rows is pending"),
    (
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink flow-control CRC errors.",
    ),
    (
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink data CRC errors.",
    ),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink retries."),
    (
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink recovery errors.",
    ),
    (
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "gauge",
        "Current clock throttle reasons (bitmask of DCGM_CLOCKS_THROTTLE_REASON_*).",
    ),
    (
        "DCGM_FI_DEV_POWER_VIOLATION",
        "counter",
        "Throttling duration due to power constraints (in us).",
    ),
    (
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        "counter",
        "Throttling duration due to thermal constraints (in us).",
    ),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "counter",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and "
        "data payloads - in bytes per second.",
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "counter",
        "The rate of data received over the PCIe bus - including both protocol headers and "
        "data payloads - in bytes per second.",
    ),
    # the NVML exporter's host-side counter (a node may run it beside dcgm-exporter): no
    # sample while no process holds the GPU
    (
        "goodput_gpu_process_cpu_seconds_total",
        "counter",
        "User and system CPU seconds of the processes using the GPU and their descendants.",
    ),
]
FIELD_NAMES = [f[0] for f in FIELDS]
INDEX = {name: i for i, name in enumerate(FIELD_NAMES)}
# Integer-valued fields are printed without a decimal point, as dcgm-exporter does.
_FLOAT = {"DCGM_FI_DEV_POWER_USAGE", "goodput_gpu_process_cpu_seconds_total"} | {
    n for n in FIELD_NAMES if n.startswith("DCGM_FI_PROF_")
}
_IS_FLOAT = [name in _FLOAT for name in FIELD_NAMES]
_HEADERS = [f"# HELP {n} {h}\n# TYPE {n} {t}\n" for n, t, h in FIELDS]
# The one field a GPU that fell off the bus still reports (DCGM leaves the others blank).
OFF_BUS_FIELDS = {INDEX["DCGM_FI_DEV_XID_ERRORS"]}


def label_string(gpu: GPU, host_label: str = "Hostname") -> str:
    """dcgm-exporter's label set for one GPU, `hpc_job` last (only while a job runs there)."""
    base = (
        f'gpu="{gpu.index}",UUID="{gpu.uuid}",pci_bus_id="{gpu.pci_bus_id}",'
        f'device="nvidia{gpu.index}",modelName="{gpu.model_name}",'
        f'{host_label}="{gpu.node_name}",DCGM_FI_DRIVER_VERSION="{DRIVER_VERSION}"'
    )
    if gpu.job_id:
        base += f',hpc_job="{gpu.job_id}"'
    return "{" + base + "}"


def _fmt(value: float, is_float: bool) -> str:
    if is_float:
        return f"{value:.6f}"
    return str(int(value))


def own_labels(gpu: GPU) -> str:
    """The NVML exporter's label set for its own per-GPU counter (Goodput's names)."""
    job = f',job_id="{gpu.job_id}"' if gpu.job_id else ""
    return f'{{node="{gpu.node_name}",gpu="{gpu.index}",model_name="{gpu.model_name}"{job}}}'


def render_node(node: Node, host_label: str = "Hostname") -> bytes:
    """The node's /metrics body: every field, one sample per present GPU."""
    gpus = [(g, g.labels(host_label), own_labels(g)) for g in node.gpus]
    out: list[str] = []
    for i, header in enumerate(_HEADERS):
        lines = []
        name = FIELD_NAMES[i]
        is_float = _IS_FLOAT[i]
        for gpu, labels, own in gpus:
            if gpu.off_bus and i not in OFF_BUS_FIELDS or gpu.values[i] != gpu.values[i]:
                continue  # off the bus, or NaN: not reported
            labels = labels if name.startswith("DCGM_") else own
            lines.append(f"{name}{labels} {_fmt(gpu.values[i], is_float)}\n")
        if lines:
            out.append(header)
            out.extend(lines)
    return "".join(out).encode()

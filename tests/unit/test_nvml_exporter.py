"""NVML exporter: dcgm names and labels from a fake NVML; a clear non-zero exit without a GPU."""
# ruff: noqa: E501

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from exporters.nvml_exporter import NvmlCollector
from exporters.proctree import TICK


class NVMLError(Exception):
    pass


class NVMLError_Timeout(NVMLError):  # noqa: N801 - pynvml's name
    pass


def fake_nvml(
    n_gpus: int = 2, xids: list[int] | None = None, pids: dict[int, list[int]] | None = None
) -> types.SimpleNamespace:
    events = list(xids or [])
    procs = {
        h: [types.SimpleNamespace(pid=p, usedGpuMemory=2**30) for p in ps]
        for h, ps in (pids or {}).items()
    }

    def unsupported(*_):
        raise NVMLError("Not Supported")

    def wait(es, timeout):
        if events:
            return types.SimpleNamespace(device=1, eventData=events.pop(0))
        raise NVMLError_Timeout()

    return types.SimpleNamespace(
        NVMLError=NVMLError,
        NVMLError_Timeout=NVMLError_Timeout,
        NVML_TEMPERATURE_GPU=0, NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2,
        NVML_MEMORY_ERROR_TYPE_CORRECTED=0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1,
        NVML_VOLATILE_ECC=0, NVML_AGGREGATE_ECC=1,
        nvmlEventTypeXidCriticalError=8,
        nvmlSystemGetDriverVersion=lambda: "550.54.15",
        nvmlDeviceGetCount=lambda: n_gpus,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=lambda h: f"GPU-0000000{h}-aaaa-bbbb-cccc-dddddddddddd",
        nvmlDeviceGetName=lambda h: b"NVIDIA H200",
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=f"00000000:{0x2B + h:02X}:00.0".encode()),
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=99, memory=40),
        nvmlDeviceGetEncoderUtilization=unsupported,
        nvmlDeviceGetDecoderUtilization=lambda h: (0, 1000),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(free=2**30, used=3 * 2**30),
        nvmlDeviceGetPowerUsage=lambda h: 690_500,
        nvmlDeviceGetTotalEnergyConsumption=lambda h: 123_456,
        nvmlDeviceGetTemperature=lambda h, s: 57,
        nvmlDeviceGetClockInfo=lambda h, c: {1: 1530, 2: 2619}[c],
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: 0x4,
        nvmlDeviceGetPcieReplayCounter=lambda h: 3,
        nvmlDeviceGetTotalEccErrors=lambda h, e, c: 7 if e == 0 else 0,
        nvmlDeviceGetRetiredPages=unsupported,  # Hopper: row remapping instead
        nvmlDeviceGetRetiredPagesPendingStatus=unsupported,
        nvmlDeviceGetRemappedRows=lambda h: (2, 0, 1, 0),
        nvmlGpmQueryDeviceSupport=unsupported,
        nvmlDeviceGetComputeRunningProcesses=lambda h: procs.get(h, []),
        nvmlEventSetCreate=lambda: "es",
        nvmlDeviceRegisterEvents=lambda h, t, es: None,
        nvmlEventSetWait_v2=wait,
        nvmlEventSetFree=lambda es: None,
    )  # fmt: skip


def test_dcgm_names_and_labels():
    c = NvmlCollector(fake_nvml(), hostname="node7")
    reg = CollectorRegistry()
    reg.register(c)
    labels = {
        "gpu": "1", "UUID": "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd", "device": "nvidia1",
        "modelName": "NVIDIA H200", "pci_bus_id": "00000000:2C:00.0", "Hostname": "node7",
        "DCGM_FI_DRIVER_VERSION": "550.54.15",
    }  # fmt: skip
    v = lambda name: reg.get_sample_value(name, labels)  # noqa: E731
    assert v("DCGM_FI_DEV_GPU_UTIL") == 99
    assert v("DCGM_FI_DEV_POWER_USAGE") == 690.5
    assert v("DCGM_FI_DEV_FB_USED") == 3072
    assert v("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") == 123456
    assert v("DCGM_FI_DEV_SM_CLOCK") == 1530 and v("DCGM_FI_DEV_MEM_CLOCK") == 2619
    assert v("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS") == 4
    assert v("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL") == 7 and v("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") == 0
    assert (
        v("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS") == 2 and v("DCGM_FI_DEV_ROW_REMAP_PENDING") == 1
    )
    assert v("DCGM_FI_DEV_PCIE_REPLAY_COUNTER") == 3
    assert v("DCGM_FI_DEV_XID_ERRORS") == 0
    assert v("DCGM_FI_DEV_ENC_UTIL") is None  # not supported: left out, not zero
    assert v("DCGM_FI_DEV_RETIRED_DBE") is None


def test_the_gpus_processes_on_the_host():
    """GPU 0 held by a real process that waits for its working child (a compile worker): its
    CPU seconds grow; GPU 1, held by no process, has no series (not a zero)."""
    burn = "import time\nwhile time.process_time() < 60: pass"
    code = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {burn!r}])"
    p = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        threading.Event().wait(0.5)  # the child is up (a process first seen gains nothing yet)
        c = NvmlCollector(fake_nvml(pids={0: [p.pid]}), hostname="node7")
        reg = CollectorRegistry()
        reg.register(c)
        name = "goodput_gpu_process_cpu_seconds_total"

        def on(gpu: str) -> float | None:
            return {
                s.labels["gpu"]: s.value for f in reg.collect() for s in f.samples if s.name == name
            }.get(gpu)

        first = on("0")
        threading.Event().wait(1.0)
        assert first is not None and on("0") - first > 0.3
        assert on("1") is None
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # the burning child too
        p.wait()


def _proc(root: Path, procs: dict[int, tuple[int, ...]]) -> None:
    """A /proc of `procs` (pid -> (parent, utime ticks[, cutime ticks])); the rest is gone."""
    for d in root.iterdir():
        (d / "stat").unlink()
        d.rmdir()
    for pid, (ppid, ticks, *reaped) in procs.items():
        (root / str(pid)).mkdir()
        cutime = reaped[0] if reaped else 0
        rest = " ".join(["0"] * 9 + [str(ticks), "0", str(cutime), "0", "20", "0", "1", "0"])
        (root / str(pid) / "stat").write_text(f"{pid} (python3) S {ppid} {rest} {pid * 7}\n")


def test_each_gpu_counts_its_own_ranks_and_the_counter_only_grows(tmp_path: Path):
    """Rank 0 (GPU 0) is the parent of rank 1 (GPU 1, which also made a small context on GPU
    0): GPU 0 counts rank 0 and its worker, not rank 1's tree, nor rank 1's lifetime once rank
    0 reaps it. A worker that leaves the tree (orphaned) takes its time away: the counter
    holds, then grows again (no reset for Prometheus to read as thousands of cores)."""
    pids = {0: [(10, 2**33), (20, 2**28)], 1: [(20, 2**34)]}
    nvml = fake_nvml(pids={})
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in pids[h]
    ]
    c = NvmlCollector(nvml, hostname="node7", proc=tmp_path)
    _proc(tmp_path, {1: (0, 0), 10: (1, 100), 11: (10, 50), 20: (10, 1000), 21: (20, 300)})
    assert c.host_cpu() == {0: 0.0, 1: 0.0}  # first sight: nothing gained yet
    _proc(
        tmp_path,
        {1: (0, 0), 10: (1, 100 + TICK), 11: (10, 50), 20: (10, 1000 + 3 * TICK), 21: (20, 300)},
    )
    assert c.host_cpu() == {0: 1.0, 1: 3.0}  # rank 1's 3 s are GPU 1's alone
    _proc(
        tmp_path,
        {1: (0, 0), 10: (1, 100 + TICK), 11: (1, 50), 20: (10, 1000 + 3 * TICK), 21: (20, 300)},
    )
    assert c.host_cpu()[0] == 1.0  # the worker left rank 0's tree: no drop
    _proc(tmp_path, {1: (0, 0), 10: (1, 100 + 2 * TICK), 20: (10, 1000 + 3 * TICK), 21: (20, 300)})
    assert c.host_cpu() == {0: 2.0, 1: 3.0}
    pids[1] = []  # rank 1 and its worker ended, reaped by rank 0: their lifetimes land in
    life = 1000 + 3 * TICK + 300  # rank 0's reaped children's time, counted already: no jump
    _proc(tmp_path, {1: (0, 0), 10: (1, 100 + 2 * TICK, life + TICK // 2)})
    assert c.host_cpu() == {0: 2.5}  # (the half second rank 1 used since it was last seen)
    pids[0] = []
    assert c.host_cpu() == {}  # no process: no series


def watch_until_two_xids(c: NvmlCollector) -> bool:
    """Run the XID watch until GPU 1 has its two XID 79 events; whether it was still alive."""
    stop = threading.Event()
    t = threading.Thread(target=c.watch_xids, args=(stop,))
    t.start()
    for _ in range(100):
        if c.gpus[1].xids.get(79) == 2:
            break
        threading.Event().wait(0.02)
    alive = t.is_alive()
    stop.set()
    t.join(5)
    return alive


def test_xid_events_and_job_mapping(tmp_path: Path):
    (tmp_path / "1").write_text("4242\n")
    (tmp_path / "0").write_text("rm -rf /\n")  # not a job id: ignored
    c = NvmlCollector(fake_nvml(xids=[79, 79]), hostname="node7", job_map_dir=tmp_path)
    watch_until_two_xids(c)
    reg = CollectorRegistry()
    reg.register(c)
    text = {s.name: s for f in reg.collect() for s in f.samples if s.labels.get("gpu") == "1"}
    assert text["DCGM_FI_DEV_XID_ERRORS"].value == 79
    assert text["DCGM_FI_DEV_XID_ERRORS"].labels["hpc_job"] == "4242"
    assert text["DCGM_EXP_XID_ERRORS_COUNT"].labels["xid"] == "79"
    assert text["DCGM_EXP_XID_ERRORS_COUNT"].value == 2
    gpu0 = [s for f in reg.collect() for s in f.samples if s.labels.get("gpu") == "0"]
    assert gpu0 and all(s.labels["hpc_job"] == "" for s in gpu0)


def test_without_gpu_it_says_so_and_exits_non_zero():
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA GPU")
    except Exception:  # noqa: BLE001 - any NVML failure means: no GPU here
        pass
    out = subprocess.run(
        [sys.executable, "-m", "goodput.cli", "exporter", "nvml", "--port", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2, out
    assert "NVML cannot start" in out.stderr or "no GPU" in out.stderr


def test_a_gpu_that_fell_off_the_bus_still_gets_its_xid_and_the_watch_goes_on():
    """nvmlDeviceGetUUID on a lost GPU raises: the XID 79 event used to end the exporter."""
    nvml = fake_nvml(xids=[79, 79])
    uuid = nvml.nvmlDeviceGetUUID
    c = NvmlCollector(nvml, hostname="node7")  # the GPUs answered at start

    def lost(h):
        if h == 1:
            raise NVMLError("GPU is lost")
        return uuid(h)

    nvml.nvmlDeviceGetUUID = lost
    assert watch_until_two_xids(c)  # the watch was still running
    assert c.gpus[1].xids == {79: 2} and c.gpus[0].xids == {}


def test_a_gpu_lost_at_start_is_left_out_and_set_up_later(caplog):
    """nvmlDeviceGetUUID (or GetHandleByIndex) raising for one GPU at start ended the exporter:
    none of the node's GPUs reported, as if the whole node were lost."""
    nvml = fake_nvml(n_gpus=3)
    uuid, lost = nvml.nvmlDeviceGetUUID, {1}

    def flaky(h):
        if h in lost:
            raise NVMLError("GPU is lost")
        return uuid(h)

    nvml.nvmlDeviceGetUUID = flaky
    c = NvmlCollector(nvml, hostname="node7")
    reg = CollectorRegistry()
    reg.register(c)

    def gpus() -> set[str]:
        return {s.labels["gpu"] for f in reg.collect() for s in f.samples if "gpu" in s.labels}

    assert gpus() == {"0", "2"}  # the others are reported
    assert c.errors == 2 and c.missing == {1: 2}  # counted at start and at the scrape
    assert "GPU 1: not set up" in caplog.text
    lost.clear()
    assert gpus() == {"0", "1", "2"} and c.missing == {} and c.errors == 2
    assert [g.index for g in c.gpus] == [0, 1, 2]
    nvml.nvmlDeviceGetHandleByIndex = lambda i: (_ for _ in ()).throw(NVMLError("Unknown"))
    assert NvmlCollector(nvml, hostname="node7").gpus == []  # every GPU lost: no crash


def test_an_undecodable_job_map_file_is_no_job(tmp_path: Path):
    """A job-map file that is not UTF-8 raised UnicodeDecodeError (not an OSError): every
    scrape failed."""
    (tmp_path / "0").write_text("1234\n")
    (tmp_path / "1").write_bytes(b"\xff\xfe5678\n")
    reg = CollectorRegistry()
    reg.register(NvmlCollector(fake_nvml(), hostname="node7", job_map_dir=tmp_path))
    jobs = {s.labels["gpu"]: s.labels["hpc_job"] for f in reg.collect() for s in f.samples}
    assert jobs == {"0": "1234", "1": ""}


def test_a_gpm_sample_that_cannot_be_read_is_freed():
    """A GPU whose GPM sample read fails (lost, reset) leaked one allocated sample a scrape."""
    nvml = fake_nvml(n_gpus=1)
    live: set[int] = set()

    def alloc():
        live.add(len(live) + 100)
        return max(live)

    def sample_get(h, s):
        raise NVMLError("GPU is lost")

    nvml.nvmlGpmQueryDeviceSupport = lambda h: types.SimpleNamespace(isSupportedDevice=1)
    nvml.nvmlGpmSampleAlloc, nvml.nvmlGpmSampleGet = alloc, sample_get
    nvml.nvmlGpmSampleFree = live.discard
    c = NvmlCollector(nvml, hostname="node1")
    assert c.gpus[0].gpm
    for _ in range(5):
        assert c._gpm(c.gpus[0]) == {}
    assert live == set()


def xid_source(nvml: types.SimpleNamespace) -> tuple[list[int], list[tuple[int, int]]]:
    """NVML's event set as it behaves: events come only from the GPUs registered with it.
    Returns (registered handles, queue of (handle, xid) to deliver)."""
    registered: list[int] = []
    queue: list[tuple[int, int]] = []

    def wait(es, timeout):
        for i, (h, xid) in enumerate(queue):
            if h in registered:
                del queue[i]
                return types.SimpleNamespace(device=h, eventData=xid)
        threading.Event().wait(0.01)
        raise NVMLError_Timeout()

    nvml.nvmlDeviceRegisterEvents = lambda h, t, es: registered.append(h)
    nvml.nvmlEventSetWait_v2 = wait
    return registered, queue


def until(cond, seconds: float = 3.0) -> bool:
    for _ in range(int(seconds / 0.02)):
        if cond():
            return True
        threading.Event().wait(0.02)
    return cond()


def test_a_gpu_set_up_at_a_later_scrape_gets_its_xids():
    """Old code registered only the GPUs of the start with the event set: GPU 1, lost at start
    and set up at a later scrape (as the docstring promises), never had an XID counted."""
    nvml = fake_nvml(n_gpus=2)
    registered, queue = xid_source(nvml)
    uuid, lost = nvml.nvmlDeviceGetUUID, {1}

    def flaky(h):
        if h in lost:
            raise NVMLError("GPU is lost")
        return uuid(h)

    nvml.nvmlDeviceGetUUID = flaky
    c = NvmlCollector(nvml, hostname="node7")
    stop = threading.Event()
    t = threading.Thread(target=c.watch_xids, args=(stop,))
    t.start()
    try:
        assert until(lambda: registered == [0])
        lost.clear()
        reg = CollectorRegistry()
        reg.register(c)
        list(reg.collect())  # the scrape sets GPU 1 up
        assert until(lambda: registered == [0, 1])
        queue.extend([(1, 79), (1, 79)])
        assert until(lambda: c.gpus[1].xids.get(79) == 2)
        assert t.is_alive() and c.gpus[0].xids == {}
    finally:
        stop.set()
        t.join(5)
    assert not t.is_alive()


def test_the_xid_watch_waits_while_no_gpu_answered_at_start():
    """Old code: no GPU set up at start (the driver not ready yet) and the watch returned at
    once, never to run again: no XID for any GPU set up later."""
    nvml = fake_nvml(n_gpus=2)
    registered, queue = xid_source(nvml)
    ready, handle = [False], nvml.nvmlDeviceGetHandleByIndex

    def by_index(i):
        if not ready[0]:
            raise NVMLError("Unknown Error")
        return handle(i)

    nvml.nvmlDeviceGetHandleByIndex = by_index
    c = NvmlCollector(nvml, hostname="node7")
    assert c.gpus == []
    stop = threading.Event()
    t = threading.Thread(target=c.watch_xids, args=(stop,))
    t.start()
    try:
        threading.Event().wait(0.3)
        assert t.is_alive() and registered == []
        ready[0] = True
        c.set_up()  # as a scrape does
        assert until(lambda: registered == [0, 1])
        queue.append((0, 48))
        assert until(lambda: c.gpus[0].last_xid == 48)
    finally:
        stop.set()
        t.join(5)
    assert not t.is_alive()


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's names
    pass


class NVMLError_InvalidArgument(NVMLError):  # noqa: N801
    pass


def test_thermal_violation_and_nvlink_errors_the_rules_read():
    """Old code never wrote DCGM_FI_DEV_THERMAL_VIOLATION nor the NVLink error totals, though
    the thermal_throttle symptom, the evidence queries and the detector read them. GPU 0 has
    NVLinks (links 0-3; link 2 without a replay counter; links 4+ absent), GPU 1 none and no
    violation counter: its series are left out, not zero."""
    nvml = fake_nvml(n_gpus=2)
    nvml.NVMLError_NotSupported = NVMLError_NotSupported
    nvml.NVMLError_InvalidArgument = NVMLError_InvalidArgument
    nvml.NVML_PERF_POLICY_THERMAL, nvml.NVML_NVLINK_MAX_LINKS = 1, 18
    nvml.NVML_NVLINK_ERROR_DL_REPLAY, nvml.NVML_NVLINK_ERROR_DL_RECOVERY = 0, 1
    nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT = 2

    def violation(h, policy):
        assert policy == 1
        if h == 1:
            raise NVMLError_NotSupported("Not Supported")
        return types.SimpleNamespace(violationTime=12_345_678_999, referenceTime=1)

    def nvlink(h, link, counter):
        if h == 1:
            raise NVMLError_NotSupported("Not Supported")
        if link >= 4:
            raise NVMLError_InvalidArgument("Invalid Argument")
        if link == 2 and counter == 0:
            raise NVMLError_NotSupported("Not Supported")
        return {0: 10, 1: 1, 2: 100}[counter] * (link + 1)

    nvml.nvmlDeviceGetViolationStatus, nvml.nvmlDeviceGetNvLinkErrorCounter = violation, nvlink
    reg = CollectorRegistry()
    reg.register(NvmlCollector(nvml, hostname="node7"))

    def on(gpu: str) -> dict[str, float]:
        return {
            s.name: s.value for f in reg.collect() for s in f.samples if s.labels.get("gpu") == gpu
        }

    gpu0, gpu1 = on("0"), on("1")
    assert gpu0["DCGM_FI_DEV_THERMAL_VIOLATION"] == 12_345_678_999  # ns, as NVML counts
    assert gpu0["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"] == 100 * (1 + 2 + 3 + 4)
    assert gpu0["DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"] == 10 * (1 + 2 + 4)
    assert gpu0["DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"] == 1 + 2 + 3 + 4
    assert not {n for n in gpu1 if "VIOLATION" in n or "NVLINK" in n}
    assert gpu1["DCGM_FI_DEV_GPU_UTIL"] == 99  # the rest of GPU 1 is reported

    def lost_mid_read(h, link, counter):
        if link == 3:
            raise NVMLError("GPU is lost")
        return 5

    nvml.nvmlDeviceGetNvLinkErrorCounter = lost_mid_read
    assert not {n for n in on("0") if "NVLINK" in n}  # no partial sum (it would read as a reset)

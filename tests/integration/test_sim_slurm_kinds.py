"""Every simulator fault kind as a real Slurm batch job on the local stack (issue 3): Slurm's
outcome (`scontrol show job`, `sacct`) and the log signature (the job's output file, the node's
kernel log).

One simulator in real-Slurm mode serves the module. Kinds run in batches of up to four
concurrent single-node jobs (the stack has 4 nodes x 8 GPUs); each kind's test asks for its
batch's observations, which runs the batch once, so a failure names the kind. Jobs run with a
0.5 s step and a progress line every 2 iterations so that every signature shows in seconds."""

from __future__ import annotations

import os
import re
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from exporters.sim.faults import FAULT_KINDS
from tests.conftest import wait_until
from tests.helpers import forget_faults, scontrol_show, slurm

ROOT = Path(__file__).resolve().parents[2]
CONTROL, NODE_BASE = 19380, 19700  # clear of the demo's 19400/1950x and test_sim_stack's ports
API = f"http://127.0.0.1:{CONTROL}/api/v1"
STEP_S, LOG_EVERY = 0.5, 2  # a progress line every second
WINDOW_S = 5.0  # how long hangs and healthy runs are watched after the fault: 10 step times
PROGRESS = re.compile(r" iteration +(\d+)/ *\d+ \|.*elapsed time per iteration \(ms\): ([0-9.]+)")
ENDED = {"FAILED", "COMPLETED", "CANCELLED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY"}


@dataclass(frozen=True)
class Case:
    """What one kind does to a real Slurm job (docs/contracts.md, "Fault kinds")."""

    kind: str
    ends: str  # failed | hangs | slower | runs | node_lost
    log: tuple[str, ...] = ()  # in the job's Slurm output file
    xids: tuple[int, ...] = ()  # `NVRM: Xid` lines in the node's kernel log after the fault
    kernel: tuple[str, ...] = ()  # other kernel log text after the fault
    exit_code: str = ""  # scontrol's ExitCode (status:signal) of a failed job
    sacct_exit: str = ""  # sacct's, where it differs
    params: dict[str, Any] = field(default_factory=dict)


FAST = {"crash_after_s": 1}
CASES = {
    c.kind: c
    for c in (
        Case("xid79_off_bus", "failed", ("CUDA error: unspecified launch failure",), (79,),
             exit_code="1:0", params=FAST),
        Case("ecc_dbe", "failed", ("uncorrectable ECC error encountered",), (48, 63),
             exit_code="1:0", params=FAST),
        Case("gsp_timeout", "failed", ("CUDA error: unspecified launch failure",), (119,),
             exit_code="1:0", params=FAST),
        Case("nvlink_error", "failed",
             ("NCCL WARN Cuda failure 'uncorrectable NVLink error detected",), (74,),
             exit_code="1:0", params=FAST),
        # abort(): the exec'd batch script dies of SIGABRT, 0:6 (the Slurm exporter's 134)
        Case("app_fault", "failed",
             ("CUDA error: an illegal memory access was encountered", "exitcode  : -6"), (13,),
             exit_code="0:6", params=FAST),
        # status 139; Slurm 22.05's accounting shows it as 11:0
        Case("segfault", "failed",
             ("Fatal Python error: Segmentation fault", "exitcode  : -11",
              "Segmentation fault (core dumped)"),
             exit_code="139:0", sacct_exit="11:0", params=FAST),
        Case("cuda_oom", "failed", ("torch.cuda.OutOfMemoryError: CUDA out of memory",),
             exit_code="1:0", params=FAST),
        Case("ib_flap", "failed",
             ("NCCL WARN NET/IB : Got async event : port error",
              "Watchdog caught collective operation timeout"),
             kernel=("ib0: Link DOWN",), exit_code="1:0",
             params={"error_after_s": 2, "flaps": 1}),
        Case("spin_hang", "hangs"),
        Case("dataloader_stall", "hangs"),
        Case("fs_stall", "hangs", kernel=("LustreError: 11-0", "rc = -107")),
        Case("thermal_straggler", "slower"),
        Case("host_straggler", "slower"),
        Case("degradation", "runs", xids=(92, 63), params={"remap_after_s": 3}),
        Case("nan_divergence", "runs", ("lm loss: nan",)),
        Case("healthy", "runs"),
        Case("node_lost", "node_lost"),
        # a catalogue pattern's own example line (exporters/sim/signature.py)
        Case("log_signature", "failed", ("FileNotFoundError: [Errno 2] No such file or directory",),
             exit_code="1:0", params={**FAST, "pattern": "missing_file"}),
    )
}  # fmt: skip
# fs_stall stalls every job of the simulator: its batch mates are crash kinds, injected first
BATCHES = (
    ("xid79_off_bus", "ecc_dbe", "gsp_timeout", "nvlink_error"),
    ("app_fault", "segfault", "cuda_oom", "fs_stall"),
    ("spin_hang", "dataloader_stall", "thermal_straggler", "host_straggler"),
    ("degradation", "nan_divergence", "healthy", "ib_flap"),
    ("node_lost",),
    ("log_signature",),
)
KINDS = [k for batch in BATCHES for k in batch]


@dataclass
class Run:
    """What one kind's job did, observed while its batch ran."""

    kind: str
    name: str
    job_id: str = ""
    node: str = ""
    fault: dict[str, Any] = field(default_factory=dict)
    inj_iter: int = 0  # the simulator's iteration right after the fault
    pre: list[tuple[int, float]] = field(default_factory=list)  # (iteration, ms) lines before
    kernel_at: int = 0  # kernel log size before the fault
    started: float = 0.0  # monotonic time of the fault
    done: bool = False
    slurm: dict[str, str] = field(default_factory=dict)
    sacct: list[str] = field(default_factory=list)  # "STATE|EXITCODE" per run (-D)
    node_states: list[str] = field(default_factory=list)
    log: str = ""
    log_before: str = ""  # the job's log when the fault was injected (a requeue rewrites it)
    kernel: str = ""
    sim: dict[str, Any] = field(default_factory=dict)
    sim_log: str = ""  # the simulator's own log of the job (all its runs)
    error: str = ""

    @property
    def lines(self) -> list[tuple[int, float]]:
        return [(int(m[1]), float(m[2])) for m in PROGRESS.finditer(self.log)]

    @property
    def post(self) -> list[tuple[int, float]]:
        return [(i, ms) for i, ms in self.lines if i > self.inj_iter]


def _log_dir() -> Path:
    return Path(os.environ["GOODPUT_LOG_DIR"])


def _read(path: Path, offset: int = 0) -> str:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _node_bad(state: str) -> bool:
    return any(s in state for s in ("DOWN", "NOT_RESPONDING", "DRAIN", "FAIL"))


class Batches:
    """Runs the batches on demand against one simulator; remembers every job and lost node."""

    def __init__(self, script: Path) -> None:
        self.script = script
        self.runs: dict[str, Run] = {}
        self.jobs: list[str] = []
        self.lost: set[str] = set()
        self.timings: dict[tuple[str, ...], float] = {}

    def result(self, kind: str) -> Run:
        if kind not in self.runs:
            batch = next(b for b in BATCHES if kind in b)
            t0 = time.monotonic()
            runs = {k: Run(k, f"simkind-{k}-{uuid.uuid4().hex[:6]}") for k in batch}
            self.runs.update(runs)
            try:
                self._run(list(runs.values()))
            except (Exception, pytest.fail.Exception) as err:  # reported by each kind's test
                for r in runs.values():
                    r.error = r.error or f"{type(err).__name__}: {err}"
            finally:
                self._cleanup(list(runs.values()))
            self.timings[batch] = time.monotonic() - t0
        return self.runs[kind]

    # ---------------------------------------------------------------- one batch
    def _run(self, runs: list[Run]) -> None:
        for r in runs:
            out = slurm(
                "sbatch", "--parsable", "--requeue", "-N1", "--gpus-per-node=8",
                f"--job-name={r.name}", f"--output={_log_dir()}/jobs/slurm-%j.out",
                f"--chdir={ROOT}", str(self.script),
            )  # fmt: skip
            r.job_id = out.strip().split(";")[0]
            self.jobs.append(r.job_id)
        for r in runs:  # registered, and printing progress
            wait_until(
                lambda r=r: self._progress(r) >= 2, 90, 0.5, what=f"{r.kind} job {r.job_id} running"
            )
        for r in runs:
            self._inject(r)
        deadline = time.monotonic() + 75
        while not all(r.done for r in runs) and time.monotonic() < deadline:
            for r in runs:
                if not r.done and _WATCH[CASES[r.kind].ends](r):
                    self._snapshot(r)
            time.sleep(0.5)
        for r in runs:
            if not r.done:
                self._snapshot(r)
                r.error = f"still waiting for its end ({CASES[r.kind].ends}) after 75 s"

    def _progress(self, r: Run) -> int:
        job = requests.get(f"{API}/jobs/{r.job_id}", timeout=5)
        if job.status_code != 200 or job.json()["state"] != "RUNNING":
            return 0
        r.node = job.json()["nodes"][0]
        r.log = _read(_log_dir() / "jobs" / f"slurm-{r.job_id}.out")
        return len(r.lines)

    def _inject(self, r: Run) -> None:
        case = CASES[r.kind]
        r.pre, r.log_before = r.lines, r.log
        r.kernel_at = _size(_log_dir() / "kernel" / f"{r.node}.log")
        if r.kind != "healthy":
            body = {"kind": r.kind, "job_id": r.job_id, "params": case.params}
            if r.kind == "node_lost":
                self.lost.add(r.node)
            got = requests.post(f"{API}/faults", json=body, timeout=10)
            assert got.status_code == 201, f"inject {r.kind}: {got.status_code} {got.text}"
            r.fault = got.json()
        r.inj_iter = requests.get(f"{API}/jobs/{r.job_id}", timeout=5).json()["iteration"]
        r.started = time.monotonic()

    def _snapshot(self, r: Run) -> None:
        r.done = True
        r.slurm = scontrol_show("job", r.job_id)
        r.log = _read(_log_dir() / "jobs" / f"slurm-{r.job_id}.out")
        r.kernel = _read(_log_dir() / "kernel" / f"{r.node}.log", r.kernel_at)
        r.sim = requests.get(f"{API}/jobs/{r.job_id}", timeout=5).json()
        lines = requests.get(f"{API}/jobs/{r.job_id}/log", params={"offset": 0}, timeout=5)
        r.sim_log = "\n".join(lines.json()["lines"])
        if CASES[r.kind].ends in ("failed", "node_lost"):
            r.sacct = wait_until(lambda: _sacct(r), 20, 0.5, what=f"sacct for {r.job_id}")

    def _cleanup(self, runs: list[Run]) -> None:
        ids = [r.job_id for r in runs if r.job_id]
        if ids:
            slurm("scancel", *ids, check=False)
        for r in runs:
            if r.kind == "fs_stall" and r.fault.get("fault_id"):
                requests.delete(f"{API}/faults/{r.fault['fault_id']}", timeout=10)
        for node in sorted(self.lost):
            self.repair(node)

        def gone() -> bool:
            return all(scontrol_show("job", j).get("JobState", "") in ENDED | {""} for j in ids)

        wait_until(gone, 30, 0.5, what=f"jobs {ids} ended")

    def repair(self, node: str) -> None:
        """Power the node on in the simulator (restarts its slurmd), resume it, wait for it."""
        try:
            requests.post(f"{API}/nodes/{node}/repair", timeout=10)
        finally:
            slurm("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)

        def back() -> bool:
            state = scontrol_show("node", node).get("State", "DOWN")
            if "DOWN" in state and "NOT_RESPONDING" not in state:
                slurm("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
            return not _node_bad(state)

        wait_until(back, 60, 1, what=f"{node} back in service")
        self.lost.discard(node)


def _sacct(r: Run) -> list[str] | None:
    out = slurm(
        "sacct", "-j", r.job_id, "-X", "-D", "-n", "-P", "-o", "State,ExitCode", check=False
    )
    rows = [ln.strip() for ln in out.splitlines() if ln.strip()]
    want = "NODE_FAIL" if r.kind == "node_lost" else r.slurm.get("JobState", "")
    return rows if any(row.startswith(want) for row in rows) else None


# ---------------------------------------------------------------- when to stop watching
def _watch_failed(r: Run) -> bool:
    return scontrol_show("job", r.job_id).get("JobState") in ENDED


def _watch_window(r: Run) -> bool:
    return time.monotonic() - r.started >= WINDOW_S


def _watch_slower(r: Run) -> bool:
    r.log = _read(_log_dir() / "jobs" / f"slurm-{r.job_id}.out")
    return len(r.post) >= 3 or time.monotonic() - r.started >= 20


def _watch_node_lost(r: Run) -> bool:
    state = scontrol_show("node", r.node).get("State", "")
    if state and state not in r.node_states:
        r.node_states.append(state)
    job = scontrol_show("job", r.job_id)
    if int(job.get("Restarts", "0")) < 1 or not any(_node_bad(s) for s in r.node_states):
        return False
    sim = requests.get(f"{API}/jobs/{r.job_id}", timeout=5).json()  # registered again
    return bool(sim["state"] == "RUNNING" and sim["restarts"] >= 1)


_WATCH: dict[str, Callable[[Run], bool]] = {
    "failed": _watch_failed,
    "hangs": _watch_window,
    "runs": _watch_window,
    "slower": _watch_slower,
    "node_lost": _watch_node_lost,
}


# ---------------------------------------------------------------- fixtures
def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture(scope="module")
def batches(local_stack, tmp_path_factory) -> Iterator[Batches]:
    for port in (CONTROL, NODE_BASE + 1, NODE_BASE + 4):
        if not _port_free(port):
            pytest.fail(f"port {port} is taken (a simulator left over from an earlier run?)")
    tmp = tmp_path_factory.mktemp("simkinds")
    script = tmp / "job.sh"
    script.write_text(
        f"#!/bin/bash\nexec {sys.executable} -m goodput.cli sim job --sim-url "
        f"http://127.0.0.1:{CONTROL} --step-time {STEP_S} --init 1 --warmup 0 "
        f"--log-interval {LOG_EVERY}\n"
    )
    with open(tmp / "sim.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "goodput.cli", "sim", "serve", "--scheduler", "slurm",
             "--control-port", str(CONTROL), "--node-base-port", str(NODE_BASE),
             "--tick", "0.5"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy(),
        )  # fmt: skip
    runner = Batches(script)
    try:
        wait_until(lambda: _up(f"{API}/cluster"), 30, what="simulator control API")
        yield runner
    finally:
        if runner.jobs:
            slurm("scancel", *runner.jobs, check=False)
        for node in sorted(runner.lost):
            runner.repair(node)
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        forget_faults(os.environ["GOODPUT_PROMETHEUS_URL"], os.environ["GOODPUT_LOG_DIR"])
        took = ", ".join(f"{'+'.join(b)} {t:.0f}s" for b, t in runner.timings.items())
        print(f"\nsim kinds batches: {took}\nsimulator log: {tmp / 'sim.log'}")


def _up(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.RequestException:
        return False


# ---------------------------------------------------------------- the tests
def test_every_kind_has_a_case_in_one_batch():
    assert set(CASES) == set(FAULT_KINDS) | {"healthy"}
    assert sorted(KINDS) == sorted(CASES)  # each kind in exactly one batch
    assert all(len(b) <= 4 for b in BATCHES)


@pytest.mark.parametrize("kind", KINDS)
def test_kind_as_a_real_slurm_job(batches, kind):
    r = batches.result(kind)
    case = CASES[kind]
    if r.error:
        pytest.fail(f"{kind} (job {r.job_id} on {r.node}): {r.error}\n{r.log[-2000:]}")
    assert "NCCL INFO" in r.log_before and len(r.pre) >= 2, "the job never trained"
    for text in case.log:
        assert text in r.log, f"{text!r} not in slurm-{r.job_id}.out"
    for xid in case.xids:
        assert re.search(rf"NVRM: Xid \(PCI:[0-9a-f:]+\): {xid}, ", r.kernel), (
            f"no Xid {xid} in kernel/{r.node}.log after the fault: {r.kernel[-1000:]!r}"
        )
    for text in case.kernel:
        assert text in r.kernel, f"{text!r} not in kernel/{r.node}.log after the fault"
    _CHECK[case.ends](case, r)


def _check_failed(case: Case, r: Run) -> None:
    assert r.slurm.get("JobState") == "FAILED", r.slurm
    assert r.slurm.get("ExitCode") == case.exit_code, r.slurm
    assert r.slurm.get("NodeList") == r.node
    assert f"FAILED|{case.sacct_exit or case.exit_code}" in r.sacct, r.sacct
    assert r.sim["state"] == "FAILED"


def _check_hangs(case: Case, r: Run) -> None:
    assert r.slurm.get("JobState") == "RUNNING", r.slurm
    assert r.post == [], f"progress after the fault (iteration {r.inj_iter}): {r.post}"
    assert r.sim["state"] == "RUNNING" and r.sim["iteration"] <= r.inj_iter + 1, r.sim


def _check_runs(case: Case, r: Run) -> None:
    assert r.slurm.get("JobState") == "RUNNING", r.slurm
    assert len(r.post) >= 3, f"too little progress in {WINDOW_S}s after the fault: {r.post}"
    assert r.sim["state"] == "RUNNING"
    nan = [ln for ln in r.log.splitlines() if "lm loss: nan" in ln]
    if case.kind == "nan_divergence":
        assert len(nan) >= len(r.post) - 1 >= 2, "the loss is not nan after the fault"
    else:
        assert not nan
    if case.kind == "healthy":
        for bad in ("CUDA error", "Watchdog", "Traceback", "ChildFailedError", "WARN"):
            assert bad not in r.log


def _check_slower(case: Case, r: Run) -> None:
    assert r.slurm.get("JobState") == "RUNNING", r.slurm
    assert len(r.post) >= 3, f"too few progress lines after the fault: {r.post}"
    before = statistics.median(ms for _, ms in r.pre)
    after = statistics.median(ms for _, ms in r.post)
    slowdown = FAULT_KINDS[case.kind].defaults["slowdown"]
    assert after >= before * (1 + (slowdown - 1) * 0.75), (before, after, r.post)


def _check_node_lost(case: Case, r: Run) -> None:
    assert any("DOWN" in s or "NOT_RESPONDING" in s for s in r.node_states), r.node_states
    assert int(r.slurm.get("Restarts", "0")) >= 1, r.slurm
    assert r.slurm.get("JobState") == "RUNNING", r.slurm
    assert any(row.startswith("NODE_FAIL") for row in r.sacct), r.sacct
    assert f"*** JOB {r.job_id} ON {r.node} CANCELLED AT " in r.sim_log
    assert "DUE TO NODE FAILURE" in r.sim_log
    assert r.sim["restarts"] >= 1 and r.sim["state"] == "RUNNING", r.sim


_CHECK: dict[str, Callable[[Case, Run], None]] = {
    "failed": _check_failed,
    "hangs": _check_hangs,
    "runs": _check_runs,
    "slower": _check_slower,
    "node_lost": _check_node_lost,
}

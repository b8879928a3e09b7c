"""Log lines as real jobs and kernels print them (formats from failures.md), and log sinks."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import IO


def _ts(t: float) -> str:
    """A zone-less stamp in the node's local time, as Python logging and glog write them
    (read back in GOODPUT_LOG_TIMEZONE, by default the host's zone)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _torch_ts(t: float, level: str = "E") -> str:
    us = int((t % 1) * 1e9)
    return f"{level}{time.strftime('%m%d %H:%M:%S', time.localtime(t))}.{us:09d}"


def kernel(t: float, node: str, text: str) -> str:
    """A kernel log line in journalctl's short-iso form."""
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S+0000', time.gmtime(t))} {node} kernel: {text}"


def xid_lines(t: float, node: str, pci: str, uuid: str, xid: int, detail: str) -> list[str]:
    short = pci[4:] if len(pci) > 12 else pci  # 00000000:18:00.0 -> 0000:18:00.0
    short = short.rsplit(".", 1)[0]
    return [
        kernel(t, node, f"NVRM: GPU at PCI:{short}: {uuid}"),
        kernel(t, node, f"NVRM: Xid (PCI:{short}): {xid}, {detail}"),
    ]


XID_DETAIL = {
    79: "pid=<unknown>, name=<unknown>, GPU has fallen off the bus.",
    48: "pid={pid}, name=python, An uncorrectable double bit error (DBE) has been detected on "
    "GPU in the framebuffer at partition 0, subpartition 0.",
    63: "pid={pid}, name=python, Row Remapper: New row (0x00000000000a7f20) Marked for "
    "Remapping, reset gpu to activate.",
    92: "pid={pid}, name=python, High single-bit ECC error rate",
    119: "pid={pid}, name=python, Timeout after 6s of waiting for RPC response from GPU{gpu} GSP! "
    "Expected function 76 (GSP_RM_CONTROL) (0x2080014b 0x5).",
    74: "pid={pid}, name=python, NVLink: fatal error detected on link 6(0x10000, 0x0, 0x0, 0x0, "
    "0x0, 0x0, 0x0)",
    13: "pid={pid}, name=python, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): "
    "Illegal Instruction Parameter",
    31: "pid={pid}, name=python, channel 0x00000010, intr 10000000. MMU Fault: ENGINE GRAPHICS "
    "GPCCLIENT_T1_0 faulted @ 0x7f3a_4c000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ",
}


def job_header(t: float, job_id: str, name: str, nodes: list[str], gpn: int) -> list[str]:
    """What the launcher prints at once: the command and the allocation."""
    return [
        f"+ srun torchrun --nnodes={len(nodes)} --nproc-per-node={gpn} pretrain_gpt.py "
        f"--job-name {name}",
        f"[{_ts(t)}] SLURM_JOB_ID={job_id} nodes={','.join(nodes)} world_size={len(nodes) * gpn}",
    ]


def startup(nodes: list[str], gpn: int, pid: int) -> list[str]:
    """The job's start-up lines once its processes are up (NCCL init, model build)."""
    n = len(nodes) * gpn
    out = [
        f"{nodes[0]}:{pid}:{pid} [0] NCCL INFO Bootstrap : Using ib0:10.0.0.1<0>",
        f"{nodes[0]}:{pid}:{pid} [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
    ]
    for r in range(0, n, max(1, gpn)):
        node = nodes[r // gpn]
        out.append(
            f"{node}:{pid + r}:{pid + r + 60} [0] NCCL INFO comm 0x55d5c8a{r:03x} rank {r} "
            f"nranks {n} cudaDev 0 nvmlDev 0 busId 18000 commId 0x7e1f4c2a9b3d5e61 - Init COMPLETE"
        )
    return [*out, "> building GPT model ..."]


def checkpoint_load(it: int, name: str) -> list[str]:
    """Megatron resuming: the load begins (the lines of Megatron-DeepSpeed#14, dlrover#977)."""
    return [
        f" loading checkpoint from /checkpoints/{name} at iteration {it}",
        " checkpoint version 3.0",
    ]


def training_begins(t: float) -> list[str]:
    """Start-up done: the first iteration follows (0.3-0.5 s later on the measured H200)."""
    return [f"[after dataloaders are built] datetime: {_ts(t)}", "training ..."]


def progress(
    t: float,
    it: int,
    total: int,
    gbs: int,
    step_ms: float,
    loss: float,
    lr: float,
    gnorm: float,
    skipped: int,
    nans: int,
    tflops: float,
) -> str:
    loss_s = "nan" if loss != loss else f"{loss:.6E}"
    gn = "nan" if loss != loss else f"{gnorm:.3f}"
    return (
        f" [{_ts(t)}] iteration {it:>8d}/{total:>8d} | consumed samples: {it * gbs:>12d} | "
        f"elapsed time per iteration (ms): {step_ms:.1f} | throughput per GPU (TFLOP/s/GPU): "
        f"{tflops:.1f} | learning rate: {lr:.6E} | global batch size: {gbs:>5d} | "
        f"lm loss: {loss_s} | loss scale: 1.0 | grad norm: {gn} | "
        f"number of skipped iterations: {skipped:>3d} | number of nan iterations: {nans:>3d} |"
    )


def checkpoint_start(t: float, it: int, name: str) -> str:
    return f" [{_ts(t)}] saving checkpoint at iteration {it:>7d} to /checkpoints/{name}"


def checkpoint_done(t: float, it: int, name: str) -> str:
    return (
        f"  successfully saved checkpoint from iteration {it:>7d} to /checkpoints/{name} "
        f"[ t 1/1, p 1/1 ] [{_ts(t)}]"
    )


def tokenizer_bar(done_s: float, total_s: float, examples: int = 2_000_000) -> str:
    """One update of the bar transformers' examples print while rank 0 tokenises the data
    set (`Running tokenizer on dataset`, hiyouga/LlamaFactory#2424)."""
    return _bar("Running tokenizer on dataset", done_s, total_s, examples, " examples/s")


def eval_bar(done_s: float, total_s: float, batches: int = 100) -> str:
    """One update of an evaluation's tqdm bar (Hugging Face, Lightning and most scripts print
    one; the log follower reads each \\r-rewritten update as a line)."""
    return _bar("Evaluating", done_s, total_s, batches, "it/s")


def _bar(what: str, done_s: float, total_s: float, total: int, unit: str) -> str:
    """A tqdm bar `done_s` into `total_s` of `total` items: `what: pct%|###| n/total [...]`."""
    n = max(1, min(total, round(total * done_s / total_s)))
    rate = total / total_s
    pct = 100 * n // total
    bar = ("#" * (pct // 10)).ljust(10)
    when = f"[{_mmss(done_s)}<{_mmss((total - n) / rate)}, {rate:.2f}{unit}]"
    return f"{what}: {pct:3d}%|{bar}| {n}/{total} {when}"


def _mmss(s: float) -> str:
    return f"{int(s) // 60:02d}:{int(s) % 60:02d}"


def validation(t: float, it: int, loss: float) -> list[str]:
    ppl = "nan" if loss != loss else f"{min(2.0 ** (loss * 1.4427), 1e30):.6E}"
    line = f" validation loss at iteration {it} | lm loss value: {loss:.6E} | lm loss PPL: {ppl} | "
    bar = "-" * len(line)
    return [bar, line, bar]


def watchdog(t: float, rank: int, seq: int, timeout_ms: int, enq: int, done: int) -> list[str]:
    ts = _torch_ts(t)
    return [
        f"[rank{rank}]:[{ts} ProcessGroupNCCL.cpp:607] [Rank {rank}] Watchdog caught collective "
        f"operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=466119168, "
        f"NumelOut=466119168, Timeout(ms)={timeout_ms}) ran for {timeout_ms + 60} milliseconds "
        "before timing out.",
        f"[rank{rank}]:[{ts} ProcessGroupNCCL.cpp:1664] [PG 1 Rank {rank}] Exception (either an "
        f"error or timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: {enq}, "
        f"last completed NCCL work: {done}.",
    ]


def cuda_error(t: float, rank: int, message: str) -> list[str]:
    return [
        f"[rank{rank}]:[{_torch_ts(t)} ProcessGroupNCCL.cpp:1896] [PG ID 0 PG GUID 0(default_pg) "
        f"Rank {rank}] Process group watchdog thread terminated with exception: CUDA error: "
        f"{message}",
        f"[rank{rank}]: RuntimeError: CUDA error: {message}",
        f"[rank{rank}]: Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
    ]


def oom(rank: int, local: int, total_gib: float) -> list[str]:
    return [
        f"[rank{rank}]: Traceback (most recent call last):",
        f'[rank{rank}]:   File "pretrain_gpt.py", line 241, in forward_step',
        f"[rank{rank}]: torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate "
        f"2.00 GiB. GPU {local} has a total capacity of {total_gib:.2f} GiB of which 1.06 GiB is "
        "free. Including non-PyTorch memory, this process has 138.70 GiB memory in use.",
    ]


def elastic_failure(
    t: float, rank: int, local: int, node: str, exitcode: int, pid: int
) -> list[str]:
    sig = {-6: "Signal 6 (SIGABRT)", -11: "Signal 11 (SIGSEGV)", -9: "Signal 9 (SIGKILL)"}
    tb = (
        f"{sig[exitcode]} received by PID {pid}"
        if exitcode in sig
        else ("To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html")
    )
    return [
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        "============================================================",
        "pretrain_gpt.py FAILED",
        "------------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        f"  time      : {_ts(t)}",
        f"  host      : {node}",
        f"  rank      : {rank} (local_rank: {local})",
        f"  exitcode  : {exitcode} (pid: {pid})",
        "  error_file: <N/A>",
        f"  traceback : {tb}",
        "============================================================",
    ]


def srun_task_failed(node: str, rank: int, detail: str) -> str:
    return f"srun: error: {node}: task {rank}: {detail}"


def node_fail_cancel(t: float, job_id: str, node: str) -> str:
    return cancelled(t, job_id, node, "DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS")


def cancelled(t: float, job_id: str, node: str, reason: str = "") -> str:
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))  # slurmstepd: local time
    tail = f" {reason}" if reason else ""
    return f"slurmstepd: error: *** JOB {job_id} ON {node} CANCELLED AT {when}{tail} ***"


def ib_port_error(node: str, pid: int, local: int) -> str:
    return f"{node}:{pid}:{pid + 90} [{local}] NCCL WARN NET/IB : Got async event : port error"


def ib_transport_error(node: str, pid: int, local: int) -> str:
    return (
        f"{node}:{pid}:{pid + 91} [{local}] NCCL WARN NET/IB : Got completion from peer "
        "10.0.0.7<46183> with status=12 opcode=0 len=0 vendor err 129 (Recv) "
        "localGid ::ffff:10.0.0.5 remoteGids ::ffff:10.0.0.7 hca mlx5_0"
    )


def lustre(t: float, node: str) -> str:
    return kernel(
        t,
        node,
        "LustreError: 11-0: scratch-MDT0000-mdc-ffff88203810d800: operation "
        "obd_ping to node 172.31.126.88@o2ib failed: rc = -107",
    )


class LogSink:
    """Collects job and kernel log lines in memory and, with `root`, appends them to
    root/jobs/slurm-<id>.out and root/kernel/<node>.log as they come."""

    def __init__(self, root: Path | None = None, write_jobs: bool = True) -> None:
        self.root = root
        self.write_jobs = write_jobs
        self.jobs: dict[str, list[str]] = defaultdict(list)
        self.kernel: dict[str, list[str]] = defaultdict(list)
        self._files: dict[Path, IO[str]] = {}

    def job(self, job_id: str, lines: list[str] | str) -> None:
        lines = [lines] if isinstance(lines, str) else lines
        self.jobs[job_id].extend(lines)
        if self.root is not None and self.write_jobs:
            self._append(self.root / "jobs" / f"slurm-{job_id}.out", lines)

    def node(self, node: str, lines: list[str] | str) -> None:
        lines = [lines] if isinstance(lines, str) else lines
        self.kernel[node].extend(lines)
        if self.root is not None:
            self._append(self.root / "kernel" / f"{node}.log", lines)

    def _append(self, path: Path, lines: list[str]) -> None:
        f = self._files.get(path)
        if f is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            f = self._files[path] = path.open("a")
        f.write("".join(line + "\n" for line in lines))

    def flush(self) -> None:
        for f in self._files.values():
            f.flush()

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

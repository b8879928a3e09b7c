"""The catalogue's patterns on the formats in failures.md and on variants of them."""

# ruff: noqa: E501  (real log lines are long)
from __future__ import annotations

import doctest
import math

import pytest

import catalogue
from catalogue import match_line, xid_info

OUTCOMES = {
    "gpu_hardware_fault", "gpu_degradation", "network_fault", "node_lost", "filesystem",
    "workload_crash", "workload_oom", "workload_divergence", "workload_hang", "straggler",
    "scheduler_event", "unknown", "healthy",
}  # fmt: skip

# (source, line, pattern id that must be among the matches, groups that must be present)
VARIANTS = [
    # NCCL watchdog: PyTorch 2.x, older 1.x wording, and without the rank prefix
    ("job", "[rank12]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 12] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLGATHER, NumelIn=1, NumelOut=8, Timeout(ms)=600000) ran for 600123 milliseconds before timing out.",
     "nccl_watchdog_timeout", {"rank": 12, "seqnum": 7, "op": "ALLGATHER", "timeout_ms": 600000, "ran_ms": 600123}),
    ("job", "[E ProcessGroupNCCL.cpp:828] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=_ALLGATHER_BASE, Timeout(ms)=1800000) ran for 1800572 milliseconds before timing out.",
     "nccl_watchdog_timeout", {"rank": 3, "op": "_ALLGATHER_BASE"}),
    ("job", "  4: [PG 0 Rank 4] Exception (either an error or timeout) detected by watchdog at work: 12, last enqueued NCCL work: 12, last completed NCCL work: 11.",
     "nccl_watchdog_work_status", {"rank": 4, "last_enqueued": 12, "last_completed": 11}),
    ("job", "gpu-node-7:1234:5678 [3] NCCL WARN NET/IB : Got async event : port error",
     "nccl_ib_port_error", {"detail": "port error"}),
    ("job", "node1:1:2 [0] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.1.1.1<1234> with error 12, opcode 32753, len 0, vendor err 129",
     "nccl_ib_port_error", {"rc": 12}),
    # CUDA kinds
    ("job", "[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered", "cuda_illegal_memory_access", {"rank": 1}),
    ("job", "terminate called after throwing an instance of 'c10::Error' what(): CUDA error: an illegal memory access was encountered", "cuda_illegal_memory_access", {}),
    ("job", "[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 2 has a total capacity of 139.72 GiB of which 1.2 GiB is free.", "cuda_oom", {"rank": 2, "gpu": 2}),
    ("job", "RuntimeError: CUDA error: uncorrectable ECC error encountered", "cuda_ecc_uncorrectable", {}),
    ("job", "RuntimeError: CUDA error: unspecified launch failure", "cuda_error", {"detail": "unspecified launch failure"}),
    # host OOM, signals, elastic summary, Slurm
    ("job", "slurmstepd: error: Detected 3 oom-kill events in StepId=77.batch. Some of your processes may have been killed by the cgroup out-of-memory handler.", "host_oom", {}),
    ("kernel", "Jan  2 03:04:05 node2 kernel: [4242.1] Out of memory: Killed process 31337 (python3) total-vm:100kB", "host_oom", {"pid": 31337, "process": "python3"}),
    ("job", "  traceback : Signal 11 (SIGSEGV) received by PID 99", "segfault", {"pid": 99}),
    ("job", "/var/spool/slurmd/job01/slurm_script: line 9: 4242 Segmentation fault      (core dumped) python train.py", "segfault", {}),
    ("kernel", "node3 kernel: pt_main_thread[77]: segfault at 8 ip 00007f sp 00007f error 4 in libtorch.so", "segfault", {"pid": 77, "process": "pt_main_thread"}),
    ("job", "  traceback : Signal 6 (SIGABRT) received by PID 2385923", "elastic_exit_sigabrt", {"pid": 2385923}),
    ("job", "  traceback : Signal 9 (SIGKILL) received by PID 5", "signal_received", {"signal": 9, "detail": "SIGKILL"}),
    ("job", "  rank      : 11 (local_rank: 3)", "elastic_child_failed", {"rank": 11, "local_rank": 3}),
    ("job", "  exitcode  : 1 (pid: 77)", "elastic_child_failed", {"exitcode": 1, "pid": 77}),
    ("job", "srun: error: node4: tasks 8-15: Exited with exit code 1", "slurm_task_failed", {"node": "node4", "rank": 8, "exitcode": 1}),
    ("job", "slurmstepd: error: *** JOB 4242 ON node2 CANCELLED AT 2025-01-01T00:00:00 DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***", "slurm_job_node_failure", {"slurm_job_id": "4242", "node": "node2"}),
    # divergence, progress, checkpoints
    ("job", " iteration     3000/  10000 | consumed samples:      1536000 | elapsed time per iteration (ms): 9876.5 | learning rate: 1.0E-04 | global batch size:   512 | lm loss: -nan | loss scale: 1.0 | number of skipped iterations:   1 | number of nan iterations:   1 |", "nan_loss", {}),
    ("job", "[2025-01-01 00:00:00] iteration      10/     100 | consumed samples:          80 | elapsed time per iteration (ms): 250.0 | global batch size:     8 | lm loss: 7.1E+00 | number of skipped iterations:   2 | number of nan iterations:   0 |",
     "megatron_progress", {"iteration": 10, "iterations_total": 100, "samples": 80, "step_ms": 250.0, "global_batch_size": 8, "loss": 7.1, "skipped": 2, "nan": 0}),
    ("job", "  3: step 42/1000 loss 3.21 | 87.5 ms/step | 2048.0 samples/s", "generic_progress", {"rank": 3, "iteration": 42, "loss": 3.21, "step_ms": 87.5, "samples_per_second": 2048.0}),
    ("job", "[rank0]: successfully saved checkpoint from iteration     200 to /ckpt [ t 1/8, p 1/1 ]", "checkpoint_saved", {"iteration": 200, "rank": 0}),
    # filesystem and network (kernel)
    ("kernel", "Mar  1 00:00:01 node1 kernel: LustreError: 11-0: scratch-MDT0000-mdc-ffff8f: operation mds_getattr to node 10.0.0.2@o2ib failed: rc = -110", "lustre_error", {"rc": -110}),
    ("job", "LustreError: 11-0: jmain01-MDT0000-mdc-ffff88203810d800: operation obd_ping to node 172.31.126.88@o2ib failed: rc = -107", "lustre_error", {"rc": -107}),
    ("kernel", "node2 kernel: mlx5_core 0000:c1:00.0: mlx5_port_module_event:1162:(pid 0): Port 1 link down", "ib_link_down", {}),
    # XIDs: failures.md formats and variants
    ("kernel", "May 18 19:02:39 kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.", "nvrm_xid", {"xid": 79, "pci": "0000:2b:00"}),
    ("kernel", "NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter", "nvrm_xid", {"xid": 13, "pci": "0000:cb:00"}),
    ("kernel", "[Tue May 21 10:00:00 2024] NVRM: Xid (PCI:0000:18:00): 43, pid=1234, name=python, Ch 00000008", "nvrm_xid", {"xid": 43}),
    ("kernel", "node4 kernel: NVRM: Xid (PCI:0000:5d:00): 74, pid=1, name=python, NVLink: fatal error detected on link 3(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)", "nvrm_xid", {"xid": 74}),
    ("kernel", "kernel: NVRM: Xid (PCI:0000:2b:00): 79, pid=0, name=, GPU has fallen off the bus.", "nvrm_gpu_off_bus", {"pci": "0000:2b:00"}),
    ("kernel", "May 18 19:02:39 kernel: NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae", "nvrm_gpu_identity", {"pci": "0000:2b:00", "gpu_uuid": "GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae"}),
]  # fmt: skip

HEALTHY = [
    ("job", "NCCL INFO Channel 00/32 :    0   1   2   3   4   5   6   7"),
    ("job", "[rank0]: Building dataset index, 12345 documents"),
    ("job", "loading checkpoint from /ckpt at iteration 100"),
    ("job", "torch.distributed: initialized process group with timeout 0:30:00"),
    ("kernel", "kernel: NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15"),
    ("kernel", "kernel: mlx5_core 0000:c1:00.0 ibp193s0: Link up"),
]


@pytest.mark.parametrize(
    ("source", "line", "pid", "groups"), VARIANTS, ids=[v[2] for v in VARIANTS]
)
def test_variant_matches_with_groups(source, line, pid, groups):
    matches = {m.pattern: m for m in match_line(line, source)}
    assert pid in matches, f"{pid} not in {sorted(matches)}"
    got = matches[pid].groups
    for key, value in groups.items():
        assert got.get(key) == value, (key, got)


@pytest.mark.parametrize(("source", "line"), HEALTHY)
def test_healthy_lines_name_no_fault(source, line):
    assert [m.pattern for m in match_line(line, source) if m.role != "info"] == []


def test_nan_loss_parses_as_float_nan():
    line = " iteration 5/10 | consumed samples: 40 | lm loss: nan | number of nan iterations: 1 |"
    by_id = {m.pattern: m for m in match_line(line, "job")}
    assert {"megatron_progress", "nan_loss"} <= set(by_id)
    assert math.isnan(by_id["megatron_progress"].groups["loss"])
    assert by_id["megatron_progress"].groups["nan"] == 1


def test_exclusive_patterns_report_only_the_most_specific():
    ids = [m.pattern for m in match_line("RuntimeError: CUDA error: out of memory", "job")]
    assert ids == ["cuda_oom"]
    ids = [
        m.pattern for m in match_line("  traceback : Signal 11 (SIGSEGV) received by PID 1", "job")
    ]
    assert ids == ["segfault"]
    line = " iteration 5/10 | lm loss: 1.0 | number of nan iterations: 0 |"
    assert [m.pattern for m in match_line(line, "job")] == ["megatron_progress"]


def test_source_filters_patterns():
    hung = "kernel: INFO: task python:4242 blocked for more than 120 seconds."
    assert [m.pattern for m in match_line(hung, "job")] == []
    assert [m.pattern for m in match_line(hung, "kernel")] == ["kernel_hung_task"]
    # an XID is the node's, but platforms forward it into the job's log too (source: any)
    xid = "NVRM: Xid (PCI:0000:2b:00): 48, pid=1, name=python, DBE"
    assert [m.pattern for m in match_line(xid, "job")] == ["nvrm_xid"]
    with pytest.raises(ValueError, match="source"):
        match_line(xid, "stdout")


def test_a_fallback_pattern_steps_aside_for_a_specific_one():
    crash = "UnboundLocalError: cannot access local variable 'grad_norm' where it is not associated"
    assert [m.pattern for m in match_line(crash, "job")] == ["python_code_error"]
    nan = "AssertionError: Rank 3: found NaN in local grad norm in backwards pass."
    assert [m.pattern for m in match_line(nan, "job")] == ["nan_loss"]


def test_huge_and_garbage_lines_are_safe():
    huge = "x" * 1_000_000 + " CUDA error: an illegal memory access was encountered"
    assert match_line(huge, "job") == []  # matched on the first 8192 characters only
    garbage = "\x00\ufffd\x1b[31m" * 1000 + " CUDA out of memory"
    assert [m.pattern for m in match_line(garbage, "job")] == ["cuda_oom"]


def test_xid_table():
    assert xid_info(79).job_action == "drain_and_requeue"
    assert xid_info(48).outcome == "gpu_hardware_fault"
    assert xid_info(13).outcome == "workload_crash" and xid_info(13).job_action == "requeue"
    assert xid_info(43).consequence and xid_info(45).consequence
    assert not xid_info(79).consequence
    assert xid_info(63).job_action == "drain" and xid_info(63).outcome == "gpu_degradation"
    assert xid_info(9999) is None
    for code in (46, 62, 109, 119, 120, 136, 140, 143):
        assert xid_info(code).severity == "critical"


def test_outcomes_are_the_agreed_names():
    assert set(catalogue.outcomes()) == OUTCOMES
    assert set(catalogue.categories()) == {"infrastructure", "workload", "unknown"}
    assert catalogue.outcomes()["workload_oom"].category == "workload"
    assert set(catalogue.actions()) == {
        "drain", "drain_and_requeue", "requeue", "stop", "hold_for_person", "resume_node", "none",
    }  # fmt: skip
    for p in catalogue.load_patterns():
        assert p.outcome == "" or p.outcome in OUTCOMES


def test_module_docstring_examples_run():
    assert doctest.testmod(catalogue, raise_on_error=False).failed == 0


# How launchers and loggers lead a job's line: Python logging, a recorder's bracketed stamp,
# ISO with a zone, srun --label, torchrun's rank prefix, `dmesg -T`'s bracketed ctime.
LEADS = [
    "2024-04-10 16:02:56,193 ",
    "[2026-11-29 19:01:37.728] ",
    "2026-11-29T19:01:37.728421Z ",
    "  3: ",
    "[default0]:",
    "  3: [2026-11-29 19:01:37.728] ",
    "[Fri Aug 30 11:43:09 2024] ",
]


@pytest.mark.parametrize("lead", LEADS)
def test_every_job_pattern_matches_its_examples_behind_a_stamp_or_a_launcher_prefix(lead):
    """A job's output as written to its file often carries a time stamp or a rank label; the
    patterns anchored at the message's start (`^\\s*>\\s*initialized distributed`, torch
    elastic's `exitcode : -6`) must still see it. Failed before: `goodput import` of the real
    H200 log read no start-up line (`[2026-11-29 19:01:37.728] > initialized ...`), so the
    job's start-up was never dated, and srun-labelled elastic summaries named no crash."""
    cat = catalogue.default()
    for p in cat.patterns:
        if p.source != "job":
            continue
        for line in p.examples:
            got = {m.pattern for m in cat.match_line(lead + line, "job")}
            assert p.id in got, (lead + line, got)


@pytest.mark.parametrize("lead", LEADS)
def test_a_stamp_or_a_prefix_adds_no_match_to_a_healthy_line(lead):
    for source, line in HEALTHY:
        plain = {m.pattern for m in match_line(line, source)}
        assert {m.pattern for m in match_line(lead + line, source)} == plain, lead + line


def test_real_step_lines_behind_a_logger_header_are_progress():
    """torchtitan's `[titan] <stamp> - root - INFO - step: 14  loss: ...` and absl's
    `I0319 04:50:42.613272   364 learning.py:507] global step 162: loss = ...` (real lines of
    tests/corpus, each with its source) are the job's progress, iteration and loss. Failed
    before: the header's fields put `step` past the pattern's reach, so such a job had no
    progress metric at all (no stall, no step time, no never-started judgement)."""
    import re
    from pathlib import Path

    import yaml

    corpus = Path(__file__).resolve().parents[1] / "corpus"
    lines = [
        e["line"]
        for family in ("torchtitan", "training")
        for e in yaml.safe_load((corpus / f"{family}.yaml").read_text())["entries"]
        if re.search(r"(?:\] |- )(?:global )?step:? +\d+.*\bloss", e["line"])
    ]
    assert len(lines) == 5
    for line in lines:
        (m,) = [m for m in match_line(line, "job") if m.pattern == "generic_progress"]
        assert m.groups["iteration"] > 0 and m.groups["loss"] > 0, line

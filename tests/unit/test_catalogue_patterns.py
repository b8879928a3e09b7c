"""The catalogue's patterns on the formats in failures.md and on variants of them."""

# ruff: noqa: E501  (real log lines are long)
from __future__ import annotations

import doctest
import math
import re
import time

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
    ("kernel", "node3 kernel: pt_main_thread[77]: segfault at 8 ip 00007f sp 00007f error 4 in libtorch.so", "kernel_segfault", {"pid": 77, "process": "pt_main_thread"}),
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
    # a MIG-enabled GPU: the GPU instance (and compute instance) after the PCI address (NVIDIA
    # open-gpu-kernel-modules, kern_gpu_error_cont_ga100.c); the exporter counts the xid group
    ("kernel", "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No", "nvrm_xid", {"xid": 94, "pci": "0000:01:00"}),
    ("kernel", "NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 48, pid=9, name=python, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.", "nvrm_xid", {"xid": 48, "pci": "0000:3b:00"}),
    ("kernel", "NVRM: Xid (PCI:0000:2b:00 GPU-I:03): 79, pid=0, name=, GPU has fallen off the bus.", "nvrm_gpu_off_bus", {"pci": "0000:2b:00"}),
    ("kernel", "NVRM: Xid (PCI:0018:01:00 GPU-I:02): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2)", "nvrm_xid_nvlink_nonfatal", {"xid": 145}),
    ("kernel", "NVRM: Xid (PCI:0000:01:00 GPU-I:01 GPU-CI:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", "nvrm_xid_reset_required", {"xid": 154}),
    # the Hugging Face Trainer's log dict: a nan loss, and a nan grad norm beside the 0.0 it logs
    # when every step since the last log was nan (https://github.com/AnswerDotAI/ModernBERT/issues/233)
    ("job", "{'loss': nan, 'grad_norm': nan, 'learning_rate': 9.773696745450087e-06, 'epoch': 0.53}", "nan_loss", {}),
    ("job", "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 9.773696745450087e-06, 'epoch': 0.53}", "nan_loss", {}),
    ("job", "{'loss': 0.0, 'grad_norm': inf, 'learning_rate': 2e-05, 'epoch': 0.01}", "nan_loss", {}),
]  # fmt: skip

HEALTHY = [
    ("job", "NCCL INFO Channel 00/32 :    0   1   2   3   4   5   6   7"),
    ("job", "[rank0]: Building dataset index, 12345 documents"),
    ("job", "loading checkpoint from /ckpt at iteration 100"),
    ("job", "torch.distributed: initialized process group with timeout 0:30:00"),
    ("kernel", "kernel: NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15"),
    ("kernel", "kernel: mlx5_core 0000:c1:00.0 ibp193s0: Link up"),
    # fp16 steps the loss scaler skipped: grad norm nan or inf, the loss finite (mmengine, mmcv,
    # the Hugging Face Trainer)
    ("job", "10/30 22:19:57 - mmengine - INFO - Epoch(train) [1][240/735]  lr: 1.9813e-04  eta: 2:44:49  time: 2.8874  data_time: 0.0042  memory: 10762  loss: 2.5128  grad_norm: nan"),
    ("job", " Epoch [1][100/62598]\tlr: 1.000e-03, eta: 6 days, 15:22:46, time: 0.539, data_time: 0.051, memory: 7239, loss_ce: 1.2757, horizon_bbox_loss: 0.2828, vertical_bbox_loss: 0.3507, loss: 1.9091, grad_norm: nan"),
    ("job", "{'loss': 0.2051, 'grad_norm': inf, 'learning_rate': 9.774074342405685e-06, 'epoch': 0.53}"),
]  # fmt: skip


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


# ---------------------------------------------------------------- backtracking on long lines
try:  # the regex parser: a regex's own literal text, to build lines it fails on slowly
    import re._constants as _sc
    import re._parser as _sp
except ImportError:  # Python < 3.11
    import sre_constants as _sc  # type: ignore[no-redef]
    import sre_parse as _sp  # type: ignore[no-redef]

_CATEGORY = {
    _sc.CATEGORY_DIGIT: r"\d", _sc.CATEGORY_NOT_DIGIT: r"\D", _sc.CATEGORY_SPACE: r"\s",
    _sc.CATEGORY_NOT_SPACE: r"\S", _sc.CATEGORY_WORD: r"\w", _sc.CATEGORY_NOT_WORD: r"\W",
}  # fmt: skip
_REPEATS = {_sc.MAX_REPEAT, _sc.MIN_REPEAT, getattr(_sc, "POSSESSIVE_REPEAT", _sc.MAX_REPEAT)}


def _in_set(items, ch: str) -> bool:
    neg = hit = False
    for op, av in items:
        if op is _sc.NEGATE:
            neg = True
        elif op is _sc.LITERAL:
            hit |= ord(ch) == av
        elif op is _sc.RANGE:
            hit |= av[0] <= ord(ch) <= av[1]
        elif op is _sc.CATEGORY and av in _CATEGORY:
            hit |= re.fullmatch(_CATEGORY[av], ch) is not None
    return hit != neg


def _render(items, alt: int) -> str:
    """A string `items` match: literals as they are, one character for a class or `.`, each
    repeat once (or its minimum), alternative `alt` of each alternation."""
    out = []
    for op, av in items:
        if op is _sc.LITERAL:
            out.append(chr(av))
        elif op is _sc.NOT_LITERAL:
            out.append("b" if chr(av) == "a" else "a")
        elif op is _sc.ANY:
            out.append(" ")
        elif op is _sc.IN:
            own = [
                chr(a if o is _sc.LITERAL else a[0]) for o, a in av if o in (_sc.LITERAL, _sc.RANGE)
            ]
            pool = [*own, *"a1 :_-./=,x(|"]
            out.append(next((c for c in pool if _in_set(av, c)), ""))
        elif op in _REPEATS:
            lo, hi, sub = av
            out.append(_render(sub, alt) * min(max(lo, 1), hi))
        elif op is _sc.SUBPATTERN:
            out.append(_render(av[-1], alt))
        elif op is getattr(_sc, "ATOMIC_GROUP", None):
            out.append(_render(av, alt))
        elif op is _sc.BRANCH:
            out.append(_render(av[1][alt], alt))
    return "".join(out)


def _adversarial_units(pattern: str) -> set[str]:
    """Each literal prefix of what `pattern` matches, cut before each of its top-level parts:
    repeated along a line, every copy starts a match attempt that fails late."""
    parsed = list(_sp.parse(pattern))
    units = set()
    for alt in (0, -1):
        for k in range(1, len(parsed)):
            if parsed[k][0] is _sc.LITERAL and parsed[k - 1][0] is _sc.LITERAL:
                continue  # cut between the parts, not inside a literal run
            unit = _render(parsed[:k], alt)
            if unit.strip():
                units |= {unit, unit + " "}
    return units


def test_every_pattern_is_fast_on_adversarial_8k_lines():
    """A line of up to 8 KiB (the matcher's cap) made of one pattern's own prefix repeated (many
    ranks writing `NET/IB : Got completion ...` into one line without newlines) makes a regex
    with two unbounded gaps in a row backtrack cubically. Failed before: `nccl_ib_port_error`'s
    `NET/IB\\w*\\s*:.*?(?:...|[Cc]ompletion).*?\\b(?:error|status=)` took 3-5 s on such a line,
    `nccl_ib_flush_error` up to 6 s (the gaps are now `[^\\n]{0,200}?`)."""
    cat = catalogue.default()
    slow = []
    for p in cat.patterns:
        sources = ("job", "kernel") if p.source == "any" else (p.source,)
        for rx in p.regexes:
            for unit in sorted(_adversarial_units(rx.pattern)):
                line = (unit * (8192 // len(unit) + 1))[:8192]
                for source in sources:
                    t = time.perf_counter()
                    cat.match_line(line, source)
                    took = time.perf_counter() - t
                    if took > 0.25:  # generous (a loaded CI runner): a fast one takes < 0.1 s
                        slow.append((round(took, 2), p.id, source, unit[:60]))
    assert slow == [], slow


def test_the_adversarial_lines_reach_the_old_nccl_ib_regex():
    """The generator builds the line that made the old regex slow (a guard for the test)."""
    old = r"NET/IB\w*\s*:.*?(?:[Gg]ot completion from peer|[Cc]ompletion).*?\b(?:error|status=)\s*(?P<rc>\d+)"
    assert "NET/IBa : Completion " in _adversarial_units(old)


def test_a_node_tools_segfault_in_the_kernel_log_is_evidence_not_an_alert():
    """The kernel logs a segfault of any process on the node (dcgmi, a health check:
    NVIDIA/DCGM#134): counted as `kernel_segfault`, which raises no alert, where as `segfault`
    it fired GoodputJobLogFault and the job on the node, healthy, was requeued. The job's own
    segfault is in its log and still fires."""
    import pandas as pd

    from alertdsl import evaluation as E

    line = (
        "node1 kernel: dcgmi[5133]: segfault at 0 ip 00007f3a sp 00007ffd error 4 in libdcgm.so.3"
    )
    assert [m.pattern for m in match_line(line, "kernel")] == ["kernel_segfault"]
    job_line = "srun: error: node1: task 0: Segmentation fault (core dumped)"
    assert "segfault" in [m.pattern for m in match_line(job_line, "job")]
    for pattern, job_id, fires in (("kernel_segfault", "", False), ("segfault", "42", True)):
        frame = pd.DataFrame(
            {
                "timestamp": [0.0, 5.0, 10.0],
                "job_id": job_id,
                "node": "node1",
                "pattern": pattern,
                "goodput_log_pattern_matches_total": [0.0, 1.0, 1.0],
            }
        )
        assert E.evaluate("GoodputJobLogFault", frame).empty is not fires, pattern

"""The simulator's log lines (exporters/sim/logs.py) are recognised by the catalogue."""
# ruff: noqa: E501

from __future__ import annotations

import math

from catalogue import match_line
from exporters.sim import logs as L

T = 1.8e9


def ids(line: str, source: str = "job") -> set[str]:
    return {m.pattern for m in match_line(line, source)}


def test_sim_fault_lines_are_named():
    xid = L.xid_lines(
        T, "node1", "00000000:2B:00.0", "GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae", 48, "DBE"
    )
    assert "nvrm_xid" in ids(xid[-1], "kernel")
    assert {m.groups.get("xid") for m in match_line(xid[-1], "kernel")} == {48}
    assert "nccl_watchdog_timeout" in ids(L.watchdog(T, 3, 10, 600000, 12, 9)[0])
    assert "cuda_illegal_memory_access" in ids(
        L.cuda_error(T, 1, "an illegal memory access was encountered")[1]
    )
    assert any("cuda_oom" in ids(line) for line in L.oom(2, 2, 139.7))
    assert "nccl_ib_port_error" in ids(L.ib_port_error("node2", 100, 3))
    assert "nccl_ib_port_error" in ids(L.ib_transport_error("node2", 100, 3))
    assert "lustre_error" in ids(L.lustre(T, "node1"), "kernel")
    assert "slurm_task_failed" in ids(L.srun_task_failed("node2", 5, "Exited with exit code 1"))
    seg = [
        m.pattern
        for line in L.elastic_failure(T, 3, 3, "node2", -11, 999)
        for m in match_line(line, "job")
    ]
    # torch elastic's error block names the signal twice, in `exitcode : -11` and in the
    # traceback line; both are real forms (tests/corpus/pytorch.yaml) and both match
    assert seg.count("segfault") == 2


def test_sim_progress_and_checkpoint_lines():
    line = L.progress(T, 10, 100, 64, 500.0, float("nan"), 1e-4, 1.0, 0, 1, 300.0)
    by_id = {m.pattern: m for m in match_line(line, "job")}
    assert {"megatron_progress", "nan_loss"} <= set(by_id)
    g = by_id["megatron_progress"].groups
    assert (
        g["iteration"] == 10 and g["step_ms"] == 500.0 and math.isnan(g["loss"]) and g["nan"] == 1
    )
    assert "checkpoint_saved" in ids(L.checkpoint_done(T, 100, "gpt"))
    assert "checkpoint_saved" not in ids(L.checkpoint_start(T, 100, "gpt"))

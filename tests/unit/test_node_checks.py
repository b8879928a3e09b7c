"""The return-to-service loop over the scheduler port (the simulated adapter on a fake of the
simulator's control API): plan in monitor mode, run and act in act mode, never a person's drain,
RMA after repeated failures, every step audited."""

from __future__ import annotations

import sys

import pytest
from sqlalchemy import create_engine

from recovery import audit, node_checks, slurm_hooks
from recovery.policy import parse_policy
from recovery.scheduler.simulated import SimulatedScheduler
from tests.unit.actions_fakes import make_fake_sim

PY = sys.executable


def _policy(mode: str, passes: bool, rma_after: int = 2, **extra):
    code = "0" if passes else "import sys; print('diag: FAIL'); sys.exit(1)"
    rts = {
        "enabled": True,
        "checks": {"quick": {"argv": [PY, "-c", code]}, "deep": {"argv": [PY, "-c", code]}},
        "rma_after_failures": rma_after,
        **extra,
    }
    return parse_policy({"mode": mode, "return_to_service": rts}, env={})


@pytest.fixture
def world(tmp_path):
    client, st, _ = make_fake_sim()
    sched = SimulatedScheduler("http://sim", session=client)
    sched.verify_timeout_s = 1.0
    engine = create_engine(f"sqlite:///{tmp_path / 'r.db'}")
    node_checks.ensure(engine)
    audit.ensure(engine)
    st["nodes"]["node2"].update(state="DRAINED", reason="goodput: XID 79 on GPU 3")
    st["nodes"]["node3"].update(state="DRAINED", reason="maintenance (alice)")
    return sched, engine, st, tmp_path / "holds"


def _types(engine):
    return [e["type"] for e in audit.query(engine, limit=100)[0]]


def test_monitor_mode_plans_the_check_once_and_runs_nothing(world):
    sched, engine, st, holds = world
    pol = _policy("monitor", passes=True)
    out = node_checks.tick(engine, sched, pol, hold_dir=holds)
    assert [(o["node"], o["state"]) for o in out] == [("node2", "planned")]
    assert node_checks.tick(engine, sched, pol, hold_dir=holds) == []  # once per drain
    assert st["nodes"]["node2"]["state"] == "DRAINED" and not holds.exists()
    assert _types(engine) == ["check_planned"]


def test_a_passed_check_resumes_goodputs_drain_and_never_a_persons(world):
    sched, engine, st, holds = world
    out = node_checks.tick(engine, sched, _policy("act", passes=True), hold_dir=holds)
    assert [(o["node"], o["state"]) for o in out] == [("node2", "passed")]
    assert st["nodes"]["node2"]["state"] == "IDLE"
    assert st["nodes"]["node3"] == {
        "node": "node3",
        "state": "DRAINED",
        "reason": "maintenance (alice)",
    }
    assert slurm_hooks.held(holds, "node2") is None  # the Prolog hold is lifted again
    assert _types(engine) == ["check_started", "check_passed"]


def test_a_failed_check_keeps_the_node_drained_then_rma_after_the_second(world, tmp_path):
    sched, engine, st, holds = world
    marker = tmp_path / "ticket"
    hook = {"argv": [PY, "-c", f"open({str(marker)!r}, 'w').write('{{node}} {{reason}}')"]}
    pol = _policy("act", passes=False, rma_after=2, rma_hook=hook)
    [first] = node_checks.tick(engine, sched, pol, hold_dir=holds)
    assert first["state"] == "failed"
    assert st["nodes"]["node2"]["reason"] == "goodput: failed quick"
    assert slurm_hooks.held(holds, "node2")  # still held for the Prolog
    assert node_checks.tick(engine, sched, pol, hold_dir=holds) == []  # a verdict is not re-run
    assert node_checks.rows(engine, "node2")[0]["output"].strip() == "diag: FAIL"
    # a person resumes it, it fails a job again, Goodput drains it, the check fails again: RMA
    st["nodes"]["node2"].update(state="DRAINED", reason="goodput: XID 79 again")
    [second] = node_checks.tick(engine, sched, pol, hold_dir=holds)
    assert second["state"] == "rma" and "RMA" in st["nodes"]["node2"]["reason"]
    assert marker.read_text() == "node2 goodput: failed quick 2 times: RMA"
    assert _types(engine)[-1] == "check_rma"
    assert audit.verify(engine).ok


def test_a_node_still_running_its_job_waits(world):
    sched, engine, st, holds = world
    st["nodes"]["node2"]["state"] = "DRAINING"
    assert node_checks.tick(engine, sched, _policy("act", passes=True), hold_dir=holds) == []


def test_paused_only_plans(world):
    sched, engine, st, holds = world
    [o] = node_checks.tick(engine, sched, _policy("act", passes=True), paused=True)
    assert o["state"] == "planned" and st["nodes"]["node2"]["state"] == "DRAINED"


def test_a_check_left_running_by_a_dead_process_runs_again(world):
    sched, engine, st, holds = world
    pol = _policy("act", passes=True)
    with engine.begin() as conn:
        conn.execute(
            node_checks.checks.insert().values(
                node="node2", drain_reason="goodput: XID 79 on GPU 3", level="quick",
                state="running", mode="act", started_at=0.0,
            )
        )  # fmt: skip
    [o] = node_checks.tick(engine, sched, pol, now=10_000.0)
    assert o["state"] == "passed"


def test_disabled_does_nothing(world):
    sched, engine, _, _ = world
    assert node_checks.tick(engine, sched, parse_policy({"mode": "act"}, env={})) == []


def test_a_failed_node_is_checked_again_after_the_recheck_delay(world, tmp_path):
    sched, engine, st, holds = world
    flag = tmp_path / "repaired"
    code = f"import os, sys; sys.exit(0 if os.path.exists({str(flag)!r}) else 1)"
    cmd = {"argv": [PY, "-c", code]}
    rts = {"enabled": True, "checks": {"quick": cmd, "deep": cmd}, "rma_after_failures": 3,
           "recheck_failed_after_s": 600}  # fmt: skip
    pol = parse_policy({"mode": "act", "return_to_service": rts}, env={})
    [o] = node_checks.tick(engine, sched, pol, hold_dir=holds, now=1000.0)
    assert o["state"] == "failed"
    finished = node_checks.rows(engine, "node2")[0]["finished_at"]
    assert node_checks.tick(engine, sched, pol, hold_dir=holds, now=finished + 599) == []
    flag.write_text("a technician replaced GPU 3")
    [again] = node_checks.tick(engine, sched, pol, hold_dir=holds, now=finished + 601)
    assert again["state"] == "passed" and st["nodes"]["node2"]["state"] == "IDLE"

"""The return-to-service loop over the scheduler port (the simulated adapter on a fake of the
simulator's control API): plan in monitor mode, run and act in act mode, never a person's drain,
RMA after repeated failures, every step audited."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from recovery import audit, node_checks, slurm_hooks
from recovery.policy import parse_policy
from recovery.scheduler.simulated import SimulatedScheduler
from recovery.store import make_engine
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
    engine = make_engine(f"sqlite:///{tmp_path / 'r.db'}")
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


def test_a_check_planned_while_paused_runs_once_the_pause_is_lifted(world):
    # the planned row counted as an open check for ever: a node Goodput drained before the
    # pause stayed drained after it, its check never run
    sched, engine, st, holds = world
    pol = _policy("act", passes=True)
    [o] = node_checks.tick(engine, sched, pol, paused=True, hold_dir=holds)
    assert o["state"] == "planned"
    assert node_checks.tick(engine, sched, pol, paused=True, hold_dir=holds) == []  # once
    [o] = node_checks.tick(engine, sched, pol, hold_dir=holds)
    assert o["state"] == "passed" and st["nodes"]["node2"]["state"] == "IDLE"


def test_a_person_draining_the_node_during_a_passed_check_gets_no_stale_hold(world):
    # the check passes, but a person drained the node meanwhile: Goodput must not resume it,
    # and the Prolog hold "checking" must go (it stayed, so the person's resume later had
    # every job refused by the Prolog)
    sched, engine, st, holds = world
    cmd = {"argv": [PY, "-c", "import time; time.sleep(1.0)"]}
    rts = {"enabled": True, "checks": {"quick": cmd, "deep": cmd}}
    pol = parse_policy({"mode": "act", "return_to_service": rts}, env={})

    def person() -> None:
        time.sleep(0.3)
        st["nodes"]["node2"].update(reason="bob: reseating GPU 3")

    t = threading.Thread(target=person)
    t.start()
    [o] = node_checks.tick(engine, sched, pol, hold_dir=holds)
    t.join()
    assert st["nodes"]["node2"]["state"] == "DRAINED"  # a person's drain is never resumed
    assert "refused" in o["detail"]
    assert slurm_hooks.held(holds, "node2") is None


def test_an_rma_verdict_is_never_rechecked(world, tmp_path):
    # the RMA reason reads "goodput: failed <level> N times: RMA", which the recheck took for
    # a plain failure: every recheck_failed_after_s the check ran again, a pass resumed a node
    # sent for RMA, and each new failure called the RMA hook (another ticket) again
    sched, engine, st, holds = world
    tickets = tmp_path / "tickets"
    hook = {"argv": [PY, "-c", f"open({str(tickets)!r}, 'a').write('{{node}}\\n')"]}
    pol = _policy("act", passes=False, rma_after=1, rma_hook=hook, recheck_failed_after_s=600)
    [o] = node_checks.tick(engine, sched, pol, hold_dir=holds, now=1000.0)
    assert o["state"] == "rma" and st["nodes"]["node2"]["reason"].endswith("RMA")
    later = node_checks.rows(engine, "node2")[0]["finished_at"] + 601
    assert node_checks.tick(engine, sched, pol, hold_dir=holds, now=later) == []
    assert tickets.read_text() == "node2\n"


def _incidents(n, gap=3600.0, now=50_000.0):
    from recovery.node_health import NodeEvent

    return {"node2": [NodeEvent(now - i * gap, "node2", "incident") for i in range(n)]}


def test_a_repeat_offender_that_passes_is_held_for_a_person_not_resumed(world):
    sched, engine, st, holds = world
    pol = _policy("act", passes=True)
    [o] = node_checks.tick(engine, sched, pol, hold_dir=holds, events=_incidents(5), now=50_000.0)
    assert o["state"] == "held"
    assert st["nodes"]["node2"]["state"] == "DRAINED"
    assert st["nodes"]["node2"]["reason"].startswith("goodput: held for a person (five-in-a-week")
    assert "held for a person" in slurm_hooks.held(holds, "node2")  # the hold says the verdict
    assert node_checks.tick(engine, sched, pol, hold_dir=holds, now=60_000.0) == []  # no re-run


def test_a_hold_is_lifted_when_a_person_returns_the_node_to_service(world):
    sched, engine, st, holds = world
    pol = _policy("act", passes=False)
    [o] = node_checks.tick(engine, sched, pol, hold_dir=holds)
    assert o["state"] == "failed" and slurm_hooks.held(holds, "node2") == "goodput: failed quick"
    st["nodes"]["node2"].update(state="IDLE", reason="")  # a person repaired and resumed it
    node_checks.tick(engine, sched, pol, hold_dir=holds)
    assert slurm_hooks.held(holds, "node2") is None
    assert _types(engine)[-1] == "hold_released"


def test_a_repeat_offender_sent_to_rma_is_not_checked_again_until_drained_anew(world, tmp_path):
    # a rule's RMA reason ("goodput: repeat offender, RMA (…)") read as a fresh drain: every
    # tick ran the check again and called the RMA hook again (a new ticket each 10 s)
    sched, engine, st, holds = world
    tickets = tmp_path / "tickets"
    hook = {"argv": [PY, "-c", f"open({str(tickets)!r}, 'a').write('{{node}}\\n')"]}
    rule = {"name": "ops' three-in-a-week", "incidents": 3, "window_s": 604800, "then": "rma"}
    pol = _policy("act", passes=True, rma_hook=hook, repeat_offenders=[rule])
    ev = _incidents(3)
    [o] = node_checks.tick(engine, sched, pol, hold_dir=holds, events=ev, now=50_000.0)
    assert o["state"] == "rma"
    reason = st["nodes"]["node2"]["reason"]  # as the scheduler keeps it: the quote cleaned
    assert reason.startswith("goodput: repeat offender, RMA (ops  three-in-a-week: 3 incidents")
    for now in (50_010.0, 50_020.0, 50_030.0):  # the next ticks
        assert node_checks.tick(engine, sched, pol, hold_dir=holds, events=ev, now=now) == []
    assert tickets.read_text() == "node2\n"
    assert _types(engine).count("check_rma") == 1
    # repaired and resumed by a person, drained by Goodput again: this drain gets its check
    st["nodes"]["node2"].update(state="DRAINED", reason="goodput: XID 79 incident 9 action 12")
    [again] = node_checks.tick(engine, sched, pol, hold_dir=holds, now=90_000.0)
    assert again["state"] == "passed" and st["nodes"]["node2"]["state"] == "IDLE"

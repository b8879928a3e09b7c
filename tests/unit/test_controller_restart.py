"""A restarted controller that forgot Goodput's last changes (`recovery.controller_restart`).

The fake simulator stands in for Slurm: `forget` puts its nodes and jobs back as they were
before the action (what slurmctld does when it restarts from a state saved before it), and
`started` is the controller's start time. The real slurmctld SIGKILL is in
tests/integration/test_controller_restart.py."""

from __future__ import annotations

import copy
import json
import time
from types import SimpleNamespace

import pytest
from sqlalchemy import update

from recovery import actions, audit, controller_restart, outbox, reconciler
from recovery.outbox import actions_table, switches
from recovery.policy import parse_policy
from recovery.scheduler import JobState, NodeState, SchedulerUnavailable
from recovery.scheduler.simulated import SimulatedScheduler
from recovery.store import make_engine
from tests.helpers import incident_and_diagnosis
from tests.unit.actions_fakes import make_fake_sim


class Restarting(SimulatedScheduler):
    boots = 1
    started: str | None = "2026-12-07T13:09:47"
    fail_reads = 0

    def restart(self):
        self.boots += 1
        self.started = f"2026-12-07T14:{self.boots:02d}:00"

    def controller_started(self):
        return self.started

    def job_state(self, job_id):
        if self.fail_reads:
            self.fail_reads -= 1
            raise SchedulerUnavailable("slurmctld is starting")
        return super().job_state(job_id)


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.setenv("GOODPUT_ACTIONS_THREAD", "0")
    client, st, submit = make_fake_sim()
    engine = make_engine(f"sqlite:///{tmp_path / 'a.db'}")
    sched = Restarting("http://testserver", session=client)
    settings = SimpleNamespace(
        policy=parse_policy({"mode": "act"}, env={}),
        scheduler_adapter=sched,
        alertmanager_url=None,
        prometheus_url=None,
        action_retry_s=0.0,
    )
    submit("42", node="node2")

    def act(iid, outcome="gpu_hardware_fault", nodes=("node2",)):
        """Execute the policy's action, then restart the controller from the state before it."""
        reconciler.reconcile(engine, settings)  # the store learns the controller's start
        saved = copy.deepcopy({k: st[k] for k in ("nodes", "jobs")})
        now = time.time()
        inc, d = incident_and_diagnosis(iid, "42", nodes, outcome, "xid79", 0.95, now - 9, now)
        a = actions.on_diagnosis(engine, settings, inc, d)
        assert a["state"] == "executed", a
        calls = len(st["calls"])
        sched.restart()
        return a, saved, calls

    def forget(saved):
        st.update(copy.deepcopy(saved))

    def lost_events(action_id):
        events = audit.query(engine, type_="effect_lost", action_id=action_id, limit=100)[0]
        return [e["payload"] for e in events]

    return SimpleNamespace(
        engine=engine, st=st, sched=sched, settings=settings, act=act, forget=forget,
        lost_events=lost_events,
    )  # fmt: skip


def test_the_first_start_seen_is_remembered_and_nothing_is_checked(world):
    assert controller_restart.check(world.engine, world.settings) == []
    with world.engine.connect() as conn:
        row = conn.execute(switches.select().where(switches.c.name == "scheduler_boot")).first()
    assert row.value == "2026-12-07T13:09:47"  # as Slurm prints it: no time zone involved


def test_a_drain_and_requeue_the_controller_forgot_is_applied_again(world):
    a, saved, _ = world.act("1")
    world.forget(saved)
    assert world.st["jobs"]["42"]["restarts"] == 0 and world.st["nodes"]["node2"]["reason"] == ""

    reconciler.reconcile(world.engine, world.settings)
    (lost,) = world.lost_events(a["id"])
    assert lost["lost"] == [
        "node2 is ALLOCATED, not drained",
        "job 42 is RUNNING, restarts 0 (was 1)",
    ]
    assert outbox.get_action(world.engine, a["id"])["state"] == "executed"
    job = world.st["jobs"]["42"]
    assert job["restarts"] == 1 and job["excluded"] == ["node2"] and job["nodes"] != ["node2"]
    assert world.st["nodes"]["node2"]["state"].startswith("DRAIN")
    reconciler.reconcile(world.engine, world.settings)  # the same start: nothing again
    assert len(world.lost_events(a["id"])) == 1
    assert world.st["jobs"]["42"]["restarts"] == 1
    assert audit.verify(world.engine).ok


def test_a_stop_the_controller_forgot_holds_the_job_again(world):
    a, saved, _ = world.act("2", outcome="workload_oom", nodes=())
    assert a["kind"] == "stop" and world.st["jobs"]["42"]["held"]
    world.forget(saved)
    reconciler.reconcile(world.engine, world.settings)
    assert world.lost_events(a["id"])[0]["lost"] == ["job 42 is RUNNING, restarts 0 (was 1)"]
    assert world.st["jobs"]["42"]["held"]


def test_effects_the_controller_kept_are_left_alone(world):
    a, _, calls = world.act("3")
    reconciler.reconcile(world.engine, world.settings)
    assert world.lost_events(a["id"]) == []
    assert len(world.st["calls"]) == calls  # nothing done again
    assert controller_restart.check(world.engine, world.settings) == []


def test_actions_long_before_the_restart_are_not_checked(world):
    """Slurm saved them (within 5 s): a difference now is someone's later change."""
    a, saved, _ = world.act("4")
    world.forget(saved)
    with world.engine.begin() as conn:
        seen = conn.execute(switches.select().where(switches.c.name == "scheduler_boot")).first()
        old = seen.updated_at - controller_restart.MARGIN_S - 1
        conn.execute(
            update(actions_table).where(actions_table.c.id == a["id"]).values(updated_at=old)
        )
    reconciler.reconcile(world.engine, world.settings)
    assert world.lost_events(a["id"]) == []
    assert world.st["jobs"]["42"]["restarts"] == 0


def test_a_restart_another_receiver_handled_first_is_not_handled_twice(world, monkeypatch):
    a, saved, _ = world.act("5")
    world.forget(saved)
    real = controller_restart.lost

    def meanwhile(*args):  # the other receiver commits between this one's read and write
        with world.engine.begin() as conn:
            conn.execute(
                update(switches).where(switches.c.name == "scheduler_boot").values(value="other")
            )
        return real(*args)

    monkeypatch.setattr(controller_restart, "lost", meanwhile)
    assert controller_restart.check(world.engine, world.settings) == []
    assert world.lost_events(a["id"]) == []
    assert outbox.get_action(world.engine, a["id"])["state"] == "executed"


def test_a_scheduler_failing_while_checking_leaves_it_to_the_next_pass(world):
    a, saved, _ = world.act("6")
    world.forget(saved)
    world.sched.fail_reads = 1
    assert controller_restart.check(world.engine, world.settings) == []
    assert world.lost_events(a["id"]) == []
    assert controller_restart.check(world.engine, world.settings) == [a["id"]]


def test_a_scheduler_that_cannot_say_when_it_started_is_not_checked(world):
    a, saved, _ = world.act("7")
    world.forget(saved)
    world.sched.started = None
    reconciler.reconcile(world.engine, world.settings)
    assert world.lost_events(a["id"]) == []


def test_a_node_returned_through_a_passed_check_since_is_not_drained_again(world):
    """What Goodput itself undid after the action is not applied again."""
    a, saved, _ = world.act("8")
    world.forget(saved)
    with world.engine.begin() as conn:  # the node came back through a check, a resume action
        audit.append(conn, "check_passed", {"node": "node2"})
    reconciler.reconcile(world.engine, world.settings)
    assert world.lost_events(a["id"])[0]["lost"] == ["job 42 is RUNNING, restarts 0 (was 1)"]


def test_the_job_is_checked_against_its_latest_action_only(world):
    """A requeue, then a stop of the same job, both forgotten: the job must end up stopped,
    and the earlier requeue's job part is not a loss of its own (its drain is)."""
    a, saved, _ = world.act("9")
    now = time.time()
    inc, d = incident_and_diagnosis("10", "42", (), "workload_oom", "cuda_oom", 0.95, now - 1, now)
    b = actions.on_diagnosis(world.engine, world.settings, inc, d)
    assert b["state"] == "executed" and b["kind"] == "stop", b
    world.forget(saved)
    reconciler.reconcile(world.engine, world.settings)
    assert world.lost_events(a["id"])[0]["lost"] == ["node2 is ALLOCATED, not drained"]
    assert world.lost_events(b["id"])[0]["lost"] == ["job 42 is RUNNING, restarts 0 (was 2)"]
    job = world.st["jobs"]["42"]
    assert job["held"] and job["state"] == "PENDING" and job["excluded"] == ["node2"]
    assert world.st["nodes"]["node2"]["state"].startswith("DRAIN")


def test_a_later_action_that_does_nothing_to_the_job_does_not_hide_a_lost_requeue(world):
    a, saved, _ = world.act("12")
    now = time.time()
    inc, d = incident_and_diagnosis("13", "42", (), "healthy", "none", 0.9, now - 1, now)
    b = actions.on_diagnosis(world.engine, world.settings, inc, d)
    assert b["kind"] == "none", b
    world.forget(saved)
    reconciler.reconcile(world.engine, world.settings)
    assert "job 42 is RUNNING, restarts 0 (was 1)" in world.lost_events(a["id"])[0]["lost"]
    assert world.st["jobs"]["42"]["restarts"] == 1


def test_while_actions_do_not_run_the_restart_waits_with_its_window(world):
    """Paused, a reopened row would be `skipped`: the check waits until actions run again."""
    from recovery.action_config import set_paused

    a, saved, _ = world.act("11")
    world.forget(saved)
    set_paused(world.engine, True, "gina", "slurm maintenance")
    reconciler.reconcile(world.engine, world.settings)
    assert world.lost_events(a["id"]) == []
    assert outbox.get_action(world.engine, a["id"])["state"] == "executed"
    set_paused(world.engine, False, "gina")
    reconciler.reconcile(world.engine, world.settings)
    assert world.lost_events(a["id"])
    assert world.st["jobs"]["42"]["restarts"] == 1


def test_a_defect_in_the_check_does_not_stall_the_pass(world, monkeypatch):
    def broken(*_):
        raise ValueError("unreadable squeue")

    monkeypatch.setattr(controller_restart, "check", broken)
    reconciler.reconcile(world.engine, world.settings)  # logged, and the pass goes on


EXECUTED_AT = 1_800_000_000.0


def _row(kind, action, restarts_before=0, after=None, result=None):
    return SimpleNamespace(
        kind=kind,
        body=json.dumps({"action": action}),
        restarts_before=restarts_before,
        result=json.dumps(result or ({} if after is None else {"restarts_after": after})),
        updated_at=EXECUTED_AT,
    )


def _job(state="RUNNING", restarts=0, held=False, ended=None):
    return JobState("42", "train", state, restarts=restarts, held=held, end_time=ended)


@pytest.mark.parametrize(
    ("row", "job", "nodes", "want"),
    [
        # a drain holds while the node is out of service, whoever's reason it has
        (_row("drain", {"nodes": ["n1"]}), None, {"n1": NodeState("n1", "DOWN")}, []),
        (_row("drain", {"nodes": ["n1"]}), None, {"n1": NodeState("n1", "DRAINED", "x")}, []),
        (_row("drain", {"nodes": ["n1"]}), None, {"n1": NodeState("n1", "MAINT")}, []),
        (_row("drain", {"nodes": ["n1"]}), None, {"n1": NodeState("n1", "IDLE")},
         ["n1 is IDLE, not drained"]),
        (_row("drain", {"nodes": ["gone"]}), None, {}, []),  # a node it no longer knows
        # a job keeps at least the restart count the action left
        (_row("requeue", {}, after=1), _job(restarts=1), {}, []),
        (_row("requeue", {}, after=1), _job(restarts=2, held=True), {}, []),  # moved on
        (_row("requeue", {}, after=1), _job("PENDING", restarts=0), {},
         ["job 42 is PENDING, restarts 0 (was 1)"]),
        (_row("requeue", {}, after=1), _job("FAILED", restarts=0), {},  # ended: still lost
         ["job 42 is FAILED, restarts 0 (was 1)"]),
        (_row("requeue", {}, after=1), _job("PENDING", restarts=1, held=True), {},
         ["job 42 is requeued but held"]),  # the release lost
        # a pending job's exclusion (no restart counted): a hold since is a person's
        (_row("requeue", {}, after=0), _job("PENDING", restarts=0, held=True), {}, []),
        (_row("requeue", {}), _job(), {}, []),  # the count after is not known: not judged
        # executed by an earlier version: the count read back after it
        (_row("requeue", {}, result={"verified": {"job": {"restarts": 1}}}), _job(), {},
         ["job 42 is RUNNING, restarts 0 (was 1)"]),
        # ended after the action (purged: sacct has no count): its own end, not judged
        (_row("requeue", {}, after=1), _job("COMPLETED", ended=EXECUTED_AT + 60), {}, []),
        (_row("requeue", {}, after=1), _job("FAILED", ended=EXECUTED_AT - 60), {},
         ["job 42 is FAILED, restarts 0 (was 1)"]),
        (_row("stop", {}, after=1), _job("PENDING", restarts=1, held=True), {}, []),
        (_row("stop", {}, after=1), _job("PENDING", restarts=1), {}, []),  # released by a person
        (_row("stop", {}, after=1), _job("RUNNING", restarts=0), {},
         ["job 42 is RUNNING, restarts 0 (was 1)"]),
        (_row("stop", {}, after=1), _job("RUNNING", restarts=1), {}, []),
        # a resume is never applied again (a drain since is not undone)
        (_row("resume_node", {"resume": ["n1"]}), None,
         {"n1": NodeState("n1", "DRAINED", "goodput: x")}, []),
    ],
)  # fmt: skip
def test_what_an_executed_action_left_in_the_scheduler(row, job, nodes, want):
    assert controller_restart.lost(row, job, nodes) == want


def test_a_node_goodput_returned_to_service_since_is_not_a_drain_lost():
    row, idle = _row("drain", {"nodes": ["n1"]}), {"n1": NodeState("n1", "IDLE")}
    assert controller_restart.lost(row, None, idle, frozenset(["n1"])) == []

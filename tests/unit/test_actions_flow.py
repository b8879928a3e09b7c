"""Action orchestration against a fake simulator: modes, approvals, stop, sticky, pause,
resume_node, directives, scheduler outages, and start-up reconciliation."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import requests
from sqlalchemy import update

from recovery import (
    accounting,
    action_config,
    actions,
    approvals,
    audit,
    directives,
    executor,
    outbox,
    planning,
    reconciler,
)
from recovery.decide import Diagnosis
from recovery.policy import parse_policy
from recovery.scheduler.simulated import SimulatedScheduler
from recovery.store import make_engine
from tests.helpers import incident_and_diagnosis
from tests.unit.actions_fakes import make_fake_sim


@pytest.fixture(autouse=True)
def _no_thread(monkeypatch):
    monkeypatch.setenv("GOODPUT_ACTIONS_THREAD", "0")
    monkeypatch.delenv("GOODPUT_TEST_CRASH_AT", raising=False)


@pytest.fixture
def world(tmp_path):
    client, st, submit = make_fake_sim()
    engine = make_engine(f"sqlite:///{tmp_path / 'a.db'}")
    sched = SimulatedScheduler("http://testserver", session=client)

    def settings(mode="act", **policy):
        return SimpleNamespace(
            policy=parse_policy({"mode": mode, **policy}, env={}),
            scheduler_adapter=sched,
            alertmanager_url=None,
            prometheus_url=None,
            action_retry_s=0.0,
        )

    return SimpleNamespace(engine=engine, st=st, submit=submit, settings=settings, sched=sched)


def diag(
    iid,
    outcome="gpu_hardware_fault",
    nodes=("node2",),
    job="42",
    conf=0.95,
    cause="xid79",
    onset=None,
):
    now = time.time()
    onset = now - 10 if onset is None else onset
    return incident_and_diagnosis(iid, job, nodes, outcome, cause, conf, onset, now - 5)


def types(engine, **kw):
    return [e["type"] for e in audit.query(engine, limit=1000, **kw)[0]]


def test_act_drains_and_requeues_excluding_the_node(world):
    world.submit("42", node="node2")
    a = actions.on_diagnosis(world.engine, world.settings("act"), *diag(1))
    assert a["state"] == "executed" and a["kind"] == "drain_and_requeue"
    node2 = world.st["nodes"]["node2"]
    assert node2["state"].startswith("DRAIN") and node2["reason"].startswith("goodput:")
    job = world.st["jobs"]["42"]
    assert job["restarts"] == 1 and job["excluded"] == ["node2"]
    assert job["state"] == "RUNNING" and job["nodes"] != ["node2"]
    assert types(world.engine, incident_id="1") == ["diagnosis", "planned", "executing", "executed"]
    assert audit.verify(world.engine).ok
    # a redelivered diagnosis for the same incident changes nothing
    again = actions.on_diagnosis(world.engine, world.settings("act"), *diag(1))
    assert again["id"] == a["id"] and world.st["jobs"]["42"]["restarts"] == 1
    # accounting: running again after the onset
    reconciler.reconcile(world.engine, world.settings("act"))
    acc = accounting.get(world.engine, "1")
    assert acc["running_again_at"] is not None and acc["gpu_hours_lost"] > 0
    assert acc["time_to_detect_s"] == pytest.approx(5, abs=1)


def test_planning_starts_no_background_loop(world, monkeypatch):
    """The receiver app starts the reconciler and lease loops; planning one diagnosis (a CLI, a
    test, a second engine) must not spawn them as a side effect, where nothing would stop them."""
    import threading

    monkeypatch.setenv("GOODPUT_ACTIONS_THREAD", "1")
    world.submit("42", node="node2")
    before = set(threading.enumerate())
    actions.on_diagnosis(world.engine, world.settings("monitor"), *diag(9))
    started = [t.name for t in set(threading.enumerate()) - before]
    assert not {"goodput-actions", "goodput-leases"} & set(started), started


def test_monitor_changes_nothing(world):
    world.submit("42", node="node2")
    a = actions.on_diagnosis(world.engine, world.settings("monitor"), *diag(2))
    assert a["state"] == "planned_only" and "mode_monitor" in a["body"]["action"]["reasons"]
    assert world.st["calls"] == []
    assert types(world.engine, incident_id="2") == ["diagnosis", "planned"]


def test_approve_waits_then_executes_recording_who(world):
    world.submit("42", node="node2")
    s = world.settings("approve")
    a = actions.on_diagnosis(world.engine, s, *diag(3))
    assert a["state"] == "pending_approval" and world.st["calls"] == []
    assert [x["id"] for x in outbox.list_actions(world.engine, state="pending_approval")] == [
        a["id"]
    ]
    done = approvals.approve(world.engine, s, a["id"], "alice", "looks right")
    assert done["state"] == "executed" and done["decided_by"] == "alice"
    assert ("requeue", "42") in world.st["calls"]
    approved = audit.query(world.engine, type_="approved")[0]
    assert approved[0]["actor"] == "alice"
    with pytest.raises(approvals.ActionError, match="not pending"):
        approvals.approve(world.engine, s, a["id"], "bob")


def test_reject_and_expiry(world):
    world.submit("42", node="node2")
    s = world.settings("approve", approval_expiry_s=1)
    a = actions.on_diagnosis(world.engine, s, *diag(4))
    assert approvals.reject(world.engine, a["id"], "carol")["state"] == "rejected"
    b = actions.on_diagnosis(world.engine, s, *diag(5, outcome="workload_crash", cause="segv"))
    with world.engine.begin() as conn:
        conn.execute(
            update(outbox.actions_table)
            .where(outbox.actions_table.c.id == b["id"])
            .values(expires_at=time.time() - 1)
        )
    assert outbox.expire(world.engine) == 1
    with pytest.raises(approvals.ActionError, match="expired"):
        approvals.approve(world.engine, s, b["id"], "dave")
    assert world.st["calls"] == []


def test_oom_stops_without_draining(world):
    world.submit("42", node="node1")
    a = actions.on_diagnosis(
        world.engine,
        world.settings("act"),
        *diag(6, outcome="workload_oom", nodes=(), cause="cuda_oom"),
    )
    assert a["state"] == "executed" and a["kind"] == "stop"
    job = world.st["jobs"]["42"]
    assert job["held"] and job["state"] == "PENDING"
    assert not any(c[0] == "drain" for c in world.st["calls"])


def test_sticky_error_escalates_to_stop_on_second_occurrence(world):
    world.submit("42", node="node1")
    s = world.settings("act")
    first = actions.on_diagnosis(
        world.engine, s, *diag(7, outcome="workload_crash", nodes=(), cause="illegal_memory_access")
    )
    assert first["kind"] == "requeue" and first["state"] == "executed"
    time.sleep(0.01)  # the restarted job fails again: the new onset follows its restart
    second = actions.on_diagnosis(
        world.engine,
        s,
        *diag(
            8, outcome="workload_crash", nodes=(), cause="illegal_memory_access", onset=time.time()
        ),
    )
    assert second["kind"] == "stop"
    assert "sticky_root_cause" in second["body"]["action"]["reasons"]
    assert world.st["jobs"]["42"]["held"]


def test_pause_switch_stops_everything(world):
    world.submit("42", node="node2")
    s = world.settings("act")
    action_config.set_paused(world.engine, True, "erin", "maintenance")
    a = actions.on_diagnosis(world.engine, s, *diag(9))
    assert a["state"] == "planned_only" and "paused" in a["body"]["action"]["reasons"]
    assert world.st["calls"] == []
    action_config.set_paused(world.engine, False, "erin")
    assert not action_config.is_paused(world.engine)
    assert types(world.engine, type_="paused") == ["paused"]


def test_resume_node_is_audited_and_respects_people(world):
    world.st["nodes"]["node3"].update(state="DRAINED", reason="goodput: xid79")
    world.st["nodes"]["node4"].update(state="DRAINED", reason="bad fan, ticket 12")
    ok = approvals.resume_node(
        world.engine, world.settings("act"), "node3", "frank", "GPU 3 replaced"
    )
    assert ok["state"] == "executed" and world.st["nodes"]["node3"]["state"] == "IDLE"
    (planned,) = [e for e in audit.query(world.engine, type_="planned")[0]
                  if e["payload"].get("resume") == ["node3"]]  # fmt: skip
    assert planned["actor"] == "frank" and planned["payload"]["comment"] == "GPU 3 replaced"
    before = len(audit.query(world.engine)[0])
    # a person's drain, and a node that is not drained: refused, nothing recorded, no alert
    with pytest.raises(approvals.ActionError, match="drained by a person"):
        approvals.resume_node(world.engine, world.settings("act"), "node4", "frank")
    with pytest.raises(approvals.ActionError, match="node node3 is not drained"):
        approvals.resume_node(world.engine, world.settings("act"), "node3", "frank")
    assert len(audit.query(world.engine)[0]) == before
    assert world.st["nodes"]["node4"]["state"] == "DRAINED"
    with pytest.raises(ValueError):
        approvals.resume_node(world.engine, world.settings("act"), "node4;rm -rf", "frank")


def test_directives_narrow_and_invalid_ones_are_audited(world):
    world.submit("42", node="node2", comment='{"goodput": {"mode": "monitor"}}')
    a = actions.on_diagnosis(world.engine, world.settings("act"), *diag(10))
    assert a["state"] == "planned_only" and a["mode"] == "monitor"
    world.submit("43", node="node1", comment='{"goodput": {"mode": "warp"}}')
    b = actions.on_diagnosis(
        world.engine, world.settings("act"), *diag(11, outcome="workload_crash", nodes=(), job="43")
    )
    assert b["state"] == "executed"
    bad = audit.query(world.engine, type_="directive_invalid")[0]
    assert bad and "warp" in bad[0]["payload"]["error"]


def test_invalid_diagnosis_is_audited_not_raised(world):
    inc, d = diag(12)
    d["outcome"] = "cosmic_rays"
    assert actions.on_diagnosis(world.engine, world.settings("act"), inc, d) is None
    assert types(world.engine) == ["skipped"]


class Down:
    def get(self, *a, **k):
        raise requests.ConnectionError("down")

    post = get


def test_unreachable_scheduler_keeps_the_action_pending_and_retries(world):
    world.submit("42", node="node2")
    s = world.settings("act")
    good = s.scheduler_adapter
    s.scheduler_adapter = SimulatedScheduler("http://testserver", session=Down())
    a = actions.on_diagnosis(world.engine, s, *diag(13))
    assert a["state"] == "waiting_scheduler"
    assert "retry_scheduled" in types(world.engine, incident_id="13")
    s.scheduler_adapter = good
    reconciler.reconcile(world.engine, s)
    assert outbox.get_action(world.engine, a["id"])["state"] == "executed"
    # outage during execution: stays runnable, then succeeds
    world.submit("44", node="node1")
    s.scheduler_adapter = SimulatedScheduler("http://testserver", session=Down())
    s2 = world.settings("approve")
    b = actions.on_diagnosis(
        world.engine, s2, *diag(14, outcome="workload_crash", nodes=(), job="44")
    )
    s2.scheduler_adapter = SimulatedScheduler("http://testserver", session=Down())
    r = approvals.approve(world.engine, s2, b["id"], "gina")
    assert r["state"] == "approved" and r["last_error"]
    s2.scheduler_adapter = good
    reconciler.reconcile(world.engine, s2)
    assert outbox.get_action(world.engine, b["id"])["state"] == "executed"
    assert world.st["jobs"]["44"]["restarts"] == 1


def retrying_metric(engine):
    (family,) = [
        f
        for f in accounting.AccountingCollector(engine).collect()
        if f.name == "goodput_actions_retrying"
    ]
    return family.samples[0].value


def test_actions_waiting_after_an_outage_run_as_soon_as_the_scheduler_answers(world):
    """The retry delay doubles through an outage; when the scheduler answers again the waiting
    rows run at the next pass, not after their delay (a slurmctld restart costs no backoff)."""
    world.submit("42", node="node2")
    s = world.settings("act")
    s.action_retry_s = 60.0
    good = s.scheduler_adapter
    s.scheduler_adapter = SimulatedScheduler("http://testserver", session=Down())
    a = actions.on_diagnosis(world.engine, s, *diag(31))
    assert a["state"] == "waiting_scheduler"
    reconciler.reconcile(world.engine, s)  # still down: it waits
    assert outbox.get_action(world.engine, a["id"])["state"] == "waiting_scheduler"
    assert retrying_metric(world.engine) == 1.0
    s.scheduler_adapter = good
    reconciler.reconcile(world.engine, s)
    assert outbox.get_action(world.engine, a["id"])["state"] == "executed"
    assert retrying_metric(world.engine) == 0.0
    woke = [e["payload"] for e in audit.query(world.engine, incident_id="31", limit=100)[0]]
    assert {"retry_in_s": 0.0, "reason": "the scheduler answers again"} in woke
    assert audit.verify(world.engine).ok


def test_an_approved_action_that_met_an_outage_runs_when_the_scheduler_answers(world):
    """The executor's side: approved while the scheduler is down, back to `approved` with a
    doubling delay, run at the first pass after the scheduler answers again."""
    world.submit("44", node="node1")
    s = world.settings("approve")
    s.action_retry_s = 60.0
    good, down = s.scheduler_adapter, SimulatedScheduler("http://testserver", session=Down())
    b = actions.on_diagnosis(
        world.engine, s, *diag(35, outcome="workload_crash", nodes=(), job="44")
    )
    assert b["state"] == "pending_approval"
    s.scheduler_adapter = down
    r = approvals.approve(world.engine, s, b["id"], "gina")
    assert r["state"] == "approved" and r["next_attempt_at"] > time.time() + 60
    reconciler.reconcile(world.engine, s)  # still down
    assert outbox.get_action(world.engine, b["id"])["state"] == "approved"
    s.scheduler_adapter = good
    reconciler.reconcile(world.engine, s)
    assert outbox.get_action(world.engine, b["id"])["state"] == "executed"
    assert world.st["jobs"]["44"]["restarts"] == 1


def test_a_refusal_while_the_scheduler_answers_keeps_its_delay(world, monkeypatch):
    """Slurm answering "try again" (a job whose accounting index is being set) is not an
    outage ending: the row is woken once, when this process first sees the scheduler answer,
    then waits out its delay (doubling, as after any failed try; capped lower: see below)."""
    from recovery.scheduler import SchedulerBusy

    world.submit("42", node="node1")
    s = world.settings("act")
    s.action_retry_s = 5.0
    busy = "scontrol update: Job update not available right now, the DB index is being set"

    def refuse(*a, **k):
        raise SchedulerBusy(busy)

    monkeypatch.setattr(s.scheduler_adapter, "_requeue", refuse)
    a = actions.on_diagnosis(
        world.engine, s, *diag(32, outcome="workload_crash", nodes=(), job="42")
    )
    assert a["state"] == "ready" and a["attempts"] == 1
    reconciler.reconcile(world.engine, s)  # first answer seen by this process: tried again
    assert outbox.get_action(world.engine, a["id"])["attempts"] == 2
    reconciler.reconcile(world.engine, s)
    assert outbox.get_action(world.engine, a["id"])["attempts"] == 2  # waits out its delay
    delays = [
        e["payload"]["retry_in_s"]
        for e in audit.query(world.engine, incident_id="32", type_="retry_scheduled")[0]
    ]
    assert delays == [10.0, 0.0, 20.0]  # busy, woken once (a new process), busy


def test_a_probe_that_fails_once_is_a_blip_not_an_outage(world, monkeypatch):
    """A store error while waking leaves the wake to the next pass. Then one failed probe
    between answers wakes nothing (a flaky scheduler keeps its backoff); two in a row are an
    outage, and the answer after them wakes the waiting row."""
    from sqlalchemy.exc import OperationalError

    world.submit("42", node="node2")
    world.submit("43", node="node3")
    s = world.settings("act")
    s.action_retry_s = 5.0
    good, down = s.scheduler_adapter, SimulatedScheduler("http://testserver", session=Down())
    s.scheduler_adapter = down
    a = actions.on_diagnosis(world.engine, s, *diag(33))
    assert a["state"] == "waiting_scheduler"
    answers: list[bool] = []
    monkeypatch.setattr(type(good), "reachable", lambda self: answers.pop(0))
    s.scheduler_adapter = good
    locked = OperationalError("UPDATE", {}, Exception("database is locked"))
    with monkeypatch.context() as m:
        m.setattr(reconciler, "_advance", lambda *a: (_ for _ in ()).throw(locked))
        answers[:] = [True]
        with pytest.raises(OperationalError):
            reconciler.reconcile(world.engine, s)  # a new process's first answer: wake fails
    answers[:] = [True]
    reconciler.reconcile(world.engine, s)  # the next pass wakes it
    assert outbox.get_action(world.engine, a["id"])["state"] == "executed"

    s.scheduler_adapter = down
    b = actions.on_diagnosis(world.engine, s, *diag(34, job="43", nodes=("node3",)))
    assert b["state"] == "waiting_scheduler"
    s.scheduler_adapter = good
    answers[:] = [False, True]  # a blip: it waits
    for _ in range(2):
        reconciler.reconcile(world.engine, s)
    assert outbox.get_action(world.engine, b["id"])["state"] == "waiting_scheduler"
    answers[:] = [False, False, True]  # an outage, then an answer: due at once
    for _ in range(2):
        reconciler.reconcile(world.engine, s)
    assert outbox.get_action(world.engine, b["id"])["state"] == "waiting_scheduler"
    reconciler.reconcile(world.engine, s)
    assert outbox.get_action(world.engine, b["id"])["state"] == "executed"
    assert answers == []


def test_retry_delays_double_and_stop_at_their_caps():
    from recovery.scheduler import SchedulerBusy, SchedulerUnavailable

    cfg = SimpleNamespace(retry_base_s=5.0)
    down = [action_config.retry_delay(cfg, SchedulerUnavailable("x"), n) for n in range(1, 9)]
    busy = [action_config.retry_delay(cfg, SchedulerBusy("x"), n) for n in range(1, 9)]
    assert down == [10, 20, 40, 80, 160, 320, 320, 320]
    assert busy == [10, 20, 40, 60, 60, 60, 60, 60]  # 50 tries: about an hour, then a person


def test_reconcile_finishes_an_action_a_dead_process_left_executing(world):
    world.submit("42", node="node2")
    s = world.settings("act")
    a = actions.on_diagnosis(world.engine, s, *diag(15))
    assert world.st["jobs"]["42"]["restarts"] == 1
    # pretend the process died after executing, before recording
    with world.engine.begin() as conn:
        conn.execute(
            update(outbox.actions_table)
            .where(outbox.actions_table.c.id == a["id"])
            .values(state="executing", owner="dead-process")
        )
    calls = len(world.st["calls"])
    reconciler.reconcile(world.engine, s, startup=True)
    row = outbox.get_action(world.engine, a["id"])
    assert row["state"] == "executed"
    assert world.st["jobs"]["42"]["restarts"] == 1  # not requeued twice
    assert not any(c[0] in ("drain", "requeue") for c in world.st["calls"][calls:])
    assert "already" in json.dumps(row["result"])


def test_a_changed_verdict_is_planned_again_only_when_nothing_was_done(world):
    world.submit("42", node="node2")
    first = actions.on_diagnosis(
        world.engine, world.settings("act"), *diag(3, outcome="unknown", nodes=(), conf=0.3)
    )
    assert first["id"] == "inc-3" and first["state"] == "no_action"
    second = actions.on_diagnosis(world.engine, world.settings("act"), *diag(3))
    assert second["id"] == "inc-3-2" and second["state"] == "executed"
    assert second["kind"] == "drain_and_requeue"
    # the same verdict again, or a different one after something was done: no new plan
    assert actions.on_diagnosis(world.engine, world.settings("act"), *diag(3))["id"] == "inc-3-2"
    third = actions.on_diagnosis(
        world.engine, world.settings("act"), *diag(3, outcome="workload_oom", nodes=())
    )
    assert third["id"] == "inc-3-2" and world.st["jobs"]["42"]["restarts"] == 1
    assert outbox.incident_action(world.engine, "3")["id"] == "inc-3-2"


def test_a_changed_verdict_after_a_drain_alone_is_planned_again(world):
    """A degrading GPU's node is drained while the job runs on; the GPU then fails and the job
    with it, in the same incident: the new verdict is planned (the job is restarted)."""
    world.submit("42", node="node2")
    s = world.settings("act")
    first = actions.on_diagnosis(world.engine, s, *diag(3, outcome="gpu_degradation"))
    assert (first["id"], first["kind"], first["state"]) == ("inc-3", "drain", "executed")
    second = actions.on_diagnosis(world.engine, s, *diag(3))
    assert (second["id"], second["kind"]) == ("inc-3-2", "drain_and_requeue")
    assert world.st["jobs"]["42"]["restarts"] == 1


def test_a_scheduler_down_past_the_retry_budget_fails_the_action(world):
    world.submit("45", node="node3")
    s = world.settings("approve")
    b = actions.on_diagnosis(
        world.engine, s, *diag(15, outcome="workload_crash", nodes=(), job="45")
    )
    s.scheduler_adapter = SimulatedScheduler("http://testserver", session=Down())
    assert approvals.approve(world.engine, s, b["id"], "gina")["state"] == "approved"
    with world.engine.begin() as conn:
        conn.execute(
            update(outbox.actions_table)
            .where(outbox.actions_table.c.id == b["id"])
            .values(attempts=executor.MAX_ATTEMPTS, next_attempt_at=0.0)
        )
    reconciler.reconcile(world.engine, s)
    failed = outbox.get_action(world.engine, b["id"])
    assert failed["state"] == "failed" and failed["last_error"]
    assert "failed" in types(world.engine, incident_id="15")
    assert world.st["jobs"]["45"]["restarts"] == 0


def test_diagnostics_are_captured_before_the_drain_and_kept_with_the_action(world):
    import sys

    cap = {"argv": [sys.executable, "-c", "import sys; print('bug report for', sys.argv[1])",
                    "{node}"], "timeout_s": 10, "max_output_bytes": 1000}  # fmt: skip
    world.submit("42", node="node2")
    s = world.settings("act", return_to_service={"capture": cap})
    a = actions.on_diagnosis(world.engine, s, *diag(1))
    assert a["state"] == "executed"
    chain = types(world.engine, incident_id="1")
    assert chain == ["diagnosis", "planned", "executing", "diagnostics_captured", "executed"]
    [ev] = audit.query(world.engine, type_="diagnostics_captured")[0]
    assert ev["payload"]["output"].strip() == "bug report for node2"
    assert ev["payload"]["exit_code"] == 0 and ev["action_id"] == a["id"]


def test_a_node_that_failed_the_job_stays_excluded_on_every_later_restart(world):
    """Black-hole nodes: XID 79 on node2 (drain and requeue excluding it), then the job hangs
    on node3 (requeue): the second requeue keeps node2 excluded, so even after node2 passes its
    health check and is resumed, this job never lands there again."""
    world.submit("42", node="node2")
    first = actions.on_diagnosis(world.engine, world.settings("act"), *diag(1))
    assert first["state"] == "executed" and world.st["jobs"]["42"]["excluded"] == ["node2"]
    world.st["nodes"]["node2"].update(state="IDLE", reason="")  # passed its check, resumed
    hang = diag(2, outcome="workload_hang", nodes=(), cause="hang", onset=time.time() + 1)
    second = actions.on_diagnosis(world.engine, world.settings("act"), *hang)
    assert second["kind"] == "requeue" and second["state"] == "executed"
    assert second["body"]["action"]["exclude"] == ["node2"]
    job = world.st["jobs"]["42"]
    assert job["restarts"] == 2 and job["excluded"] == ["node2"] and job["nodes"] != ["node2"]


def test_exclusions_are_capped_so_the_job_can_still_run(world):
    """The job fails on each of the four nodes in turn (each repaired after): the union of its
    exclusions would be every node (the reverted code left such a job pending for good); the
    fourth restart drops the oldest exclusion, says so in the plan, and the job runs there."""
    s = world.settings(
        "act",
        retry={"max_requeues_per_job": 10, "sticky_after": 10, "backoff_s": [0]},
        blast_radius={"max_drains_per_hour": 10},
    )
    world.submit("42", node="node1")
    order = []
    for i in range(4):
        node = world.st["jobs"]["42"]["nodes"][0]
        order.append(node)
        a = actions.on_diagnosis(
            world.engine, s, *diag(i + 1, nodes=(node,), cause=f"xid79-{i}", onset=time.time() + 1)
        )
        assert a["state"] == "executed", a
        world.st["nodes"][node].update(state="IDLE", reason="")  # passed its check, resumed
    assert sorted(order) == ["node1", "node2", "node3", "node4"]
    plan = a["body"]["action"]
    assert plan["exclusions_dropped"] == [order[0]] and set(plan["exclude"]) == set(order[1:])
    assert "exclusions_capped_to_keep_job_runnable" in plan["reasons"]
    job = world.st["jobs"]["42"]
    assert job["state"] == "RUNNING" and job["nodes"] == [order[0]]


def test_a_restart_that_drops_every_earlier_exclusion_clears_the_jobs_list(world):
    """Issue 20: XID 79 on node2 (excluded), node2 repaired; the job runs elsewhere; then every
    other node is drained by a person and the job hangs (no culprit). The cap drops node2 and
    the requeue must clear it in the scheduler (the job's `drop` reaches the adapter), else
    the job waits for node2 forever."""
    world.submit("42", node="node2")
    first = actions.on_diagnosis(world.engine, world.settings("act"), *diag(1))
    assert first["state"] == "executed" and world.st["jobs"]["42"]["excluded"] == ["node2"]
    world.st["nodes"]["node2"].update(state="IDLE", reason="")  # passed its check, resumed
    for n in ("node1", "node3", "node4"):
        world.st["nodes"][n].update(state="DRAINED", reason="maintenance")
    hang = diag(2, outcome="workload_hang", nodes=(), cause="hang", onset=time.time() + 1)
    second = actions.on_diagnosis(world.engine, world.settings("act"), *hang)
    plan = second["body"]["action"]
    assert second["state"] == "executed" and plan["exclude"] == []
    assert plan["exclusions_dropped"] == ["node2"]
    assert world.st["jobs"]["42"]["excluded"] == []


def test_a_comment_nested_past_the_parser_is_an_invalid_directive_not_a_crash(world):
    """`[` x 1000 in a 2 KB comment raised RecursionError out of planning: the row stayed
    `planning`, and the reconciler stopped at it every pass, so no later action ran."""
    deep = '{"goodput": ' + "[" * 1000 + "]" * 1000 + "}"
    assert directives.parse_directive(deep) == (
        None,
        "comment mentions goodput but nests too deeply",
    )
    world.submit("43", node="node1", comment=deep)
    a = actions.on_diagnosis(
        world.engine, world.settings("act"), *diag(16, outcome="workload_crash", nodes=(), job="43")
    )
    assert a["state"] == "executed"
    assert (
        "nests too deeply"
        in audit.query(world.engine, type_="directive_invalid")[0][0]["payload"]["error"]
    )


def test_one_row_that_cannot_be_finished_does_not_stall_the_others(world, monkeypatch):
    s = world.settings("act")
    world.submit("42", node="node2")
    world.submit("44", node="node1")
    first = actions.on_diagnosis(world.engine, s, *diag(17))
    second = actions.on_diagnosis(
        world.engine, s, *diag(18, outcome="workload_crash", nodes=(), job="44")
    )
    with world.engine.begin() as conn:  # both left unplanned by a planner that died
        conn.execute(
            update(outbox.actions_table)
            .where(outbox.actions_table.c.id.in_([first["id"], second["id"]]))
            .values(state="planning")
        )
    real = reconciler.plan

    def plan(engine, settings, action_id):
        if action_id == first["id"]:  # the oldest row: it used to stop the pass
            raise RuntimeError("a defect in this row")
        return real(engine, settings, action_id)

    monkeypatch.setattr(reconciler, "plan", plan)
    assert reconciler.reconcile(world.engine, s) == 1
    assert outbox.get_action(world.engine, first["id"])["state"] == "planning"
    assert outbox.get_action(world.engine, second["id"])["state"] != "planning"


def test_a_hang_that_follows_the_job_to_the_node_it_was_moved_to_stops_it(world):
    """A stuck rank on node1 (its node named, a suspect): requeued away from node1, not
    drained. The restarted job's rank hangs the same way on node2: the same cause (a
    workload verdict's key names no node, `attribution.cause_key`), so the sticky rule stops
    the job. Before, the keys named node1 and node2, and the job was requeued again, free to
    walk the cluster until its retry budget ran out."""
    from recovery.attribution import cause_key

    world.submit("42", node="node1")
    s = world.settings("act")
    inc, d = diag(1, outcome="workload_hang", nodes=("node1",), conf=0.7, cause="stuck rank")
    first = actions.on_diagnosis(
        world.engine,
        s,
        inc,
        d | {"cause_key": cause_key("workload_hang", ["gpu_stuck"], ["node1"])},
    )
    assert first["kind"] == "requeue" and first["state"] == "executed"
    assert (
        first["body"]["action"]["exclude"] == ["node1"] and first["body"]["action"]["nodes"] == []
    )
    assert world.st["nodes"]["node1"]["state"] == "IDLE"  # not drained: in service for others
    job = world.st["jobs"]["42"]
    assert job["state"] == "RUNNING" and job["nodes"] != ["node1"]
    time.sleep(0.01)  # the restarted job hangs again: the new onset follows its restart
    inc, d = diag(
        2,
        outcome="workload_hang",
        nodes=tuple(job["nodes"]),
        conf=0.85,
        cause="stuck rank",
        onset=time.time(),
    )  # fmt: skip  (a stop needs 0.8)
    key = cause_key("workload_hang", ["gpu_stuck"], job["nodes"])
    second = actions.on_diagnosis(world.engine, s, inc, d | {"cause_key": key})
    assert second["kind"] == "stop", second["body"]["action"]
    assert "sticky_root_cause" in second["body"]["action"]["reasons"]


def test_the_catalogues_action_hint_reaches_the_planner(world):
    """The outbox kept the diagnosis without its action_hint, so honour_catalogue_hints never
    applied in the receiver: a contained XID 94 (hint: requeue) drained its node."""
    world.submit("42", node="node2", state="FAILED", exit_code=1)
    world.st["jobs"]["42"]["end_time"] = time.time() - 5
    incident, d = diag(12, outcome="gpu_degradation", cause="xid 94")
    d["action_hint"] = "requeue"
    a = actions.on_diagnosis(world.engine, world.settings("act"), incident, d)
    assert a["kind"] == "requeue", a["body"]["action"]["reasons"]
    assert not world.st["nodes"]["node2"]["state"].startswith("DRAIN")


def _ready_after_a_blip(world, iid):
    """An act-mode plan whose drain met a scheduler blip: `ready`, waiting for its retry."""
    sched = world.sched
    real, down = sched._drain, {"on": True}

    def flaky(node, reason):
        if down["on"]:
            raise executor.SchedulerUnavailable("slurmctld not responding")
        return real(node, reason)

    sched._drain = flaky
    a = actions.on_diagnosis(world.engine, world.settings("act"), *diag(iid))
    down["on"] = False
    assert a["state"] == "ready"
    return a


def test_an_action_planned_in_act_does_not_run_after_a_turn_to_monitor(world):
    """The mode was read at planning only: an action planned in act that met a scheduler
    blip ran after the receiver was restarted in monitor mode ("monitor changes nothing")."""
    world.submit("42", node="node2")
    a = _ready_after_a_blip(world, 40)
    reconciler.reconcile(world.engine, world.settings("monitor"), startup=True)
    assert outbox.get_action(world.engine, a["id"])["state"] == "skipped"
    assert world.st["jobs"]["42"]["restarts"] == 0
    assert not world.st["nodes"]["node2"]["state"].startswith("DRAIN")
    assert audit.verify(world.engine).ok


def test_an_action_planned_in_act_waits_for_a_person_after_a_turn_to_approve(world):
    world.submit("42", node="node2")
    a = _ready_after_a_blip(world, 41)
    reconciler.reconcile(world.engine, world.settings("approve"))
    assert outbox.get_action(world.engine, a["id"])["state"] == "pending_approval"
    assert world.st["jobs"]["42"]["restarts"] == 0
    r = approvals.approve(world.engine, world.settings("approve"), a["id"], "alice")
    assert r["state"] == "executed" and world.st["jobs"]["42"]["restarts"] == 1


def test_an_approval_given_after_a_turn_to_monitor_executes_nothing(world):
    world.submit("42", node="node2")
    a = actions.on_diagnosis(world.engine, world.settings("approve"), *diag(42))
    assert a["state"] == "pending_approval"
    r = approvals.approve(world.engine, world.settings("monitor"), a["id"], "alice")
    assert r["state"] == "skipped" and world.st["jobs"]["42"]["restarts"] == 0
    assert not world.st["nodes"]["node2"]["state"].startswith("DRAIN")


def test_a_failed_action_still_counts_the_drain_and_the_restart_it_made(tmp_path, monkeypatch):
    """A drain_and_requeue whose drain ran and whose requeue Slurm carried out but did not show
    in time ended `failed`, and the blast radius and the retry budget forgot both: a second
    incident drained a second node under max_drains_per_hour 1, and Slurm's restart count ran
    ahead of the budget's."""
    client, st, submit = make_fake_sim(nodes=tuple(f"node{i}" for i in range(1, 9)))
    engine = make_engine(f"sqlite:///{tmp_path / 'a.db'}")
    sched = SimulatedScheduler("http://testserver", session=client)
    policy = parse_policy({"mode": "act", "blast_radius": {"max_drains_per_hour": 1}}, env={})
    s = SimpleNamespace(
        policy=policy, scheduler_adapter=sched, alertmanager_url=None, prometheus_url=None,
        action_retry_s=0.0,
    )  # fmt: skip
    submit("42", node="node2")
    submit("43", node="node3")
    real = sched.requeue

    def slow(job_id, *a, **k):
        done = real(job_id, *a, **k)
        if job_id == "42":  # carried out, not shown in time
            raise executor.SchedulerError("not confirmed within 10s: job 42 requeued")
        return done

    monkeypatch.setattr(sched, "requeue", slow)
    a = actions.on_diagnosis(engine, s, *diag(1))
    assert a["state"] == "failed" and st["nodes"]["node2"]["state"].startswith("DRAIN")
    b = actions.on_diagnosis(engine, s, *diag(2, job="43", nodes=("node3",)))
    assert not st["nodes"]["node3"]["state"].startswith("DRAIN"), b["body"]["action"]["reasons"]
    h = planning._history(
        engine, None, Diagnosis("3", "42", "workload_hang", "x"), sched.job_state("42"), []
    )
    assert h.restarts_done == st["jobs"]["42"]["restarts"] == 1


def test_a_restart_that_found_the_job_requeued_already_is_not_charged(world):
    """Two incidents of one job, both requeues approved: Slurm restarts the job once (the second
    finds it requeued and does nothing) but the budget was charged twice."""
    world.submit("42", node="node2")
    s = world.settings("approve")
    a = actions.on_diagnosis(world.engine, s, *diag(1, outcome="workload_hang"))
    b = actions.on_diagnosis(world.engine, s, *diag(2, outcome="workload_hang"))
    assert a["state"] == b["state"] == "pending_approval"
    approvals.approve(world.engine, s, a["id"], "alice")
    assert approvals.approve(world.engine, s, b["id"], "bob")["state"] == "executed"
    job = world.sched.job_state("42")
    h = planning._history(world.engine, None, Diagnosis("3", "42", "workload_hang", "x"), job, [])
    assert h.restarts_done == world.st["jobs"]["42"]["restarts"] == 1

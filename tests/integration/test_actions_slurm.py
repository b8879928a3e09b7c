"""Recovery actions against the local stack's real Slurm: act / monitor / approve, stop,
sticky escalation, and kill -9 between planning, executing and recording."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest

from recovery import actions, approvals, audit, outbox
from recovery.store import make_engine
from tests.conftest import wait_until
from tests.helpers import SlurmJobs, diagnosis

POLICY = SlurmJobs.POLICY


@pytest.fixture
def cluster(local_stack, tmp_path, monkeypatch):
    monkeypatch.setenv("GOODPUT_ACTIONS_THREAD", "0")
    monkeypatch.delenv("GOODPUT_TEST_CRASH_AT", raising=False)
    jobs = SlurmJobs("gp7")
    db = f"sqlite:///{tmp_path / 'actions.db'}"

    def submit(n_nodes: int = 1) -> tuple[str, str]:
        job = jobs.submit(nodes=n_nodes)
        s = wait_until(
            lambda: (j := jobs.sched.job_state(job)) and j.state == "RUNNING" and j,
            timeout=20,
            what=f"job {job} running",
        )
        time.sleep(1.1)  # the fault's onset comes after the job started (whole seconds)
        return job, s.nodes[0]

    yield SimpleNamespace(
        sched=jobs.sched,
        submit=submit,
        settings=jobs.settings,
        tag=jobs.tag,
        db=db,
        engine=make_engine(db),
    )
    jobs.close()


def diag(cluster, job, node, outcome="gpu_hardware_fault", cause="xid79", onset=None):
    return diagnosis(cluster.tag, job, node, outcome, cause, onset=onset)


def node(cluster, name):
    return cluster.sched.node_state(name)


def test_act_drains_requeues_excluding_and_runs_again(cluster):
    job, x = cluster.submit()
    a = actions.on_diagnosis(cluster.engine, cluster.settings("act"), *diag(cluster, job, x))
    assert a["state"] == "executed", a
    n = node(cluster, x)
    assert n.drained and n.reason.startswith("goodput:") and cluster.tag in n.reason
    s = wait_until(
        lambda: (j := cluster.sched.job_state(job)) and j.state == "RUNNING" and j,
        timeout=30,
        what="job running again",
    )
    assert s.restarts == 1 and x in s.excluded and x not in s.nodes
    chain = [e["type"] for e in audit.query(cluster.engine, job_id=job)[0]]
    assert chain == ["diagnosis", "planned", "executing", "executed"]
    assert audit.verify(cluster.engine).ok


NO_BACKOFF = {"retry": {"max_requeues_per_job": 10, "sticky_after": 10, "backoff_s": [0]}}


def running_again(cluster, job, restarts):
    s = wait_until(
        lambda: (j := cluster.sched.job_state(job)) and j.state == "RUNNING" and j,
        timeout=30,
        what=f"job {job} running again",
    )
    assert s.restarts == restarts, s
    time.sleep(1.1)  # the next fault's onset comes after the restart (whole seconds)
    return s


def test_a_black_hole_node_is_excluded_on_every_later_requeue(cluster):
    """XID 79 on node X: drain, requeue excluding X. X passes its check and is resumed; the job
    then hits an ECC error on node Y: drain Y, requeue excluding Y and still X (Slurm keeps only
    the ExcNodeList of the latest update); then it hangs (requeue, no culprit): X and Y stay
    excluded, so neither bad node gets the job again."""
    s = cluster.settings("act", **NO_BACKOFF)
    job, x = cluster.submit()
    a = actions.on_diagnosis(cluster.engine, s, *diag(cluster, job, x))
    assert a["state"] == "executed", a
    y = running_again(cluster, job, 1).nodes[0]
    cluster.sched.resume(x)  # X passed its health check
    b = actions.on_diagnosis(cluster.engine, s, *diag(cluster, job, y, cause="xid48 dbe"))
    assert b["state"] == "executed" and b["kind"] == "drain_and_requeue", b
    assert sorted(b["body"]["action"]["exclude"]) == sorted([x, y])
    again = running_again(cluster, job, 2)
    assert {x, y} <= set(again.excluded) and not {x, y} & set(again.nodes), again
    cluster.sched.resume(y)
    c = actions.on_diagnosis(
        cluster.engine, s, *diag(cluster, job, None, outcome="workload_hang", cause="hang")
    )
    assert c["state"] == "executed" and c["kind"] == "requeue", c
    third = running_again(cluster, job, 3)
    assert {x, y} <= set(third.excluded) and not {x, y} & set(third.nodes), third


def test_exclusions_never_leave_a_two_node_job_without_nodes(cluster):
    """A 2-node job fails on a node again and again (each repaired after): with every culprit
    excluded it would soon have too few nodes left (the reverted code's job sat pending as
    BadConstraints). The restart that would strand it drops the oldest exclusion, audits it,
    and the job runs. (With four nodes up that is the third restart, with three the second.)"""
    s = cluster.settings("act", **NO_BACKOFF)
    up = [n.node for n in cluster.sched.node_states() if not (n.drained or "DOWN" in n.state)]
    assert len(up) >= 3, f"this test needs three nodes up; only {up} are"
    job, _ = cluster.submit(n_nodes=2)
    culprits = []
    for i in range(len(up) - 1):
        bad = sorted(cluster.sched.job_state(job).nodes)[0]
        culprits.append(bad)
        a = actions.on_diagnosis(cluster.engine, s, *diag(cluster, job, bad, cause=f"xid79-{i}"))
        assert a["state"] == "executed", a
        running_again(cluster, job, i + 1)
        cluster.sched.resume(bad)
        if a["body"]["action"]["exclusions_dropped"]:
            break
    plan = a["body"]["action"]
    assert len(culprits) == len(up) - 1 and plan["exclusions_dropped"] == [culprits[0]], plan
    assert set(plan["exclude"]) == set(culprits[1:])
    final = cluster.sched.job_state(job)
    assert final.state == "RUNNING" and set(final.excluded) == set(culprits[1:]), final
    planned = [e for e in audit.query(cluster.engine, job_id=job)[0] if e["type"] == "planned"]
    assert planned[-1]["payload"]["exclusions_dropped"] == [culprits[0]]


def test_monitor_changes_nothing_in_slurm(cluster):
    job, x = cluster.submit()
    a = actions.on_diagnosis(cluster.engine, cluster.settings("monitor"), *diag(cluster, job, x))
    assert a["state"] == "planned_only" and a["kind"] == "drain_and_requeue"
    time.sleep(1)
    assert not node(cluster, x).drained
    s = cluster.sched.job_state(job)
    assert s.state == "RUNNING" and s.restarts == 0
    assert [e["type"] for e in audit.query(cluster.engine, job_id=job)[0]] == [
        "diagnosis",
        "planned",
    ]


def test_approve_waits_for_a_person(cluster):
    job, x = cluster.submit()
    s = cluster.settings("approve")
    a = actions.on_diagnosis(cluster.engine, s, *diag(cluster, job, x))
    assert a["state"] == "pending_approval"
    time.sleep(1)
    assert not node(cluster, x).drained and cluster.sched.job_state(job).restarts == 0
    done = approvals.approve(cluster.engine, s, a["id"], "oncall-ana")
    assert done["state"] == "executed" and done["decided_by"] == "oncall-ana"
    assert node(cluster, x).drained
    j = cluster.sched.job_state(job)
    assert j.restarts == 1 and x in j.excluded


def test_oom_stops_the_job_without_draining(cluster):
    job, x = cluster.submit()
    a = actions.on_diagnosis(
        cluster.engine,
        cluster.settings("act"),
        *diag(cluster, job, None, "workload_oom", "cuda_oom"),
    )
    assert a["state"] == "executed" and a["kind"] == "stop"
    j = cluster.sched.job_state(job)
    assert j.held and j.state == "PENDING"
    assert not node(cluster, x).drained


def test_sticky_error_stops_on_second_occurrence(cluster):
    job, x = cluster.submit()
    s = cluster.settings("act")
    first = actions.on_diagnosis(
        cluster.engine, s, *diag(cluster, job, None, "workload_crash", "illegal_address")
    )
    assert first["kind"] == "requeue" and first["state"] == "executed"
    wait_until(
        lambda: (j := cluster.sched.job_state(job)) and j.state == "RUNNING" and j.restarts == 1,
        timeout=30,
        what="job restarted",
    )
    time.sleep(1.1)
    second = actions.on_diagnosis(
        cluster.engine,
        s,
        *diag(cluster, job, None, "workload_crash", "illegal_address", onset=time.time()),
    )
    assert second["kind"] == "stop" and "sticky_root_cause" in second["body"]["action"]["reasons"]
    assert cluster.sched.job_state(job).held


CHILD = textwrap.dedent("""
    import json, sys
    from types import SimpleNamespace
    from recovery import actions, reconciler
    from recovery.store import make_engine
    from recovery.policy import parse_policy
    from recovery.scheduler.slurm import SlurmScheduler
    db, inc, d, policy = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), \\
        json.loads(sys.argv[4])
    s = SimpleNamespace(policy=parse_policy(policy, env={}), scheduler_adapter=SlurmScheduler(),
                        alertmanager_url=None, prometheus_url=None)
    engine = make_engine(db)
    if inc:
        actions.on_diagnosis(engine, s, inc, d)
    else:
        reconciler.start(engine, s, thread=False)
""")


def run_child(cluster, inc, d, crash=None):
    import json

    env = {**os.environ, "GOODPUT_ACTIONS_THREAD": "0"}
    env.pop("GOODPUT_TEST_CRASH_AT", None)
    if crash:
        env["GOODPUT_TEST_CRASH_AT"] = crash
    return subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            cluster.db,
            json.dumps(inc),
            json.dumps(d),
            json.dumps({"mode": "act", **POLICY}),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


# What Slurm shows after a kill -9 at each point: (restarts, node drained, job held).
AFTER_KILL = {
    "planned": (0, False, False),
    "claimed": (0, False, False),
    "drained": (0, True, False),
    "requeue_held": (1, True, True),  # Slurm 22.05: PENDING, JobHeldUser, no exclusion yet
    "excluded": (1, True, True),
    "executed": (1, True, False),
}


@pytest.mark.parametrize("crash", list(AFTER_KILL))
def test_kill_9_neither_loses_nor_repeats(cluster, crash):
    job, x = cluster.submit()
    inc, d = diag(cluster, job, x)
    died = run_child(cluster, inc, d, crash)
    assert died.returncode == -9, died.stderr
    row = outbox.get_action(cluster.engine, f"inc-{inc['id']}")
    j = cluster.sched.job_state(job)
    restarts, drained, held = AFTER_KILL[crash]
    assert row["state"] == ("ready" if crash == "planned" else "executing")
    assert (j.restarts, node(cluster, x).drained, j.held) == (restarts, drained, held), j
    again = run_child(cluster, {}, {})  # restart: reconcile against Slurm
    assert again.returncode == 0, again.stderr
    row = outbox.get_action(cluster.engine, f"inc-{inc['id']}")
    assert row["state"] == "executed", row
    j = cluster.sched.job_state(job)
    assert j.restarts == 1 and x in j.excluded and not j.held, j  # one requeue, released
    n = node(cluster, x)
    assert n.drained and cluster.tag in n.reason
    types = [e["type"] for e in audit.query(cluster.engine, job_id=job)[0]]
    assert types.count("executed") == 1
    assert "reconciled" in types
    assert audit.verify(cluster.engine).ok

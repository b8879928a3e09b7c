"""Issue 20 on the local stack's real Slurm (22.05): a requeue sets the job's `ExcNodeList` to
exactly the planned list. An exclusion Goodput set before and the plan dropped is cleared
(before, a requeue with nothing to exclude was a plain `scontrol requeue` and Slurm kept it); a
person's own `sbatch --exclude` survives a Goodput requeue (before, it was replaced)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from recovery import actions
from recovery.store import make_engine
from tests.conftest import wait_until
from tests.helpers import SlurmJobs, diagnosis, slurm


@pytest.fixture
def cluster(local_stack, tmp_path, monkeypatch):
    monkeypatch.setenv("GOODPUT_ACTIONS_THREAD", "0")
    monkeypatch.delenv("GOODPUT_TEST_CRASH_AT", raising=False)
    jobs = SlurmJobs("gp20")
    sched = jobs.sched

    def running(job: str, restarts: int = 0):
        return wait_until(
            lambda: (
                (j := sched.job_state(job))
                and j.state == "RUNNING"
                and j.restarts == restarts
                and j
            ),
            timeout=30,
            what=f"job {job} running (restarts {restarts})",
        )

    yield SimpleNamespace(
        sched=sched,
        submit=jobs.submit,
        running=running,
        tag=jobs.tag,
        settings=jobs.settings("act"),
        engine=make_engine(f"sqlite:///{tmp_path / 'actions.db'}"),
    )
    jobs.close()


def diagnosed(cluster, job: str, outcome: str, cause: str, node: str, confidence: float):
    """The action Goodput takes on a diagnosis naming `node`, its onset after the job started
    (Slurm's start time has whole seconds)."""
    time.sleep(1.1)
    inc, d = diagnosis(cluster.tag, job, node, outcome, cause, confidence)
    return actions.on_diagnosis(cluster.engine, cluster.settings, inc, d)


def test_a_dropped_exclusion_is_cleared_on_requeue(cluster):
    job = cluster.submit()
    first = cluster.running(job)
    other = next(n.node for n in cluster.sched.node_states() if n.node not in first.nodes)
    cluster.sched.requeue(job, (other,), expected_restarts=0)  # an earlier Goodput exclusion
    assert cluster.running(job, 1).excluded == (other,)
    # the cap dropped it and this restart has no culprit: the list must end empty
    r = cluster.sched.requeue(job, (), expected_restarts=1, drop=(other,))
    assert r.changed
    again = cluster.running(job, 2)
    assert again.excluded == ()
    assert "ExcNodeList=(null)" in slurm("scontrol", "show", "job", job)


def test_a_persons_exclude_survives_a_goodput_requeue(cluster):
    job = cluster.submit("--exclude=node4")
    first = cluster.running(job)
    assert first.excluded == ("node4",)
    x = first.nodes[0]
    a = diagnosed(cluster, job, "gpu_hardware_fault", "xid79", x, 0.95)
    assert a["state"] == "executed" and a["kind"] == "drain_and_requeue", a
    assert a["body"]["action"]["exclude"] == [x]  # Goodput's own list: not the person's node
    again = cluster.running(job, 1)
    assert set(again.excluded) == {x, "node4"}
    assert not set(again.nodes) & {x, "node4"}


def test_a_hangs_suspect_node_is_excluded_from_the_requeue_not_drained(cluster):
    """A hang whose diagnosis names a node (the rank the others wait on, a one-node job's
    spin) is a workload verdict: the requeue moves the job off that node (before, the restart
    could land on it again) and the node stays in service for other jobs."""
    job = cluster.submit()
    first = cluster.running(job)
    x = first.nodes[0]
    a = diagnosed(cluster, job, "workload_hang", "job_spin", x, 0.7)
    assert a["state"] == "executed" and a["kind"] == "requeue", a
    assert a["body"]["action"]["exclude"] == [x] and a["body"]["action"]["nodes"] == []
    again = cluster.running(job, 1)
    assert again.excluded == (x,) and x not in again.nodes
    state = next(n.state for n in cluster.sched.node_states() if n.node == x)
    assert "DRAIN" not in state.upper(), state

"""Blast-radius budgets hold over any interleaving of plan / approve / reject / execute /
scheduler outage / repair / external failure, through the real actions code (outbox on SQLite,
the fake simulator behind the scheduler port): a drain is reserved when planned and checked
again at approval and at execution, so `max_partition_unavailable_fraction`,
`min_healthy_nodes` and `max_drains_per_hour` are never exceeded by a drain Goodput makes."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recovery import actions, approvals, audit, outbox, reconciler
from recovery.policy import parse_policy
from recovery.scheduler.simulated import SimulatedScheduler
from recovery.store import make_engine
from tests.unit.actions_fakes import make_fake_sim

NODES = ("node1", "node2", "node3", "node4", "node5")
UNAVAILABLE = ("DRAIN", "DOWN")


class Down:
    def get(self, *a, **k):
        raise requests.ConnectionError("down")

    post = get


plan = st.tuples(st.just("plan"), st.sampled_from(NODES))
approve = st.tuples(st.just("approve"), st.integers(0, 20))
op = st.one_of(  # plans and approvals weighted up: they are what spends the budget
    plan,
    plan,
    plan,
    approve,
    approve,
    approve,
    st.tuples(st.just("reject"), st.integers(0, 20)),
    st.tuples(st.just("execute")),
    st.tuples(st.just("outage"), st.booleans()),
    st.tuples(st.just("repair"), st.sampled_from(NODES)),
    st.tuples(st.just("external_down"), st.sampled_from(NODES)),
)
limits = st.fixed_dictionaries(
    {
        "max_drains_per_hour": st.integers(1, 6),
        "max_partition_unavailable_fraction": st.sampled_from([0.0, 0.2, 0.34, 0.5, 0.75, 1.0]),
        "min_healthy_nodes": st.integers(0, len(NODES)),
    }
)


def _out(st_):
    return sum(1 for n in st_["nodes"].values() if n["state"].startswith(UNAVAILABLE))


@pytest.fixture(autouse=True)
def _no_thread(monkeypatch):
    monkeypatch.setenv("GOODPUT_ACTIONS_THREAD", "0")
    monkeypatch.delenv("GOODPUT_TEST_CRASH_AT", raising=False)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(limits=limits, mode=st.sampled_from(["approve", "act"]), ops=st.lists(op, max_size=25))
def test_no_interleaving_drains_past_a_limit(limits, mode, ops):
    client, sim, submit = make_fake_sim(NODES)
    engine = make_engine(f"sqlite:///{Path(tempfile.mkdtemp()) / 'b.db'}")
    sched = SimulatedScheduler("http://testserver", session=client)
    s = SimpleNamespace(
        policy=parse_policy({"mode": mode, "blast_radius": limits}, env={}),
        scheduler_adapter=sched,
        alertmanager_url=None,
        prometheus_url=None,
        action_retry_s=0.0,
    )
    drains = 0
    for i, o in enumerate(ops):
        before = len([c for c in sim["calls"] if c[0] == "drain"])
        if o[0] == "plan":
            job = str(100 + i)
            submit(job, node=o[1])
            inc = {"id": str(i), "job_id": job, "opened_at": time.time()}
            d = {
                "outcome": "gpu_hardware_fault",
                "root_cause": "xid79",
                "affected_nodes": [o[1]],
                "confidence": 0.99,
                "onset": time.time() - 60,
            }
            actions.on_diagnosis(engine, s, inc, d)
        elif o[0] in ("approve", "reject"):
            pending = outbox.list_actions(engine, state="pending_approval")
            if pending:
                a = pending[o[1] % len(pending)]
                try:
                    if o[0] == "approve":
                        approvals.approve(engine, s, a["id"], "ana")
                    else:
                        approvals.reject(engine, a["id"], "ana")
                except approvals.ActionError as exc:
                    assert "blast radius" in str(exc)
        elif o[0] == "execute":
            reconciler.reconcile(engine, s)
        elif o[0] == "outage":
            sched.session = Down() if o[1] else client
        elif o[0] == "repair":
            sim["nodes"][o[1]].update(state="IDLE", reason="")
        else:
            sim["nodes"][o[1]].update(state="DOWN", reason="power")
        drained_now = len([c for c in sim["calls"] if c[0] == "drain"]) - before
        drains += drained_now
        if drained_now:
            out = _out(sim)
            assert out / len(NODES) <= limits["max_partition_unavailable_fraction"] + 1e-9
            assert len(NODES) - out >= limits["min_healthy_nodes"]
            assert drains <= limits["max_drains_per_hour"]
    assert audit.verify(engine).ok


def test_four_concurrent_approvals_drain_at_most_the_budget(tmp_path, monkeypatch):
    """The reported case: 4 nodes, fraction 0.5, min healthy 1, four pending drains approved
    one after another: two drain, the other two stay pending with the reason."""
    monkeypatch.setenv("GOODPUT_ACTIONS_THREAD", "0")
    nodes = NODES[:4]
    client, sim, submit = make_fake_sim(nodes)
    engine = make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    limits = {
        "max_drains_per_hour": 10,
        "max_partition_unavailable_fraction": 0.5,
        "min_healthy_nodes": 1,
    }
    s = SimpleNamespace(
        policy=parse_policy({"mode": "approve", "blast_radius": limits}, env={}),
        scheduler_adapter=SimulatedScheduler("http://testserver", session=client),
        alertmanager_url=None,
        prometheus_url=None,
        action_retry_s=0.0,
    )
    planned = []
    for i, n in enumerate(nodes):
        submit(str(200 + i), node=n)
        inc = {"id": f"c{i}", "job_id": str(200 + i), "opened_at": time.time()}
        d = {"outcome": "gpu_hardware_fault", "affected_nodes": [n], "confidence": 0.99}
        planned.append(actions.on_diagnosis(engine, s, inc, d))
    pending = [a for a in planned if a["state"] == "pending_approval"]
    held = [a for a in planned if a["kind"] == "hold_for_person"]
    assert len(pending) == 2 and len(held) == 2  # reserved at planning
    assert all("blast_radius_partition_fraction" in a["body"]["action"]["reasons"] for a in held)
    for a in pending:
        assert approvals.approve(engine, s, a["id"], "ana")["state"] == "executed"
    assert _out(sim) == 2

"""Black-hole nodes: a node that failed a job stays excluded from the job's later restarts,
capped so that the exclusions never leave the job too few up, non-drained nodes to run on."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from recovery.decide import (
    Diagnosis,
    History,
    JobView,
    NodeView,
    Reason,
    cap_exclusions,
    decide,
)
from recovery.policy import parse_policy

NODES = [f"node{i}" for i in range(1, 7)]
STATES = ["IDLE", "ALLOCATED", "MIXED", "DRAIN", "DRAINED", "DOWN", "IDLE+DRAIN"]
POLICY = parse_policy(
    {
        "mode": "act",
        "retry": {"max_requeues_per_job": 100, "sticky_after": 100, "backoff_s": [0]},
        "blast_radius": {
            "max_drains_per_hour": 1000,
            "max_partition_unavailable_fraction": 1.0,
            "min_healthy_nodes": 0,
        },
    },
    env={},
)


def views(states: dict[str, str], part: str = "gpu") -> tuple[NodeView, ...]:
    return tuple(NodeView(n, s, (part,)) for n, s in states.items())


def free(history: History, exclude: tuple[str, ...], partition: str = "gpu") -> int:
    return sum(
        1
        for v in history.nodes
        if partition in v.partitions
        and not v.unavailable
        and v.node not in exclude
        and v.node not in history.reserved
    )


def hang(i: int, nodes: tuple[str, ...] = (), outcome: str = "workload_hang") -> Diagnosis:
    return Diagnosis(str(i), "42", outcome, "c", nodes, 0.95, 1600.0 + i)


def test_earlier_exclusions_are_kept_while_the_job_can_still_run():
    h = History(
        now=2000.0,
        job=JobView("RUNNING", 1, None, "gpu", 1000.0, node_count=1),
        nodes=views(dict.fromkeys(NODES[:4], "IDLE")),
        excluded_before=("node1",),
    )
    a = decide(hang(1), h, POLICY)
    assert a.kind == "requeue" and a.exclude == ("node1",) and a.dropped == ()
    b = decide(hang(2, ("node2",), "gpu_hardware_fault"), h, POLICY)
    assert b.kind == "drain_and_requeue" and b.exclude == ("node1", "node2")


def test_the_oldest_exclusion_goes_first_and_the_drop_is_a_reason():
    """A 2-node job on 4 nodes: node1 then node2 failed it (both repaired since); now node3
    fails it. Excluding all three leaves one node for a 2-node job: the reverted code held
    exactly such a job as BadConstraints. node1, the oldest, is dropped and said so."""
    h = History(
        now=2000.0,
        job=JobView("RUNNING", 2, None, "gpu", 1000.0, node_count=2),
        nodes=views(dict.fromkeys(NODES[:4], "IDLE")),
        excluded_before=("node1", "node2"),
    )
    a = decide(hang(3, ("node3",), "gpu_hardware_fault"), h, POLICY)
    assert a.kind == "drain_and_requeue"
    assert a.exclude == ("node2", "node3") and a.dropped == ("node1",)
    assert Reason.EXCLUSIONS_CAPPED in a.reasons
    assert a.to_dict()["exclusions_dropped"] == ["node1"]


def test_a_drained_earlier_node_frees_nothing_so_it_is_kept():
    h = History(
        now=2000.0,
        job=JobView("RUNNING", 2, None, "gpu", 1000.0, node_count=2),
        nodes=views({"node1": "DRAIN", "node2": "IDLE", "node3": "IDLE", "node4": "IDLE"}),
        excluded_before=("node1", "node2"),
    )
    exclude, dropped = cap_exclusions(("node3",), h.excluded_before, 2, h, "gpu")
    assert exclude == ("node1", "node3") and dropped == ("node2",)


def test_unknown_node_states_keep_only_this_faults_culprits():
    h = History(now=1.0, nodes=(), excluded_before=("node1",))
    assert cap_exclusions(("node2",), ("node1",), 1, h, "gpu") == (("node2",), ("node1",))


def test_only_the_jobs_partition_counts():
    nodes = (*views({"a1": "IDLE", "a2": "IDLE"}, "a"), *views({"b1": "IDLE", "b2": "IDLE"}, "b"))
    h = History(now=1.0, nodes=nodes)
    assert cap_exclusions((), ("a1", "a2"), 1, h, "a") == (("a2",), ("a1",))
    assert cap_exclusions((), ("a1", "b1"), 1, h, "b") == (("a1", "b1"), ())


@settings(max_examples=400, deadline=None)
@given(
    states=st.fixed_dictionaries({n: st.sampled_from(STATES) for n in NODES}),
    culprits=st.lists(st.sampled_from(NODES), max_size=3, unique=True),
    earlier=st.lists(st.sampled_from(NODES), max_size=6, unique=True),
    reserved=st.lists(st.sampled_from(NODES), max_size=2, unique=True),
    need=st.integers(1, 6),
)
def test_exclusions_never_make_the_job_unsatisfiable(states, culprits, earlier, reserved, need):
    h = History(now=1.0, nodes=views(states), reserved=tuple(reserved))
    exclude, dropped = cap_exclusions(tuple(culprits), tuple(earlier), need, h, "gpu")
    assert set(culprits) <= set(exclude), "a culprit is always excluded"
    assert set(exclude) | set(dropped) == set(culprits) | set(earlier)
    assert not set(exclude) & set(dropped) and len(exclude) == len(set(exclude))
    baseline = free(h, tuple(culprits))  # what the job has with no earlier exclusion at all
    if baseline >= need:
        assert free(h, exclude) >= need, "the exclusions left the job no room to run"
    else:  # nothing earlier that could help is kept
        assert free(h, exclude) == baseline
    if dropped:  # only what was needed, oldest first
        assert free(h, exclude) <= need
        older = [n for n in earlier if n not in culprits]
        helpful = [n for n in older if n in {v.node for v in h.nodes if not v.unavailable}]
        helpful = [n for n in helpful if n not in reserved]
        assert list(dropped) == helpful[: len(dropped)]


@settings(max_examples=150, deadline=None)
@given(
    need=st.integers(1, 3),
    events=st.lists(
        st.tuples(st.sampled_from(["fault", "hang", "repair", "person"]), st.sampled_from(NODES)),
        max_size=30,
    ),
)
def test_a_job_restarted_again_and_again_always_has_room(need, events):
    """A stream of faults (drain and requeue), hangs (requeue), repairs and a person's drains,
    with each restart's exclusions fed to the next as planning does: the job never ends up
    excluded from every node it could run on, and a culprit stays excluded while room allows."""
    states = dict.fromkeys(NODES, "IDLE")
    earlier: dict[str, None] = {}
    for i, (ev, node) in enumerate(events):
        if ev in ("repair", "person"):
            states[node] = "IDLE" if ev == "repair" else "DRAIN"
            continue
        h = History(
            now=2000.0 + i,
            job=JobView("RUNNING", i, None, "gpu", 1000.0, node_count=need),
            nodes=views(states),
            excluded_before=tuple(earlier),
        )
        fault = ev == "fault" and states[node] == "IDLE"
        d = hang(i, (node,), "gpu_hardware_fault") if fault else hang(i)
        a = decide(d, h, POLICY)
        assert a.kind in ("requeue", "drain_and_requeue"), a
        for n in a.nodes:
            states[n] = "DRAIN"
        after = History(now=h.now, nodes=views(states))
        room = sum(1 for n, s in states.items() if s == "IDLE")
        if room >= need:
            assert free(after, a.exclude) >= need, (a, states)
        earlier.update(dict.fromkeys(a.exclude))


def test_a_fault_on_a_node_the_job_was_already_moved_off_neither_restarts_nor_stops_it():
    """The new run's incident blames the culprit an earlier restart excluded (its XID gauge
    keeps its value): the job left that node, so the fault is the ended run's. Failed before:
    the fault benchmark's gsp-timeout runs stopped the healthy restarted job (sticky root
    cause) in 2 of 3 seeds."""
    h = History(
        now=2000.0,
        job=JobView("RUNNING", 1, None, "gpu", 1000.0, node_count=1, nodes=("node3",)),
        nodes=views({"node1": "DRAINED", "node2": "IDLE", "node3": "ALLOCATED"}),
        restarts_done=1,
        same_cause_restarts=1,
        excluded_before=("node1",),
    )
    sticky = parse_policy({"mode": "act", "retry": {"sticky_after": 1, "backoff_s": [0]}}, env={})
    a = decide(hang(3, ("node1",), "gpu_hardware_fault"), h, sticky)
    assert a.kind == "none" and a.job_id == "42"
    assert Reason.CULPRIT_ALREADY_EXCLUDED in a.reasons
    b = decide(hang(4, ("node3",), "gpu_hardware_fault"), h, sticky)  # a node it runs on now
    assert b.kind == "stop" and Reason.STICKY_ROOT_CAUSE in b.reasons
    back = History(**{**h.__dict__, "job": JobView("RUNNING", 1, nodes=("node1",))})
    c = decide(hang(5, ("node1",), "gpu_hardware_fault"), back, sticky)  # the cap put it back
    assert c.kind == "stop"


def _hung(nodes: tuple[str, ...], states: dict[str, str], before: tuple[str, ...] = ()):
    h = History(
        now=2000.0,
        job=JobView("RUNNING", 1, None, "gpu", 1000.0, node_count=1, nodes=nodes),
        nodes=views(states),
        excluded_before=before,
    )
    return decide(hang(1, nodes), h, POLICY)


def test_a_hangs_suspect_is_avoided_only_where_an_idle_node_can_start_the_job():
    """A workload verdict does not blame the node it names: the requeue avoids it while an
    idle node can take the job now, and not when that would leave the job pending in the
    queue while the suspect sits idle (every other node busy with other jobs)."""
    spare = _hung(("node1",), {"node1": "ALLOCATED", "node2": "ALLOCATED", "node3": "IDLE"})
    assert (spare.kind, spare.exclude, spare.nodes, spare.dropped) == (
        "requeue", ("node1",), (), ())  # fmt: skip
    busy = _hung(("node1",), {"node1": "ALLOCATED", "node2": "ALLOCATED", "node3": "MIXED"})
    assert (busy.kind, busy.exclude, busy.dropped) == ("requeue", (), ())
    assert Reason.SUSPECTS_KEPT in busy.reasons and Reason.EXCLUSIONS_CAPPED not in busy.reasons


def test_a_suspect_on_a_one_node_partition_is_not_reported_as_a_dropped_exclusion():
    """It was never excluded: no `exclusions_dropped` entry (which the executor would clear
    from the job's list, a person's own exclusion of it too) and no capped reason."""
    a = _hung(("node1",), {"node1": "ALLOCATED"})
    assert a.exclude == () and a.dropped == () and Reason.EXCLUSIONS_CAPPED not in a.reasons


def test_the_suspect_is_kept_over_an_older_exclusion():
    """node1 was excluded by an earlier restart and dropped by the cap since; the job is back
    on it and hangs there. Of node1 and node2 (excluded after it) one must go for the job to
    run: the older exclusion goes, the suspect of this hang stays (before, node1 went first,
    being the oldest, and the job restarted on the node it just hung on)."""
    a = _hung(("node1",), {"node1": "ALLOCATED", "node2": "IDLE"}, before=("node1", "node2"))
    assert (a.exclude, a.dropped) == (("node1",), ("node2",))
    assert Reason.EXCLUSIONS_CAPPED in a.reasons and Reason.SUSPECTS_KEPT not in a.reasons

"""Blast-radius limits hold under arbitrary diagnosis streams (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from recovery.decide import Diagnosis, History, JobView, NodeView, decide
from recovery.policy import OUTCOMES, parse_policy

N_NODES = 8
NODE_NAMES = [f"n{i}" for i in range(N_NODES)]

event = st.one_of(
    st.tuples(
        st.just("diag"),
        st.sampled_from(OUTCOMES),
        st.lists(st.sampled_from(NODE_NAMES), max_size=4),
        st.floats(0.0, 1.0),
        st.floats(0.0, 1800.0),  # seconds since the previous event
    ),
    st.tuples(st.just("external_down"), st.sampled_from(NODE_NAMES)),
    st.tuples(st.just("repair"), st.sampled_from(NODE_NAMES)),
)
limits = st.fixed_dictionaries(
    {
        "max_drains_per_hour": st.integers(0, 5),
        "max_partition_unavailable_fraction": st.floats(0.0, 1.0),
        "min_healthy_nodes": st.integers(0, N_NODES),
    }
)


@settings(max_examples=300, deadline=None)
@given(limits=limits, events=st.lists(event, max_size=40))
def test_limits_hold_for_every_stream(limits, events):
    policy = parse_policy({"mode": "act", "blast_radius": limits}, env={})
    state = dict.fromkeys(NODE_NAMES, "IDLE")
    drains: list[float] = []
    now = 10_000.0
    for i, ev in enumerate(events):
        if ev[0] == "external_down":
            state[ev[1]] = "DOWN"
            continue
        if ev[0] == "repair":
            state[ev[1]] = "IDLE"
            continue
        _, outcome, nodes, conf, dt = ev
        now += dt
        views = tuple(NodeView(n, s, ("gpu",)) for n, s in state.items())
        h = History(
            now=now,
            job=JobView("RUNNING", 0, None, "gpu", 0.0),
            drain_times=tuple(drains),
            nodes=views,
        )
        a = decide(Diagnosis(str(i), "1", outcome, "c", tuple(nodes), conf, now), h, policy)
        for n in a.nodes:
            assert state[n] not in ("DRAIN", "DOWN"), "drained a node that was already out"
            state[n] = "DRAIN"
            drains.append(now)
        if a.nodes:
            out = sum(1 for s in state.values() if s != "IDLE")
            assert out / N_NODES <= limits["max_partition_unavailable_fraction"] + 1e-9
            assert N_NODES - out >= limits["min_healthy_nodes"]
            assert sum(1 for t in drains if now - 3600 < t <= now) <= limits["max_drains_per_hour"]
        assert set(a.nodes) <= set(nodes)

"""catalogue.promql: label values quoted for PromQL/RE2, and every query builder uses it.

The Prometheus checks of the same selectors are in tests/integration/test_promql_quoting.py.
"""

from __future__ import annotations

import doctest
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

import catalogue.promql as promql
from catalogue import names
from recovery.evidence import Context
from recovery.evidence import logs as evidence_logs
from recovery.evidence import prometheus as evidence_prom

NODE = "gpu-node-01.rack.a"


def _unquote(literal: str) -> str:
    """Go's unquoting of the escapes `quote` writes (what Prometheus's lexer does)."""
    assert literal[0] == literal[-1] == '"'
    table = {"\\\\": "\\", '\\"': '"', "\\n": "\n", "\\r": "\r", "\\t": "\t"}
    return re.sub(
        r'\\(?:x[0-9a-f]{2}|[\\"nrt])',
        lambda m: table.get(m[0]) or chr(int(m[0][2:], 16)),
        literal[1:-1],
    )


def test_doctests():
    assert doctest.testmod(promql).failed == 0


def test_node_names_with_dash_and_dot_need_no_invalid_escape():
    q = promql.selector("up", node=[NODE, "node2"])
    assert q == 'up{node=~"gpu-node-01\\\\.rack\\\\.a|node2"}'
    assert "\\-" not in q  # re.escape's `\-` is an unknown escape to Prometheus's parser


@given(st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=40))
def test_quote_round_trips_any_text(value):
    lit = promql.quote(value)
    assert _unquote(lit) == value
    # nothing unescaped that would end the literal or the line
    assert "\n" not in lit and not re.search(r'(?<!\\)(?:\\\\)*"', lit[1:-1])


@given(st.lists(st.from_regex(names.NODE, fullmatch=True), min_size=1, max_size=4), st.text())
def test_alternation_matches_exactly_the_values(nodes, other):
    rx = re.compile(promql.any_of(nodes))  # RE2's syntax here is a subset of Python's
    for n in nodes:
        assert rx.fullmatch(n)
    assert bool(rx.fullmatch(other)) == (other in nodes)


def test_near_misses_do_not_match():
    rx = re.compile(promql.any_of([NODE]))
    assert not rx.fullmatch("gpu-node-01Xrack.a")
    assert not rx.fullmatch(NODE + "b")


def test_bad_input_is_refused():
    for bad in ("\ud800", 3):
        with pytest.raises(ValueError):
            promql.quote(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        promql.matcher('node"}or vector(1)', "x")
    with pytest.raises(ValueError):
        promql.any_of([])
    with pytest.raises(ValueError):
        promql.selector("up{x}", node="a")


def test_every_recovery_query_quotes_node_names():
    ctx = Context(job_id=None, nodes=[NODE], start=0.0, end=60.0)
    qs = evidence_prom.queries(ctx)
    assert qs and all("\\-" not in q for q in qs)
    assert 'goodput_node_xid_errors_total{node=~"gpu-node-01\\\\.rack\\\\.a"}' in qs
    job = evidence_prom.queries(Context(job_id="12", nodes=[NODE], start=0.0, end=60.0))
    node = '"gpu-node-01\\\\.rack\\\\.a"'
    assert (
        f'DCGM_FI_DEV_GPU_UTIL{{hpc_job="12"}} or DCGM_FI_DEV_GPU_UTIL{{Hostname=~{node}, '
        f'hpc_job=""}} or DCGM_FI_DEV_GPU_UTIL{{hostname=~{node}, hpc_job=""}}'
    ) in job
    loki = evidence_logs.loki_streams(ctx)
    assert loki == [(f'{{source="kernel", node="{NODE}"}}', "kernel", [NODE])]

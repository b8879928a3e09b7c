"""catalogue.names: the job-id and node-name patterns and the bounded hostlist expander."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from catalogue import names
from catalogue.names import MAX_HOSTS, expand_hostlist, valid_job_id, valid_node


@pytest.mark.parametrize("value", ["1", "123456", "12_3", "0_0"])
def test_job_ids_accepted(value):
    assert valid_job_id(value)
    assert names.JOB_ID.match(value) and names.JOB_ID.search(value)


@pytest.mark.parametrize(
    "value", ["", "12\n", "12_", "_3", "1_2_3", "12;rm", " 12", "a1", 12, None]
)
def test_job_ids_refused(value):
    assert not valid_job_id(value)


@pytest.mark.parametrize("value", ["node1", "gpu-a08", "n.example_1", "0", "a" * 64])
def test_nodes_accepted(value):
    assert valid_node(value)


@pytest.mark.parametrize(
    "value", ["", "node1\n", "-node", ".node", "..", "a" * 65, "node 1", "node1;x", "nó", None]
)
def test_nodes_refused(value):
    assert not valid_node(value)
    if isinstance(value, str):  # any method is a whole-string match, `.search` included
        assert not names.NODE.search(value)


def test_every_copy_is_the_shared_pattern():
    from detector import frame
    from exporters import nvml_exporter, slurm_exporter
    from exporters.logmetrics import exporter, parser
    from exporters.sim import scenario
    from recovery import validate
    from recovery.scheduler import base

    nodes = [frame.NODE_RE, slurm_exporter.NODE, parser.NODE, scenario.NODE_RE]
    jobs = [frame.JOB_RE, nvml_exporter.JOB_ID, slurm_exporter.JOB_ID, parser.JOB_ID]
    assert all(p is names.NODE for p in [*nodes, validate.NODE, base.NODE_RE])
    assert all(p is names.JOB_ID for p in [*jobs, scenario.JOB_ID_RE, validate.JOB_ID, base.JOB_RE])
    assert exporter.JOB_FILE.match("slurm-12_3.out").group("job_id") == "12_3"
    assert exporter.KERNEL_FILE.match("node1.log").group("node") == "node1"
    assert not exporter.JOB_FILE.match("slurm-12.out\n")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("node[1-3,5],gpu7", ["node1", "node2", "node3", "node5", "gpu7"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("node[1-2]-ib", ["node1-ib", "node2-ib"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        (" a , b ,", ["a", "b"]),
        ("solo", ["solo"]),
    ],
)
def test_expands(text, expected):
    assert expand_hostlist(text) == expected


@pytest.mark.parametrize("text", [None, "", "(null)", "None", "None assigned", "  "])
def test_slurm_empty_node_lists(text):
    assert expand_hostlist(text) == []


@pytest.mark.parametrize(
    "text, message",
    [
        ("node[1-3", "unbalanced"),
        ("node]1", "unbalanced"),
        ("n[[1]]", "unbalanced"),
        ("node[a-b]", "bad range"),
        ("node[]", "bad range"),
        ("node[1-]", "bad range"),
        ("node[3-1]", "backwards"),
        ("node[1-2-3]", "bad range"),
        ("node[1" + "0" * 30 + "]", "bad range"),
        ("bad name", "not a node name"),
        ("-x[1-2]", "not a node name"),
    ],
)
def test_bad_input_is_a_clear_error(text, message):
    with pytest.raises(ValueError, match=message):
        expand_hostlist(text)


def test_skip_invalid_leaves_out_bad_names_but_not_bad_syntax():
    assert expand_hostlist("node1,-bad,x" + "y" * 70, skip_invalid=True) == ["node1"]
    with pytest.raises(ValueError, match="bad range"):
        expand_hostlist("node[x]", skip_invalid=True)


@pytest.mark.parametrize(
    "text",
    [
        f"n[1-{MAX_HOSTS + 1}]",
        f"a[1-{MAX_HOSTS // 2}],b[0-{MAX_HOSTS // 2}]",  # counted across items
        "a[1-1000]b[1-1000]",  # and multiplied across groups
        "n[0-999999999999999999]",
        ",".join(["n1"] * (MAX_HOSTS + 1)),
    ],
)
def test_size_cap_refuses_before_building(text):
    """Refused from the counts alone: memory follows the text, not the names it would expand to
    (a timer would flake on a loaded machine; 65,537 names built would take ~5 MB)."""
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=f"more than {MAX_HOSTS} names"):
            expand_hostlist(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100 * len(text) + 2_000_000, peak


def test_size_cap_is_a_parameter_and_inclusive():
    assert len(expand_hostlist("n[1-10]", limit=10)) == 10
    with pytest.raises(ValueError, match="more than 9 names"):
        expand_hostlist("n[1-10]", limit=9)
    assert len(expand_hostlist(f"n[1-{MAX_HOSTS}]")) == MAX_HOSTS


# ---- properties ------------------------------------------------------------------------------
_prefix = st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True)
_suffix = st.from_regex(r"(-[a-z]{1,4})?", fullmatch=True)


@st.composite
def _item(draw):
    """One hostlist item and the names it stands for: prefix[ranges]suffix, zero-padded."""
    prefix, suffix = draw(_prefix), draw(_suffix)
    width = draw(st.integers(1, 4))
    numbers = sorted(draw(st.sets(st.integers(0, 10**width - 1), min_size=1, max_size=30)))
    if draw(st.booleans()) and len(numbers) == 1 and width == 1:
        return f"{prefix}{numbers[0]}{suffix}", [f"{prefix}{numbers[0]}{suffix}"]
    return f"{prefix}[{_compress(numbers, width)}]{suffix}", [
        f"{prefix}{n:0{width}d}{suffix}" for n in numbers
    ]


def _compress(numbers, width):
    """Sorted ints -> Slurm range text: 1,2,3,5 -> 1-3,5 (each bound `width` digits)."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ",".join(
        f"{lo:0{width}d}" if lo == hi else f"{lo:0{width}d}-{hi:0{width}d}" for lo, hi in runs
    )


@given(st.lists(_item(), min_size=1, max_size=5))
def test_expand_inverts_compress(items):
    text = ",".join(t for t, _ in items)
    assert expand_hostlist(text) == [n for _, ns in items for n in ns]


@given(st.text(alphabet="ab19-_.[],0 \n", max_size=40), st.booleans())
def test_any_text_gives_valid_nodes_or_a_value_error(text, skip):
    try:
        out = expand_hostlist(text, limit=500, skip_invalid=skip)
    except ValueError:
        return
    assert len(out) <= 500
    assert all(valid_node(n) for n in out)


@pytest.mark.parametrize(
    ("raw", "end"),
    [
        (93 << 8, (93, 0)),  # 22.05's wait status
        (15, (0, 15)),  # ended by SIGTERM
        ({"set": True, "number": 1 << 8}, (1, 0)),  # 23.02
        ({"set": False, "number": 0}, (None, 0)),
        (
            {"return_code": {"set": True, "number": 0}, "signal": {"id": {"number": 9}}},
            (0, 9),
        ),  # 23.11 and later
        ({"return_code": {"set": True, "number": 2}, "signal": {"id": {"set": False}}}, (2, 0)),
        ("93:0", (93, 0)),  # sacct, scontrol
        ("0:15", (0, 15)),
        ("", (None, 0)),
        ("x:1", (None, 0)),
        (-1, (None, 0)),
        (None, (None, 0)),
        (True, (None, 0)),
    ],
)
def test_slurm_exit_reads_every_shape(raw, end):
    assert names.slurm_exit(raw) == end

"""`decode_column` (typed records, msgspec) reads every answer exactly as `column(decode(...))`
(orjson) does: the same label values, the same floats (NaN where NaN), the same error for an
answer that is not a vector. Fuzzed over damaged series, odd values and error answers."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clients.prometheus import PromError, column, decode, decode_column

LABEL = "gpukey"
VALUES = st.one_of(
    st.sampled_from(["0", "0.5", "-1e-3", "1e+06", "NaN", "+Inf", "-Inf", "Inf", "x", ""]),
    st.floats(allow_nan=False).map(repr),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(2**53), 2**53),
    st.none(),
)
METRICS = st.one_of(
    st.fixed_dictionaries({LABEL: st.text(max_size=12)}),
    st.fixed_dictionaries({"other": st.text(max_size=4)}),
    st.fixed_dictionaries({LABEL: st.one_of(st.integers(-9, 9), st.none(), st.lists(st.text()))}),
    st.none(),
)
SERIES = st.one_of(
    st.builds(lambda m, v: {"metric": m, "value": [1.8e9, v]}, METRICS, VALUES),
    st.builds(lambda m: {"metric": m, "value": [1.8e9]}, METRICS),
    st.builds(lambda m: {"metric": m}, METRICS),
    st.just("not a series"),
)
ANSWERS = st.one_of(
    st.builds(
        lambda r, t: {"status": "success", "data": {"resultType": t, "result": r}},
        st.lists(SERIES, max_size=6),
        st.sampled_from(["vector", "vector", "matrix", "scalar"]),
    ),
    st.just({"status": "error", "errorType": "bad_data", "error": "parse error"}),
    st.just({"status": "success", "data": {"resultType": "vector", "result": {}}}),
    st.just([]),
)


def _orjson_way(body: bytes, status: int):
    return column(decode(body, status, "u", "vector"), LABEL)


def _same(body: bytes, status: int = 200) -> None:
    try:
        want = _orjson_way(body, status)
    except PromError as exc:
        with pytest.raises(PromError) as got:
            decode_column(body, LABEL, status, "u")
        assert str(got.value) == str(exc)
        return
    keys, vals = decode_column(body, LABEL, status, "u")
    assert keys == want[0]
    assert vals.dtype == np.float64
    np.testing.assert_array_equal(vals, want[1])  # NaN equals NaN here


@settings(max_examples=400, deadline=None)
@given(ANSWERS, st.sampled_from([200, 200, 400, 503]))
def test_typed_decoding_reads_every_answer_as_the_orjson_path(doc, status):
    _same(orjson.dumps(doc), status)


@pytest.mark.parametrize(
    "body",
    [b"", b"not json", b'{"status":"success"}', b'{"status":"success","data":null}'],
)
def test_an_answer_that_is_not_one_reads_the_same_error(body):
    _same(body)


def test_the_typed_path_takes_the_usual_answer(monkeypatch):
    """Prometheus' own shape (quoted values, NaN, -Inf, other labels) decodes on the typed
    path: a typed path that always fell back would pass the equivalence test, so here the
    fallback is broken."""
    from clients import prometheus

    monkeypatch.setattr(prometheus, "decode", lambda *a: pytest.fail("fell back to orjson"))
    doc = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {"metric": {LABEL: "node1,,0,1,H200", "x": "y"}, "value": [1.8e9, "0.5"]},
                {"metric": {}, "value": [1.8e9, "NaN"]},
                {"metric": {LABEL: "b"}, "value": [1.8e9, "-Inf"]},
            ],
        },
    }
    keys, vals = decode_column(orjson.dumps(doc), LABEL)
    assert keys == ["node1,,0,1,H200", "", "b"]
    assert vals[0] == 0.5 and np.isnan(vals[1]) and vals[2] == -np.inf

"""`clients.prometheus` against the real Prometheus of the local stack (and, from
test_victoriametrics.py, against VictoriaMetrics): instant and range queries, a range longer
than the server's 11,000-point limit asked in parts, and the server's own error answers."""

from __future__ import annotations

import time
from unittest import mock

import pytest

from clients import prometheus
from clients.prometheus import PromClient, PromError, decode


def check_the_client(url: str, exact: bool = True) -> None:
    """What the callers rely on, against a real TSDB at `url`; `exact`: the range's points are
    exactly the grid (VictoriaMetrics aligns to the step and may drop the newest)."""
    with PromClient(url) as prom:
        assert prom.query("vector(1) + 1") == [({}, 2.0)]
        end = float(int(time.time()) - 120)
        [(labels, points)] = prom.query_range("vector(1)", end - 1500.0, end, 0.1)
        times = [t for t, _ in points]
        assert labels == {} and times == sorted(set(times)) and {v for _, v in points} == {1.0}
        if exact:
            assert len(times) == 15_001 and times[0] == end - 1500.0 and times[-1] == end
        else:
            assert len(times) >= 14_900 and end - 1500.2 <= times[0] < times[-1] <= end + 0.1
        with pytest.raises(PromError) as bad:
            prom.raw("up{")
        assert bad.value.status in (400, 422) and bad.value.url == f"{url}/api/v1/query"
        assert f"Prometheus at {url}/api/v1/query answered {bad.value.status}: " in str(bad.value)
        # the detector's columns: the server's answer takes the typed (msgspec) path
        with mock.patch.object(prometheus, "decode", side_effect=AssertionError("fell back")):
            keys, vals = prom.column('label_replace(vector(0.5), "k", "n1,,0", "", "")', "k")
        assert keys == ["n1,,0"] and vals.tolist() == [0.5]


def test_the_client_on_prometheus(prometheus_url):
    check_the_client(prometheus_url)
    with pytest.raises(PromError, match="expected a vector, got scalar"):  # VM answers a vector
        PromClient(prometheus_url).raw("time()")
    with pytest.raises(PromError, match="answered 404: 404 page not found"):
        PromClient(prometheus_url + "/no-such-prefix").raw("up")
    with pytest.raises(PromError) as bad:  # Prometheus' own words for a too long range
        status, body, url = PromClient(prometheus_url)._post(
            "/api/v1/query_range",
            {"query": "vector(1)", "start": "0", "end": "1200", "step": "0.1"},
        )
        decode(body, status, url, "matrix")
    assert bad.value.status == 400 and "11,000 points" in str(bad.value)

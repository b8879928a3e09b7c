"""Fuzz the webhook: thousands of malformed payloads, never a 5xx."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from recovery.app import create_app
from recovery.settings import Settings

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)
label_values = st.text(max_size=40) | st.sampled_from(
    ["node1", "12", "3", "../../etc", "node1; rm -rf /", "", "\x00", "0001-01-01T00:00:00Z"]
)
alert_like = st.fixed_dictionaries(
    {},
    optional={
        "status": st.sampled_from(["firing", "resolved", "bogus", 1]),
        "labels": st.dictionaries(
            st.sampled_from(["alertname", "job_id", "node", "gpu", "severity", "x y", ""]),
            label_values,
            max_size=5,
        )
        | json_values,
        "annotations": json_values,
        "startsAt": st.sampled_from(["2026-01-01T00:00:00Z", "2026-13-45T99:00:00Z", "", "now"])
        | json_values,
        "endsAt": json_values,
        "fingerprint": st.sampled_from(["abc", "ABC123", "zz", ""]) | json_values,
    },
)
payload_like = st.fixed_dictionaries(
    {},
    optional={
        "version": st.sampled_from(["4", "3", 4]),
        "status": st.sampled_from(["firing", "resolved", None]),
        "groupKey": json_values,
        "alerts": st.lists(alert_like, max_size=4) | json_values,
        "truncatedAlerts": json_values,
        "commonLabels": json_values,
    },
)


def _client(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    s = Settings(
        db_url=f"sqlite:///{d}/f.db", require_auth=False, slurm_enabled=False, settle_s=3600
    )
    return TestClient(create_app(s, start_worker=False), raise_server_exceptions=False)


def test_fuzz_structured_payloads_never_5xx(tmp_path_factory):
    client = _client(tmp_path_factory)

    @hsettings(
        max_examples=1500,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(payload_like)
    def run(doc):
        r = client.post("/api/v1/alerts", json=doc)
        assert r.status_code < 500, (doc, r.text)
        assert "Traceback" not in r.text

    run()


def test_fuzz_raw_bytes_never_5xx(tmp_path_factory):
    client = _client(tmp_path_factory)

    @hsettings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        st.binary(max_size=300)
        | st.text(max_size=300).map(str.encode)
        | json_values.map(lambda v: json.dumps(v).encode())
    )
    def run(body):
        r = client.post(
            "/api/v1/alerts", content=body, headers={"Content-Type": "application/json"}
        )
        assert r.status_code < 500, (body, r.text)

    run()

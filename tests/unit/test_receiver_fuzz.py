"""Fuzz the receiver: the webhook and every other route of the app, never a 5xx.

Strings include lone surrogates (JSON's `"\\ud800"`, percent-encoded in paths and queries),
integers include ones past 64 bits, Unicode digits and negatives. The CI run is a few hundred
examples per test; `GOODPUT_FUZZ_EXAMPLES=10000` sets every test's count (the nightly run).
The routes fuzzed are read from the app itself (and each must be hit), so a new route is
fuzzed as soon as it exists.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from recovery.app import create_app
from recovery.console import security
from recovery.policy import parse_policy
from recovery.scheduler.simulated import SimulatedScheduler
from recovery.settings import Settings
from tests.unit.actions_fakes import make_fake_sim
from tests.unit.test_console_pages import ConsoleSettings, add_incident

EXAMPLES = int(os.environ.get("GOODPUT_FUZZ_EXAMPLES", "0"))
SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


def examples(ci: int) -> int:
    return EXAMPLES or ci


# --- values ---------------------------------------------------------------------------------

surrogates = st.characters(categories=["Cs"])
texts = st.lists(st.characters() | surrogates, max_size=30).map("".join)
big_ints = st.integers() | st.sampled_from(
    [0, -1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64, 10**23, -(2**63) - 1, 10**400]
)
id_like = (
    big_ints.map(str)
    | texts
    | st.sampled_from(
        ["1", "inc-1", "inc-2", "node1", "gpu-node-01.rack.a", "²", "١٢", "0x1f", "1e400", "nan"]
        + ["..", "%2F", "approve", "reject", "console.css", "../app.py", " 1", "-0"]
        + ["\x00", "a\x00b", "x" * 65, "pending_approval", "paused"]  # PostgreSQL: no NUL
    )
)
json_values = st.recursive(
    st.none() | st.booleans() | big_ints | st.floats(allow_nan=False, allow_infinity=False) | texts,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(texts, children, max_size=4),
    max_leaves=20,
)
label_values = texts | st.sampled_from(
    ["node1", "12", "3", "../../etc", "node1; rm -rf /", "", "\x00", "\ud800", "a\udfffb"]
)
alert_like = st.fixed_dictionaries(
    {},
    optional={
        "status": st.sampled_from(["firing", "resolved", "bogus", 1]),
        "labels": st.dictionaries(
            st.sampled_from(
                ["alertname", "job_id", "node", "gpu", "severity", "x y", "", "\ud800"]
            ),
            label_values,
            max_size=5,
        )
        | json_values,
        "annotations": json_values,
        "startsAt": st.sampled_from(
            ["2026-01-01T00:00:00Z", "2026-13-45T99:00:00Z", "", "now", "0001-01-01T00:00:00Z"]
            + ["9999-12-31T23:59:59Z", "2026-01-01T00:00:00+99:00"]
        )
        | json_values,
        "endsAt": st.sampled_from(["0001-01-01T00:00:00Z", "2026-01-01T00:01:00Z"]) | json_values,
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
        "truncatedAlerts": big_ints | json_values,
        "commonLabels": json_values,
        "commonAnnotations": st.dictionaries(texts, label_values, max_size=3),
    },
)
# well-formed but for the odd value, so that fuzzing reaches storage and the read-back
label_names = st.sampled_from(["job_id", "node", "gpu", "severity", "rack", "summary"])
good_alert = st.fixed_dictionaries(
    {
        "status": st.sampled_from(["firing", "resolved"]),
        "labels": st.fixed_dictionaries(
            {"alertname": label_values | st.just("GoodputGPUFatalXid")},
            optional={
                "job_id": st.sampled_from(["7", "8", "12_3", "x"]),
                "node": st.sampled_from(["node1", "gpu-node-01.rack.a", "-x"]),
                "severity": label_values,
                "rack": label_values,
            },
        ),
        "annotations": st.dictionaries(label_names, label_values, max_size=3),
        "startsAt": st.sampled_from(["2026-01-01T00:00:00Z", "2026-01-01T00:00:00.5+02:00"]),
        "fingerprint": st.sampled_from(["a1", "b2", "c3"]),
    },
    optional={"endsAt": st.sampled_from(["0001-01-01T00:00:00Z", "2026-01-01T00:01:00Z"])},
)
good_payload = st.fixed_dictionaries(
    {
        "version": st.just("4"),
        "status": st.sampled_from(["firing", "resolved"]),
        "alerts": st.lists(good_alert, min_size=1, max_size=3),
    },
    optional={
        "truncatedAlerts": big_ints,
        "commonLabels": st.dictionaries(label_names, label_values, max_size=2),
        "groupKey": texts,
    },
)
payload_like = payload_like | good_payload
verdict_like = (
    st.fixed_dictionaries({}, optional={"who": texts | json_values, "comment": texts | json_values})
    | json_values
)

# --- requests -------------------------------------------------------------------------------

TOKEN = "fuzz-token"
CSRF = "c" * 32
PARAMS = (
    "state job_id limit offset type incident_id since until cursor action_id outcome node "
    "job page fragment incident next done name token csrf_token reason paused"
).split()


def _pct(text: str) -> str:
    """Percent-encode any str, lone surrogates included (as their would-be UTF-8 bytes)."""
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


def _routes(routes: list[Any]) -> set[tuple[str, str]]:
    """(method, path template) of every route, through included routers."""
    out: set[tuple[str, str]] = set()
    for r in routes:
        if hasattr(r, "original_router"):  # FastAPI's lazily included router
            out |= _routes(r.original_router.routes)
        else:
            out |= {(m, r.path) for m in r.methods or () if m != "HEAD"}
    return out


@st.composite
def requests_for(draw: Any, route: tuple[str, str]) -> dict[str, Any]:
    method, template = route
    path = re.sub(r"\{[^}]+\}", lambda _m: _pct(draw(id_like)), template)
    query = draw(
        st.dictionaries(st.sampled_from(PARAMS) | texts, id_like | texts | big_ints.map(str))
    )
    if query:
        path += "?" + "&".join(f"{_pct(str(k))}={_pct(str(v))}" for k, v in query.items())
    headers: dict[str, str] = {
        "Authorization": draw(
            st.sampled_from(
                [f"Bearer {TOKEN}"] * 6 + ["Bearer nope", "Basic !!", "Basic Zm9vOmJhcg==", ""]
            )
        ),
        "Origin": draw(st.sampled_from(["http://testserver", "http://evil", ""])),
    }
    body: bytes = b""
    if method == "POST":
        if template.startswith("/console"):
            form = draw(
                st.dictionaries(st.sampled_from(PARAMS), texts | st.sampled_from(["on", "off"]))
            )
            form.setdefault("csrf_token", CSRF)
            kind = draw(st.sampled_from(["form", "form", "json", "bytes"]))
        else:
            form = {}
            kind = draw(st.sampled_from(["json", "json", "json", "bytes"]))
        shape = payload_like if template == "/api/v1/alerts" else verdict_like
        if kind == "form":
            body = "&".join(f"{_pct(k)}={_pct(v)}" for k, v in form.items()).encode()
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        elif kind == "json":
            body = json.dumps(draw(shape | json_values)).encode()
            headers["Content-Type"] = "application/json"
        else:
            body = draw(st.binary(max_size=200))
        headers["Content-Type"] = draw(
            st.sampled_from(
                [headers.get("Content-Type", "application/json")] * 4
                + ["text/json", "multipart/form-data; boundary=x", "application/json; charset=x"]
            )
        )
    return {"method": method, "url": path, "content": body, "headers": headers}


# --- the app under fuzz ----------------------------------------------------------------------


def fuzz_app(db_url: str, d: Path) -> Any:
    """The whole receiver on `db_url` (auth on, console, actions in approve mode on a fake
    scheduler), with two incidents and a pending action so that ids can hit real rows."""
    (d / "token").write_text(TOKEN)
    sim, _st, _submit = make_fake_sim()
    settings = ConsoleSettings(
        db_url=db_url,
        token_file=str(d / "token"),
        slurm_enabled=False,
        settle_s=3600,
        log_dir=str(d),
        policy=parse_policy({"mode": "approve"}, env={}),
        scheduler_adapter=SimulatedScheduler("http://testserver", session=sim),
    )
    os.environ["GOODPUT_ACTIONS_THREAD"] = "0"
    app = create_app(settings, start_worker=False)
    add_incident(app, "7", "node1", "f1")
    add_incident(app, "8", "gpu-node-01.rack.a", "f2")
    return app


@pytest.fixture(scope="module")
def full_app(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz-all")
    return fuzz_app(f"sqlite:///{d}/all.db", d)


def _fuzz_route(client: TestClient, route: tuple[str, str], n: int, seen: Counter[int]) -> None:
    @hsettings(max_examples=n, deadline=None, suppress_health_check=SLOW)
    @given(requests_for(route))
    def run(req):
        r = client.request(follow_redirects=False, **req)
        seen[r.status_code] += 1
        assert r.status_code < 500, (route, req, r.text[:500])
        assert "Traceback" not in r.text

    run()


def test_fuzz_every_route_never_5xx(full_app):
    routes = sorted(_routes(full_app.routes))
    assert ("POST", "/api/v1/alerts") in routes and ("GET", "/console/audit") in routes
    client = TestClient(full_app, raise_server_exceptions=False)
    client.cookies.set(security.CSRF_COOKIE, CSRF)
    statuses: Counter[int] = Counter()
    for route in routes:
        _fuzz_route(client, route, max(10, examples(800) // len(routes)), statuses)
    print(f"\n{len(routes)} routes, {sum(statuses.values())} requests: {sorted(statuses.items())}")


# --- the webhook, deeper ----------------------------------------------------------------------


def _client(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    s = Settings(
        db_url=f"sqlite:///{d}/f.db", require_auth=False, slurm_enabled=False, settle_s=3600
    )
    return TestClient(create_app(s, start_worker=False), raise_server_exceptions=False)


def test_fuzz_structured_payloads_never_5xx(tmp_path_factory):
    client = _client(tmp_path_factory)

    @hsettings(max_examples=examples(600), deadline=None, suppress_health_check=SLOW)
    @given(payload_like)
    def run(doc):
        r = client.post(
            "/api/v1/alerts", content=json.dumps(doc), headers={"Content-Type": "application/json"}
        )
        assert r.status_code < 500, (doc, r.text)
        assert "Traceback" not in r.text
        if r.status_code == 200:  # what was stored reads back
            for inc in r.json()["incidents"]:
                assert client.get(f"/api/v1/incidents/{inc}").status_code == 200
                assert client.get(f"/console/incidents/{inc}").status_code < 500

    run()


def test_fuzz_raw_bytes_never_5xx(tmp_path_factory):
    client = _client(tmp_path_factory)

    @hsettings(max_examples=examples(300), deadline=None, suppress_health_check=SLOW)
    @given(
        st.binary(max_size=300)
        | texts.map(lambda t: t.encode("utf-8", "surrogatepass"))
        | json_values.map(lambda v: json.dumps(v).encode())
    )
    def run(body):
        r = client.post(
            "/api/v1/alerts", content=body, headers={"Content-Type": "application/json"}
        )
        assert r.status_code < 500, (body, r.text)

    run()

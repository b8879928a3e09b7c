"""Every route on the real PostgreSQL: never a 5xx.

PostgreSQL refuses what SQLite keeps (a NUL in text, a string past its column's length, an
integer past 32 bits), so a 5xx can hide from the SQLite fuzz; one did (a `%00` in a filter).
First a sweep: each of those values in every path id, every query parameter and every field
of a decision or form, on every route; then the unit run's fuzz, fewer examples."""

from __future__ import annotations

import re
from collections import Counter

from fastapi.testclient import TestClient

from recovery.console import security
from tests.integration.test_receiver_postgres import pg_url  # noqa: F401 - the fixture
from tests.unit.test_receiver_fuzz import (
    CSRF,
    PARAMS,
    TOKEN,
    _fuzz_route,
    _pct,
    _routes,
    examples,
    fuzz_app,
)

HOSTILE = ["a\x00b", "x" * 300, str(2**31), "-1"]  # what PostgreSQL refuses, SQLite keeps


def test_fuzz_every_route_never_5xx_on_postgres(pg_url, tmp_path) -> None:  # noqa: F811
    app = fuzz_app(pg_url, tmp_path)
    routes = sorted(_routes(app.routes))
    client = TestClient(app, raise_server_exceptions=False)
    client.cookies.set(security.CSRF_COOKIE, CSRF)
    auth = {"Authorization": f"Bearer {TOKEN}", "Origin": "http://testserver"}
    for method, template in routes:
        for value in HOSTILE:
            path = re.sub(r"\{[^}]+\}", _pct(value), template)
            fields = {p: value for p in PARAMS} | {"csrf_token": CSRF}
            if method == "GET":
                for p in PARAMS:
                    r = client.get(f"{path}?{p}={_pct(value)}", headers=auth)
                    assert r.status_code < 500, (method, path, p, r.text[:300])
            elif template.startswith("/console"):
                r = client.post(path, data=fields, headers=auth)
                assert r.status_code < 500, (method, path, r.text[:300])
            else:
                body = {"who": value, "comment": value} if "alerts" not in template else {}
                r = client.post(path, json=body, headers=auth)
                assert r.status_code < 500, (method, path, r.text[:300])
    statuses: Counter[int] = Counter()
    for route in routes:
        _fuzz_route(client, route, max(8, examples(400) // len(routes)), statuses)
    assert statuses and max(statuses) < 500, statuses

"""The console's Goodput & nodes page: node history from the store, ETTR from Prometheus."""

from __future__ import annotations

import dataclasses
import re
import socket

from tests.unit.test_console_pages import TOKEN, _no_thread, add_incident, env  # noqa: F401

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_node_history_and_an_unconfigured_prometheus(env):  # noqa: F811
    client, app, _st, submit = env
    submit("42", node="node2")
    submit("43", node="node3")
    add_incident(app, "42", "node2", "a", plan=False)
    add_incident(app, "43", "node4", "b", plan=False)
    submit("44", node="node3")
    add_incident(app, "44", "node3", "c", diag_over={"outcome": "workload_crash"}, plan=False)
    page = client.get("/console/nodes", headers=AUTH)
    assert page.status_code == 200
    section = page.text.split('id="node-history"')[1]
    rows = re.findall(r"<tr><td>(node\d)</td><td>(\d+)</td>", section)
    assert rows == [("node2", "1"), ("node4", "1")]  # a workload's own crash is not the node's
    assert "Prometheus is not configured" in page.text
    assert 'href="/console/nodes" aria-current="page"' in page.text


def test_prometheus_that_does_not_answer_is_said_not_raised(env):  # noqa: F811
    client, app, *_ = env
    url = f"http://127.0.0.1:{_dead_port()}"
    app.state.settings = dataclasses.replace(app.state.settings, prometheus_url=url)
    page = client.get("/console/nodes", headers=AUTH)
    assert page.status_code == 200 and "Prometheus did not answer (PromError" in page.text


def test_the_page_needs_a_login(env):  # noqa: F811
    client, *_ = env
    r = client.get("/console/nodes", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/console/login?next=")

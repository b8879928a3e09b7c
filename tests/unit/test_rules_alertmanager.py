"""alertmanager.yml: amtool accepts it, the routing tree sends example alerts where they belong,
inhibition names real alerts, and no secret is inline."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from alertdsl import spec as A

AM = Path(__file__).resolve().parents[2] / "alertmanager"
CONFIG = AM / "alertmanager.yml"
DOC = yaml.safe_load(CONFIG.read_text())


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    path = shutil.which("amtool")
    if not path:
        pytest.skip("amtool not installed (Debian package 'prometheus-alertmanager')")
    return subprocess.run(
        [path, *args], cwd=AM, capture_output=True, text=True, timeout=30, check=False
    )


def route(labels: dict[str, str]) -> list[str]:
    out = amtool(
        "config", "routes", "test", "--config.file=alertmanager.yml",
        *(f"{k}={v}" for k, v in labels.items()),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(",")


def test_amtool_check_config_is_clean():
    out = amtool("check-config", "alertmanager.yml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout and "1 templates" in out.stdout


@pytest.mark.parametrize(
    ("labels", "receivers"),
    [
        ({"alertname": "GoodputGPUFatalXid", "severity": "critical", "scope": "gpu",
          "node": "node2", "job_id": "42"}, ["oncall", "goodput-recovery"]),
        ({"alertname": "GoodputNodeLost", "severity": "critical", "scope": "node",
          "node": "node3"}, ["oncall", "goodput-recovery"]),
        ({"alertname": "GoodputJobHung", "severity": "warning", "scope": "job",
          "job_id": "42"}, ["goodput-recovery"]),
        ({"alertname": "GoodputDetectorDown", "severity": "warning", "scope": "service"},
         ["oncall", "goodput-recovery"]),
        ({"alertname": "AnyTest", "goodput_test": "true", "severity": "critical"},
         ["test-sink"]),
        ({"alertname": "GoodputGPUFatalXid", "severity": "critical", "goodput_test": "true"},
         ["test-sink"]),
        ({"alertname": "SomeoneElsesAlert", "severity": "critical"}, ["goodput-recovery"]),
        # the receiver's own notices (warning, no scope) went to the receiver, which drops them
        ({"alertname": "GoodputActionPendingApproval", "severity": "warning", "job_id": "42",
          "goodput_notification": "true"}, ["oncall"]),
        ({"alertname": "GoodputReceiverNotActing", "severity": "warning",
          "goodput_notification": "true"}, ["oncall"]),
    ],
)  # fmt: skip
def test_routing_tree_sends_examples_where_they_belong(labels, receivers):
    assert route(labels) == receivers


def test_every_goodput_alert_reaches_the_receiver_and_critical_and_service_ones_page():
    for a in A.load().alerts:
        got = route({"alertname": a.name, "severity": a.severity, "scope": a.scope})
        assert "goodput-recovery" in got, a.name
        assert ("oncall" in got) == (a.severity == "critical" or a.scope == "service"), a.name


def test_grouping_by_job_and_by_node():
    routes = DOC["route"]["routes"]
    by_scope = {tuple(r.get("matchers", [])): r for r in routes}
    job = by_scope[('alertname=~"Goodput.+"', 'scope="job"')]
    node = by_scope[('alertname=~"Goodput.+"', 'scope=~"gpu|node"')]
    assert job["group_by"] == ["job_id"] and node["group_by"] == ["node"]
    assert DOC["route"]["group_wait"] == "1s"
    paging = next(r for r in routes if r["receiver"] == "oncall" and "continue" in r)
    assert paging["continue"] is True


def test_receiver_webhook_and_test_sink_are_kept():
    recv = {r["name"]: r for r in DOC["receivers"]}
    hook = recv["goodput-recovery"]["webhook_configs"][0]
    assert hook["url"] == "http://127.0.0.1:19430/api/v1/alerts"
    assert hook["http_config"]["authorization"]["credentials_file"] == "secrets/receiver-token"
    assert recv["test-sink"]["webhook_configs"][0]["url"] == "http://127.0.0.1:19440/alerts"
    assert DOC["route"]["routes"][0] == {
        "receiver": "test-sink",
        "matchers": ['goodput_test="true"'],
    }


def test_no_inline_secrets():
    text = CONFIG.read_text()
    for key in ("api_url", "routing_key", "service_key", "auth_password", "credentials",
                "smtp_auth_password", "bearer_token", "password"):  # fmt: skip
        assert not re.search(rf"^\s*{key}\s*:", text, re.M), f"inline {key}: use {key}_file"


def test_inhibition_names_real_alerts_and_keys_on_job_id():
    names = {a.name for a in A.load().alerts}
    rules = DOC["inhibit_rules"]
    for rule in rules:
        for m in rule["source_matchers"] + rule["target_matchers"]:
            if m.startswith("alertname"):
                value = m.split("=", 1)[1].lstrip("~").strip('"')
                assert set(value.split("|")) <= names, m
    hardware = rules[0]
    assert hardware["equal"] == ["job_id"]
    assert 'job_id=~".+"' in hardware["target_matchers"]
    scopes = {a.name: a.scope for a in A.load().alerts}
    targets = hardware["target_matchers"][0].split("=~", 1)[1].strip('"').split("|")
    assert all(scopes[t] in ("job", "gpu") for t in targets)


def test_templates_define_the_diagnosis_link():
    text = (AM / "templates" / "goodput.tmpl").read_text()
    assert "/incidents" in text and "job_id=" in text
    out = amtool(
        "template", "render", "--template.glob=templates/*.tmpl",
        '--template.text={{ template "goodput.diagnosis_url" . }}',
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith("http://127.0.0.1:19430/incidents")

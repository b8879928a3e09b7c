"""The Recovery Console in headless Chromium against a live receiver holding real incidents.

Two scenarios are recorded by the simulator (XID 79 on node2; a CUDA OOM), their logs become
the receiver's log directory, Alertmanager-shaped alerts are posted to the webhook, and the
receiver's own worker diagnoses them and plans actions (approve mode, simulated scheduler).
The browser logs in, loads every page, approves one action, rejects the other, and checks
what the scheduler and the audit log then show. Screenshots go to test-output/console/.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import requests

from recovery import outbox
from recovery.app import create_app
from recovery.policy import parse_policy
from recovery.scheduler.simulated import SimulatedScheduler
from recovery.settings import Settings
from tests.conftest import wait_until
from tests.unit.actions_fakes import make_fake_sim

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("GOODPUT_CHROMIUM", "/usr/bin/chromium")
SHOTS = ROOT / "test-output" / "console"
TOKEN = "browser-test-token"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


# Only the log files answer here (no Prometheus, no Slurm evidence), so diagnoses are about
# 0.65 sure; the operator's policy in this test acts from 0.6.
POLICY = parse_policy(
    {
        "mode": "approve",
        "min_confidence": {"drain": 0.6, "drain_and_requeue": 0.6, "requeue": 0.6, "stop": 0.6},
    },
    env={},
)


@dataclasses.dataclass(frozen=True)
class BrowserSettings(Settings):
    policy: Any = None
    scheduler_adapter: Any = None
    alertmanager_url: Any = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _record(scenario: str, out: Path) -> Path:
    goodput = Path(sys.executable).with_name("goodput")
    subprocess.run(
        [str(goodput), "sim", "record", str(ROOT / "scenarios" / scenario), "--out", str(out)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


def _alert(name: str, labels: dict[str, str], starts: str, fp: str, summary: str) -> dict:
    return {
        "status": "firing",
        "labels": {"alertname": name, "severity": "critical", **labels},
        "annotations": {
            "summary": summary,
            "description": summary,
            "runbook_url": "https://example.invalid/runbook",
        },
        "startsAt": starts,
        "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": fp,
    }


@pytest.fixture
def receiver(tmp_path, monkeypatch):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    monkeypatch.setenv("GOODPUT_ACTIONS_THREAD", "0")
    xid = _record("xid79-off-bus.yaml", tmp_path / "rec-xid")
    oom = _record("cuda-oom.yaml", tmp_path / "rec-oom")
    logs = tmp_path / "logs"
    shutil.copytree(xid / "logs", logs)
    # the OOM recording's job 1001 becomes job 2001, so the two jobs share one log directory
    text = (oom / "logs" / "jobs" / "slurm-1001.out").read_text()
    (logs / "jobs" / "slurm-2001.out").write_text(text.replace("1001", "2001"))
    sim, st, submit = make_fake_sim()
    submit("1001", node="node2")
    submit("2001", node="node1")
    for job in ("1001", "2001"):  # the jobs started when the recordings did (before the fault)
        st["jobs"][job]["start_time"] = 1735689600.0
    (tmp_path / "token").write_text(TOKEN)
    settings = BrowserSettings(
        db_url=f"sqlite:///{tmp_path / 'receiver.db'}",
        token_file=str(tmp_path / "token"),
        slurm_enabled=False,
        prometheus_url=None,
        log_dir=str(logs),
        settle_s=0.3,
        worker_poll_s=0.2,
        policy=POLICY,
        scheduler_adapter=SimulatedScheduler("http://testserver", session=sim),
    )
    import uvicorn

    app = create_app(settings)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, timeout=20, what="the receiver to start")
    base = f"http://127.0.0.1:{port}"
    payload = {
        "version": "4",
        "status": "firing",
        "receiver": "goodput",
        "groupKey": "{}:{}",
        "alerts": [
            _alert(
                "GoodputGPUFatalXid",
                {"job_id": "1001", "node": "node2", "gpu": "3"},
                "2025-01-01T00:07:05Z",
                "a1001",
                "GPU 3 on node2: XID 79",
            ),
            _alert(
                "GoodputJobLogFault",
                {"job_id": "2001", "node": "node1", "pattern": "cuda_oom"},
                "2025-01-01T00:07:10Z",
                "b2001",
                "CUDA out of memory in job 2001",
            ),
        ],
    }
    r = requests.post(
        f"{base}/api/v1/alerts",
        json=payload,
        timeout=10,
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert r.status_code == 200, r.text
    engine = app.state.engine

    def planned() -> list:
        return outbox.list_actions(engine, state="pending_approval") if _has_actions(engine) else []

    wait_until(lambda: len(planned()) == 2, timeout=30, what="two actions pending approval")
    yield base, engine, st
    server.should_exit = True
    thread.join(10)


def _has_actions(engine) -> bool:
    from sqlalchemy import inspect

    return inspect(engine).has_table("goodput_actions")


def test_console_end_to_end(receiver):
    from playwright.sync_api import expect, sync_playwright

    base, engine, st = receiver
    SHOTS.mkdir(parents=True, exist_ok=True)
    pending = {a["job_id"]: a for a in outbox.list_actions(engine, state="pending_approval")}
    xid_action, oom_action = pending["1001"], pending["2001"]
    assert xid_action["kind"] == "drain_and_requeue", xid_action
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        # reading needs a login: the console sends us to the form
        page.goto(f"{base}/console/incidents")
        expect(page).to_have_url(f"{base}/console/login?next=%2Fconsole%2Fincidents")
        page.fill("input[name=name]", "Dana Oncall")
        page.fill("input[name=token]", TOKEN)
        page.click("form.login button[type=submit]")
        expect(page).to_have_url(f"{base}/console/incidents")
        expect(page.locator("#incident-rows tr")).to_have_count(2)
        expect(page.locator("#incident-rows")).to_contain_text("gpu_hardware_fault")
        expect(page.locator("#incident-rows")).to_contain_text("node2")
        # live refresh: the rows are fetched again by the page's script
        expect(page.locator("#live")).to_contain_text("live ·", timeout=12000)
        page.screenshot(path=str(SHOTS / "incidents.png"))
        # filters
        page.select_option("select[name=outcome]", "gpu_hardware_fault")
        page.click("#filters button[type=submit]")
        expect(page.locator("#incident-rows tr")).to_have_count(1)
        # incident detail: what broke, where, how sure, what Goodput wants to do
        page.click("#incident-rows a[href^='/console/incidents/']")
        summary = page.locator("#summary")
        expect(summary).to_contain_text("A GPU failed in hardware")
        expect(summary).to_contain_text("node2")
        expect(summary).to_contain_text("drain_and_requeue")
        expect(summary).to_contain_text("pending_approval")
        expect(page.locator("#evidence")).to_contain_text("node2.log")
        expect(page.locator("#evidence")).to_contain_text("fallen off the bus")
        expect(page.locator("#timeline")).to_contain_text("initiating")
        page.screenshot(path=str(SHOTS / "incident.png"), full_page=True)
        # approvals: approve the drain, reject the stop
        page.goto(f"{base}/console/approvals")
        expect(page.locator("article.approval")).to_have_count(2)
        expect(page.locator("section.mode")).to_contain_text("approve")
        page.screenshot(path=str(SHOTS / "approvals.png"), full_page=True)
        card = page.locator(f"#action-{xid_action['id']}")
        card.locator("form[action$='/approve'] input[name=reason]").fill("XID 79: drain it")
        card.locator("button.approve").click()
        expect(page.locator(".notice").first).to_contain_text("approved")
        card = page.locator(f"#action-{oom_action['id']}")
        card.locator("form[action$='/reject'] input[name=reason]").fill("owner fixes batch size")
        card.locator("button.reject").click()
        expect(page.locator(".notice").first).to_contain_text("rejected")
        expect(page.locator("article.approval")).to_have_count(0)
        # audit: both decisions with who and why, and the chain verifies
        page.goto(f"{base}/console/audit")
        expect(page.locator("#chain")).to_contain_text("verifies")
        table = page.locator("table.audit")
        expect(table).to_contain_text("Dana Oncall (console)")
        expect(table).to_contain_text("owner fixes batch size")
        expect(table).to_contain_text("executed")
        page.select_option("select[name=type]", "rejected")
        page.click("form.filters button[type=submit]")
        expect(page.locator("table.audit tbody tr")).to_have_count(1)
        page.goto(f"{base}/console/audit")
        page.screenshot(path=str(SHOTS / "audit.png"), full_page=True)
        page.goto(f"{base}/console/policy")
        expect(page.locator("#sources")).to_contain_text("logs")
        expect(page.locator("#modes")).to_contain_text("approve")
        expect(page.locator("#budget")).to_contain_text("Drains in the last hour: 1")
        page.screenshot(path=str(SHOTS / "policy.png"), full_page=True)
        # goodput and nodes: node2's XID is in its history; ETTR needs Prometheus (none here)
        page.click("nav a[href='/console/nodes']")
        expect(page.locator("#node-history tbody tr")).to_have_count(1)
        expect(page.locator("#node-history")).to_contain_text("node2")
        expect(page.locator("#ettr-note")).to_contain_text("Prometheus is not configured")
        page.screenshot(path=str(SHOTS / "nodes.png"), full_page=True)
        # the executed action shows on the incident page
        page.goto(f"{base}/console/incidents/{xid_action['incident_id']}")
        expect(page.locator("#action-state")).to_have_text("executed")
        browser.close()
    assert not errors, errors
    # what the scheduler shows: node2 drained by Goodput, job 1001 restarted without it,
    # job 2001 untouched
    assert st["nodes"]["node2"]["reason"].startswith("goodput:")
    assert st["jobs"]["1001"]["excluded"] == ["node2"] and st["jobs"]["1001"]["restarts"] == 1
    assert st["jobs"]["2001"]["restarts"] == 0 and not st["jobs"]["2001"]["held"]
    assert outbox.get_action(engine, oom_action["id"])["state"] == "rejected"
    assert outbox.get_action(engine, xid_action["id"])["decided_by"] == "Dana Oncall (console)"

"""Receivers in HA on the real stack: two receiver processes (`goodput receiver serve`) on one
PostgreSQL schema, real Slurm jobs, real Alertmanagers (private instances on free ports, not
clustered, so every delivery really is duplicated) listing both receivers as webhook targets.

1. An Alertmanager pair, each sending to both receivers: the fault's alert reaches the store
   four times; one incident, one diagnosis, one action executed once, one Slurm requeue.
2. One Alertmanager, receiver A dies by SIGKILL (`GOODPUT_TEST_CRASH_AT=executed`: Slurm has
   requeued the job, the outcome is not recorded) while B runs: B takes the action over when
   A's lease expires and finishes it; still one diagnosis, one `executed`, one requeue.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from sqlalchemy import func, select

from recovery import audit, outbox
from recovery.store import diagnoses, incidents, payloads
from tests.chaos.harness import ROOT, Chaos, _free_port, pg_schema
from tests.conftest import wait_until
from tests.helpers import terminate

pytestmark = pytest.mark.timeout(600)
LEASE_S = 3.0


class Receiver:
    def __init__(self, c: Chaos, name: str, poll_s: float, crash_at: str | None = None) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(c.env, GOODPUT_RECEIVER_LEASE_S=str(LEASE_S))
        env["GOODPUT_RECEIVER_WORKER_POLL_S"] = str(poll_s)
        if crash_at:
            env["GOODPUT_TEST_CRASH_AT"] = crash_at
        self.log = c.tmp / f"receiver-{name}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-c",
             f"from goodput.commands.receiver import serve; serve(None, {self.port}, None)"],
            env=env, stdout=self.log.open("ab"), stderr=subprocess.STDOUT, cwd=str(ROOT),
        )  # fmt: skip
        wait_until(self._up, 60, what=f"receiver {name} serving ({self.log})")

    def _up(self) -> bool:
        try:
            return requests.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def stop(self) -> None:
        terminate(self.proc)


def alertmanager(tmp: Path, name: str, hooks: list[str], token_file: str) -> tuple[str, Any]:
    """A private Alertmanager sending every alert to each of `hooks` (both receivers)."""
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if not binary:
        pytest.skip("Alertmanager not installed (Debian package prometheus-alertmanager)")
    d = tmp / name
    d.mkdir()
    auth = {"authorization": {"type": "Bearer", "credentials_file": token_file}}
    cfg = {
        "route": {"receiver": "goodput-recovery", "group_by": ["job_id"], "group_wait": "1s",
                  "group_interval": "5s", "repeat_interval": "1h"},
        "receivers": [{"name": "goodput-recovery", "webhook_configs": [
            {"url": f"{h}/api/v1/alerts", "send_resolved": True, "http_config": auth}
            for h in hooks]}],
    }  # fmt: skip
    (d / "alertmanager.yml").write_text(yaml.safe_dump(cfg))
    port = _free_port()
    proc = subprocess.Popen(
        [binary, f"--config.file={d / 'alertmanager.yml'}", f"--storage.path={d / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        stdout=subprocess.DEVNULL, stderr=(d / "am.log").open("w"), cwd=d,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return requests.get(f"{url}/-/ready", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    wait_until(ready, 30, what=f"Alertmanager {name} ready")
    return url, proc


@pytest.fixture
def ha(local_stack, tmp_path):
    url, drop = pg_schema(local_stack["GOODPUT_TEST_POSTGRES_URL"])
    c = Chaos(local_stack, url, tmp_path, seed=18)
    procs: list[Any] = []
    yield c, procs
    for p in procs:
        p.stop() if isinstance(p, Receiver) else (p.terminate(), p.wait(10))
    c.cleanup()
    drop()


def _fault_alert(c: Chaos, job: str, ams: list[str]) -> None:
    """The job's log shows a CUDA crash; its alert goes to each Alertmanager (as Prometheus
    sends every alert to every Alertmanager of an HA pair)."""
    c.states = {j: c.sched.job_state(j) for j in c.jobs}
    c.fault(job, "crash")
    alert = [{"labels": {"alertname": "GoodputJobLogFault", "job_id": job, "scope": "job",
                         "severity": "warning"},
              "annotations": {"summary": f"HA test crash on job {job}"},
              "startsAt": datetime.now(UTC).isoformat()}]  # fmt: skip
    for am in ams:
        r = requests.post(f"{am}/api/v2/alerts", json=alert, timeout=5)
        assert r.status_code == 200, r.text


def _ledger(c: Chaos, job: str) -> dict[str, Any]:
    """What the store and Slurm say about the job's incidents."""
    with c.engine.connect() as conn:
        incs = conn.execute(select(incidents.c.id).where(incidents.c.job_id == job)).scalars()
        incs = list(incs)
        n_diag = conn.execute(
            select(func.count()).select_from(diagnoses).where(diagnoses.c.incident_id.in_(incs))
        ).scalar_one()
        t = outbox.actions_table
        acts = conn.execute(select(t).where(t.c.job_id == job)).all()
        delivered = conn.execute(
            select(func.sum(payloads.c.deliveries)).where(payloads.c.body.contains(f'"{job}"'))
        ).scalar()
    events: Counter[str] = Counter()
    for a in acts:
        events.update(e["type"] for e in audit.query(c.engine, action_id=a.id, limit=1000)[0])
    s = c.sched.job_state(job)
    return {
        "incidents": len(incs),
        "diagnoses": int(n_diag),
        "actions": [(a.kind, a.state) for a in acts],
        "rows": acts,
        "events": events,
        "restarts": s.restarts if s else None,
        "delivered": int(delivered or 0),
    }


def _done(c: Chaos, job: str) -> bool:
    acts = _ledger(c, job)["actions"]
    return bool(acts) and all(state == "executed" for _, state in acts)


def _once(led: dict[str, Any]) -> None:
    assert led["incidents"] == 1, led
    assert led["diagnoses"] == 1, led
    assert led["actions"] == [("requeue", "executed")], led
    assert led["events"]["executed"] == 1 and led["events"]["planned"] == 1, led
    assert led["restarts"] == 1, f"Slurm restarted the job {led['restarts']} times: {led}"


def test_two_receivers_one_store_each_action_once_and_a_killed_ones_work_finished(ha):
    c, procs = ha
    c.submit(4)
    token = c.env["GOODPUT_RECEIVER_TOKEN_FILE"]

    # 1. an Alertmanager pair, both receivers in each: four deliveries of each alert
    a = Receiver(c, "a", poll_s=0.2)
    b = Receiver(c, "b", poll_s=0.2)
    procs += [a, b]
    am1, p1 = alertmanager(c.tmp, "am1", [a.url, b.url], token)
    am2, p2 = alertmanager(c.tmp, "am2", [a.url, b.url], token)
    procs += [p1, p2]
    job = c.jobs[0]
    _fault_alert(c, job, [am1, am2])
    wait_until(lambda: _done(c, job), 90, what=f"job {job}'s action executed")
    time.sleep(2 * LEASE_S)  # anything late (a second diagnosis, a takeover) would show now
    led = _ledger(c, job)
    assert led["delivered"] >= 4, led  # each Alertmanager to each receiver
    _once(led)

    # 2. one Alertmanager; A dies after Slurm requeued the job, before the outcome is recorded;
    # B (polling slower, so A claims first) takes the action over once A's lease expires
    a.stop()
    p2.terminate()
    p2.wait(10)
    b.stop()
    b = Receiver(c, "b2", poll_s=3.0)
    a = Receiver(c, "a2", poll_s=0.1, crash_at="executed")
    procs += [a, b]
    p1.terminate()
    p1.wait(10)
    am1, p1 = alertmanager(c.tmp, "am1b", [a.url, b.url], token)
    procs.append(p1)
    for job in c.jobs[1:]:  # B may win a claim (its poll lands first): then the next job
        _fault_alert(c, job, [am1])
        wait_until(lambda j=job: _done(c, j) or a.proc.poll() is not None, 90,
                   what=f"job {job}'s action executed, or receiver A dead")  # fmt: skip
        if a.proc.poll() is not None:
            break
        _once(_ledger(c, job))
    assert a.proc.wait(10) == -signal.SIGKILL, "receiver A never reached the failpoint"
    wait_until(lambda: _done(c, job), 60, what=f"B finishing job {job}'s action")
    time.sleep(2 * LEASE_S)
    led = _ledger(c, job)
    assert led["delivered"] >= 2, led
    _once(led)
    (row,) = led["rows"]
    assert row.owner.startswith(f"{b.proc.pid}-"), row.owner  # B finished it
    assert led["events"]["executing"] == 2, led  # A's claim, B's takeover
    assert b.proc.poll() is None

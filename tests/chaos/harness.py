"""The chaos harness: a real receiver process on the real stack, killed and restarted.

`Chaos` owns one receiver (`goodput receiver serve` in a child process, on a private PostgreSQL
schema and log directory), the Slurm jobs it acts on, and the faults: log lines the receiver's
evidence reads, alerts posted to its webhook the way Alertmanager posts them (again after any
failure: delivery is at least once). The receiver dies by SIGKILL, at a failpoint chosen by a
seeded generator (`GOODPUT_TEST_CRASH_AT=point@n`, see `recovery.failpoints`) or from outside
at a random moment, and is started again at once. `check()` then says what the run left:
lost, duplicated and stuck actions, jobs in a state nobody chose, and the audit chain.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests
from sqlalchemy import select, text

from recovery import audit, outbox
from recovery.scheduler.slurm import SlurmScheduler
from recovery.store import alerts, incident_alerts, incidents, make_engine
from tests.helpers import terminate

ROOT = Path(__file__).resolve().parents[2]
STACK_SH = ROOT / "compose" / "local" / "stack.sh"
POLICY = {
    "mode": "act",
    "min_confidence": {"drain": 0.3, "drain_and_requeue": 0.3, "requeue": 0.3, "stop": 0.3},
    "retry": {"max_requeues_per_job": 100, "sticky_after": 100, "backoff_s": [0]},
    "blast_radius": {
        "max_drains_per_hour": 10_000,
        "max_partition_unavailable_fraction": 0.5,
        "min_healthy_nodes": 1,
    },
}
CUDA = (
    "[rank0]:[E{md} {hms}.000000000 ProcessGroupNCCL.cpp:1896] [PG ID 0 PG GUID 0(default_pg) "
    "Rank 0] Process group watchdog thread terminated with exception: CUDA error: an illegal "
    "memory access was encountered"
)
XID = (
    "{iso} {node} kernel: NVRM: Xid (PCI:0000:2b:00): 79, pid=<unknown>, name=<unknown>, "
    "GPU has fallen off the bus."
)
OOM = "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
# Terminal for an incident, or in a person's hands.
SETTLED = ("executed", "no_action", "planned_only", "pending_approval", "rejected", "expired")
RESTARTS = ("requeue", "drain_and_requeue")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Fault:
    job: str
    kind: str  # crash | xid | oom
    node: str | None
    fingerprint: str
    starts_at: str

    def alert(self, status: str = "firing") -> dict[str, Any]:
        labels = {"alertname": "GoodputJobLogFault", "job_id": self.job, "severity": "warning"}
        if self.kind == "xid":
            labels.update(alertname="GoodputGPUFatalXid", node=str(self.node), severity="critical")
        return {
            "status": status,
            "labels": labels,
            "annotations": {"summary": f"chaos {self.kind} on job {self.job}"},
            "startsAt": self.starts_at,
            "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else _iso(time.time()),
            "fingerprint": self.fingerprint,
        }


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Figures:
    incidents: int = 0
    posts: int = 0
    kills: int = 0
    server_errors: int = 0
    deaths: Counter[str] = field(default_factory=Counter)  # failpoint (or "external") -> n
    started: float = field(default_factory=time.monotonic)

    def line(self, name: str) -> str:
        return (
            f"chaos {name}: {self.incidents} incidents, {self.posts} alert posts, "
            f"{self.kills} kill -9 ({dict(sorted(self.deaths.items()))}), "
            f"{self.server_errors} 5xx, "
            f"{time.monotonic() - self.started:.0f} s"
        )


class Chaos:
    def __init__(self, stack: dict[str, str], pg_url: str, tmp: Path, seed: int) -> None:
        self.stack, self.tmp, self.rng = stack, tmp, random.Random(seed)
        self.tag = uuid.uuid4().hex[:6]
        self.logs = tmp / "logs"
        (self.logs / "jobs").mkdir(parents=True)
        (self.logs / "kernel").mkdir()
        token = tmp / "token"
        token.write_text(uuid.uuid4().hex)
        self.headers = {"Authorization": f"Bearer {token.read_text()}"}
        policy = tmp / "policy.json"  # YAML is a superset of JSON
        policy.write_text(json.dumps(POLICY))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.db_url = pg_url
        self.env = {
            **os.environ,
            **stack,
            "PYTHONPATH": str(ROOT),
            "GOODPUT_RECEIVER_DB_URL": pg_url,
            "GOODPUT_RECEIVER_TOKEN_FILE": str(token),
            "GOODPUT_RECEIVER_SETTLE_S": "0.3",
            "GOODPUT_RECEIVER_RECHECK_S": "2",
            "GOODPUT_RECEIVER_RECHECK_MAX": "0",
            "GOODPUT_RECEIVER_LOOKBACK_S": "60",
            "GOODPUT_RECEIVER_LEASE_S": "5",  # a killed receiver's work is taken over 5 s on
            "GOODPUT_LOG_DIR": str(self.logs),
            "GOODPUT_POLICY_FILE": str(policy),
            "GOODPUT_MODE": "act",
            "GOODPUT_SCHEDULER": "slurm",
        }
        self.env.pop("GOODPUT_ALERTMANAGER_URL", None)  # notices to on-call: not here
        self.env.pop("GOODPUT_TEST_CRASH_AT", None)
        self.engine = make_engine(pg_url, create=False)
        self.sched = SlurmScheduler(env=self.env)
        self.drained_before = {n.node for n in self.sched.node_states() if n.drained}
        self.proc: subprocess.Popen[bytes] | None = None
        self.crash_at: str | None = None
        self.jobs: list[str] = []
        self.faults: list[Fault] = []
        self.fig = Figures()
        self.killing = True
        self.plan: list[str] = []  # the failpoints still to be used, seeded order
        self.mode = "act"
        self.states: dict[str, Any] = {}
        self._lock = threading.RLock()

    # ---- the receiver process -------------------------------------------------------------
    def start(self, crash_at: str | None = None) -> None:
        """Start the receiver (in approve mode when it is to die after an approval)."""
        self.mode = "approve" if crash_at and crash_at.startswith("approved") else "act"
        env = dict(self.env, GOODPUT_MODE=self.mode)
        if crash_at:
            env["GOODPUT_TEST_CRASH_AT"] = crash_at
        self.crash_at = crash_at
        log = (self.tmp / "receiver.log").open("ab")
        self.proc = subprocess.Popen(
            [  # `goodput receiver serve`, without the CLI's other imports (pandas: 2.4 s)
                sys.executable,
                "-c",
                f"from goodput.commands.receiver import serve; serve(None, {self.port}, None)",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(ROOT),
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return  # died at a failpoint while starting (reconcile): supervise() restarts
            try:
                if requests.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise AssertionError(f"receiver did not serve within 60 s ({self.tmp}/receiver.log)")

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc)

    def _next_crash(self) -> str | None:
        if not self.killing:
            return None
        if not self.plan:
            return None
        point = self.plan.pop(0)
        return f"{point}@{self.rng.randint(1, 2)}" if point != "external" else "external"

    def supervise(self) -> None:
        """Restart the receiver if it died (recording where), maybe kill it from outside."""
        with self._lock:
            self._supervise()

    def _supervise(self) -> None:
        assert self.proc is not None
        rc = self.proc.poll()
        if rc is None and self.crash_at == "external" and self.rng.random() < 0.08:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            rc = -9
        if rc is None:
            return
        if rc != -9:
            raise AssertionError(f"receiver exited {rc} ({self.tmp}/receiver.log)")
        self.fig.kills += 1
        self.fig.deaths[(self.crash_at or "external").split("@")[0]] += 1
        self.start(self._next_crash())

    def kill_now(self, then: str | None = None) -> None:
        """SIGKILL the receiver from outside now, and start it again (to die at `then`)."""
        with self._lock:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            self.fig.kills += 1
            self.fig.deaths["external"] += 1
            self.start(then)

    def schedule_kills(self, points: list[str], rounds: int) -> None:
        """A seeded order of failpoints: every one in `points` `rounds` times, plus outside
        kills at random moments."""
        plan = [p for p in points for _ in range(rounds)] + ["external"] * rounds
        self.rng.shuffle(plan)
        self.plan = plan

    # ---- Slurm jobs and faults -------------------------------------------------------------
    def submit(self, n: int) -> None:
        for _ in range(n):
            out = subprocess.run(
                [
                    "sbatch",
                    "--parsable",
                    "--requeue",
                    f"--job-name=chaos-{self.tag}",
                    "--output=/dev/null",
                    "--gpus=2",
                    "--wrap",
                    "sleep 100000",
                ],
                capture_output=True,
                text=True,
                env=self.env,
                timeout=30,
                check=True,
            )
            self.jobs.append(out.stdout.strip().split(";")[0])
        self.wait(lambda: all(self._running(j) for j in self.jobs), 60, "jobs running")

    def _running(self, job: str) -> bool:
        s = self.sched.job_state(job)
        return bool(s and s.state == "RUNNING")

    def fault(self, job: str, kind: str) -> Fault:
        """Write the fault's log line (as the job or the kernel would) and make its alert."""
        s = self.states.get(job)
        assert s is not None and s.nodes, f"job {job} has no node"
        now = time.time()
        node = s.nodes[0]
        gm = time.gmtime(now)
        path = self.logs / "jobs" / f"slurm-{job}.out"
        if kind == "crash":
            line = CUDA.format(md=time.strftime("%m%d", gm), hms=time.strftime("%H:%M:%S", gm))
            path.write_text(f"step 100 loss 2.0\n{line}\n")  # a fresh log: the restarted job's
        elif kind == "oom":
            path.write_text(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', gm)} {OOM}\n")
        else:
            path.write_text("step 100 loss 2.0\n")
            iso = time.strftime("%Y-%m-%dT%H:%M:%S+0000", gm)
            (self.logs / "kernel" / f"{node}.log").write_text(XID.format(iso=iso, node=node) + "\n")
        f = Fault(job, kind, node, uuid.uuid4().hex[:16], _iso(now))
        self.faults.append(f)
        self.fig.incidents += 1
        return f

    def post(self, docs: list[dict[str, Any]], deadline_s: float = 60) -> None:
        """Deliver like Alertmanager: again after any failure, until a 200."""
        body = {"version": "4", "status": docs[0]["status"], "receiver": "chaos", "alerts": docs}
        deadline = time.monotonic() + deadline_s
        while True:
            self.fig.posts += 1
            try:
                r = requests.post(
                    f"{self.url}/api/v1/alerts", json=body, headers=self.headers, timeout=30
                )
                if r.status_code == 200:
                    return
                assert r.status_code >= 500, f"{r.status_code} {r.text[:300]}"
                self.fig.server_errors += 1  # its store down: Alertmanager retries a 5xx
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("alerts not accepted within the deadline")
            self.supervise()
            time.sleep(0.2)

    def api(self, method: str, path: str, **kw: Any) -> requests.Response | None:
        try:
            return requests.request(
                method, f"{self.url}{path}", headers=self.headers, timeout=30, **kw
            )
        except requests.RequestException:
            return None

    # ---- waiting and reading the store -----------------------------------------------------
    def wait(self, pred: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None:
                self.supervise()
            if pred():
                return
            time.sleep(0.25)
        raise AssertionError(
            f"timed out after {timeout:.0f} s waiting for {what}\n{self.describe()}"
        )

    def describe(self) -> str:
        """Slurm's queue and nodes, this run's incidents and actions, and the receiver log's
        tail: for failures."""
        return "\n".join([self._slurm_view(), self._store_view()])

    def _slurm_view(self) -> str:
        views = (["squeue", "-h", "-o", "%i %T %r %N"], ["sinfo", "-h", "-N", "-o", "%N %T %E"])
        try:
            return "--- slurm ---\n" + "".join(
                subprocess.run(v, env=self.env, capture_output=True, text=True, timeout=10).stdout
                for v in views
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return f"(slurm unreadable: {exc})"

    def _store_view(self) -> str:
        try:
            with self.engine.connect() as conn:
                incs = conn.execute(
                    select(
                        incidents.c.id,
                        incidents.c.job_id,
                        incidents.c.state,
                        incidents.c.diagnosis_state,
                        incidents.c.outcome,
                    )
                ).all()
            acts = self.actions_by_incident()
        except Exception as exc:  # noqa: BLE001 - a failure report must not fail
            return f"(store unreadable: {exc})"
        lines = [
            f"incident {i.id} job {i.job_id} {i.state} diag={i.diagnosis_state} {i.outcome} "
            + " ".join(
                f"{r.id}:{r.kind}:{r.state}:{(r.last_error or '')[:80]}"
                for r in acts.get(str(i.id), [])
            )
            for i in incs
        ]
        log = self.tmp / "receiver.log"
        tail = log.read_text(errors="replace").splitlines()[-40:] if log.exists() else []
        return "\n".join(lines[-40:] + ["--- receiver log ---", *tail])

    def actions_by_incident(self) -> dict[str, list[Any]]:
        t = outbox.actions_table
        with self.engine.connect() as conn:
            rows = conn.execute(select(t).where(t.c.incident_id.is_not(None))).all()
        out: dict[str, list[Any]] = {}
        for r in rows:
            out.setdefault(str(r.incident_id), []).append(r)
        return out

    def incident_of(self) -> dict[str, list[int]]:
        """fingerprint -> the incidents its alert joined."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(alerts.c.fingerprint, incident_alerts.c.incident_id).select_from(
                    alerts.join(incident_alerts)
                )
            ).all()
        out: dict[str, list[int]] = {}
        for fp, inc in rows:
            out.setdefault(fp, []).append(int(inc))
        return out

    def settled(self, faults: list[Fault]) -> bool:
        """Every fault's incident is diagnosed and its action terminal or with a person."""
        of = self.incident_of()
        acts = self.actions_by_incident()
        with self.engine.connect() as conn:
            states = dict(conn.execute(select(incidents.c.id, incidents.c.diagnosis_state)).all())
        for f in faults:
            for inc in of.get(f.fingerprint, []) or [None]:
                if inc is None or states.get(inc) != "done":
                    return False
                rows = acts.get(str(inc), [])
                if not rows or any(r.state not in (*SETTLED, "failed") for r in rows):
                    return False
        return True

    def resolve(self, faults: list[Fault]) -> None:
        if faults:
            self.post([f.alert("resolved") for f in faults])

    def round(self, kinds: list[str], timeout: float = 90) -> list[Fault]:
        """One fault on each of len(kinds) running jobs, posted, settled, resolved."""
        want = min(len(kinds), len(self.jobs) - 4)
        self.wait(lambda: sum(self._running(j) for j in self.jobs) >= want, 30, "jobs running")
        faults = [self.fault(j, k) for j, k in self.pick(kinds)]
        for f in faults:
            self.post([f.alert()])
        self.approve_pending()
        self.wait(lambda: self.approve_pending() or self.settled(faults), timeout, "settled")
        self.resolve(faults)
        return faults

    def pick(self, kinds: list[str], live: bool = True) -> list[tuple[str, str]]:
        """Running jobs for the faults: an XID's node runs no other faulted job (its kernel
        log would make theirs a GPU fault too). `live=False`: from the last states read
        (Slurm is down), jobs without a fault yet."""
        if live:
            self.states = {j: self.sched.job_state(j) for j in self.jobs}
        states = self.states
        faulted = {f.job for f in self.faults}
        running = [
            j
            for j, s in states.items()
            if s and s.state == "RUNNING" and s.nodes and (live or j not in faulted)
        ]
        self.rng.shuffle(running)
        out: list[tuple[str, str]] = []
        xid_nodes: set[str] = set()
        used: set[str] = set()
        for kind in sorted(kinds, key=lambda k: k != "xid"):
            for j in running:
                node = states[j].nodes[0]  # type: ignore[union-attr]
                if j in used or node in xid_nodes:
                    continue
                if kind == "xid" and any(states[u].nodes[0] == node for u in used):  # type: ignore[union-attr]
                    continue
                used.add(j)
                if kind == "xid":
                    xid_nodes.add(node)
                out.append((j, kind))
                break
        return out

    def approve_pending(self) -> bool:
        r = self.api("GET", "/api/v1/actions", params={"state": "pending_approval"})
        for a in r.json()["actions"] if r is not None and r.status_code == 200 else []:
            self.api("POST", f"/api/v1/actions/{a['id']}/approve", json={"who": "chaos-oncall"})
        return False

    def person_repairs(self) -> None:
        """What on-call does between rounds: resume drained nodes, release stopped jobs; the
        faulty GPUs are replaced, so their kernel logs start afresh."""
        for f in (self.logs / "kernel").glob("*.log"):
            f.write_text("")
        for n in self.ours_drained():
            self.api("POST", f"/api/v1/nodes/{n}/resume", json={"who": "chaos-oncall"})
        stopped = {
            str(r.job_id)
            for rows in self.actions_by_incident().values()
            for r in rows
            if r.kind == "stop" and r.state == "executed"
        }
        for j in self.jobs:  # only jobs Goodput stopped: any other hold is for check() to see
            s = self.sched.job_state(j)
            if s and s.held and j in stopped:
                subprocess.run(["scontrol", "release", j], env=self.env, timeout=30, check=False)

    # ---- the verdict -----------------------------------------------------------------------
    def check(self) -> list[str]:
        """Lost, duplicated, stuck; jobs nobody chose; the audit chain. [] when all held."""
        problems: list[str] = []
        of = self.incident_of()
        acts = self.actions_by_incident()
        with self.engine.connect() as conn:
            inc_rows = {r.id: r for r in conn.execute(select(incidents)).all()}
        for f in self.faults:
            incs = of.get(f.fingerprint, [])
            if len(incs) != 1:
                problems.append(f"alert {f.fingerprint} (job {f.job}) joined {len(incs)} incidents")
                continue
            inc = inc_rows[incs[0]]
            rows = acts.get(str(inc.id), [])
            if inc.diagnosis_state != "done":
                problems.append(f"incident {inc.id}: diagnosis {inc.diagnosis_state} (stuck)")
            if not rows:
                problems.append(f"incident {inc.id} (job {f.job}): no action (lost)")
            if len(rows) > 1:
                problems.append(f"incident {inc.id}: {len(rows)} actions (duplicated)")
            for r in rows:
                if r.state in outbox.OPEN_STATES and r.state != "pending_approval":
                    problems.append(f"action {r.id} left {r.state} (stuck)")
                if r.state == "failed":
                    problems.append(f"action {r.id} failed: {r.last_error}")
        per_job: dict[str, list[Any]] = {}
        for rows in acts.values():
            for r in rows:
                per_job.setdefault(str(r.job_id), []).append(r)
        for j in self.jobs:
            s = self.sched.job_state(j)
            rows = per_job.get(j, [])
            done = [r for r in rows if r.state == "executed"]
            n_req = sum(1 for r in done if r.kind in RESTARTS)
            n_stop = sum(1 for r in done if r.kind == "stop")
            if s is None:
                problems.append(f"job {j} vanished")
                continue
            if not n_req <= s.restarts <= n_req + n_stop:
                problems.append(
                    f"job {j}: Slurm restarted it {s.restarts} times, Goodput executed "
                    f"{n_req} requeues and {n_stop} stops (lost or duplicated requeue)"
                )
            if s.held and not (rows and max(rows, key=lambda r: r.created_at).kind == "stop"):
                problems.append(f"job {j} held ({s.reason}) and nobody stopped it (stuck)")
        v = audit.verify(self.engine)
        if not v.ok:
            problems.append(f"audit chain broken at {v.first_bad_seq}: {v.problem}")
        return problems

    def ours_drained(self) -> list[str]:
        """Nodes Goodput drained during this run (none of them was drained before it)."""
        return [
            n.node
            for n in self.sched.node_states()
            if n.drained_by_goodput and n.node not in self.drained_before
        ]

    def cleanup(self) -> None:
        self.killing = False
        self.stop()
        for j in self.jobs:
            subprocess.run(["scancel", j], env=self.env, timeout=30, check=False)
        for n in self.ours_drained():
            subprocess.run(
                ["scontrol", "update", f"NodeName={n}", "State=RESUME"],
                env=self.env,
                timeout=30,
                check=False,
            )
        self.engine.dispose()


def pg_schema(url: str) -> tuple[str, Any]:
    """A private schema on the stack's PostgreSQL: (URL using it, drop function)."""
    schema = f"chaos_{uuid.uuid4().hex[:10]}"
    admin = make_engine(url, create=False)
    with admin.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    sep = "&" if "?" in url else "?"

    def drop() -> None:
        with admin.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()

    return f"{url}{sep}options=-csearch_path%3D{schema}", drop


def restore_stack(env: dict[str, str]) -> None:
    """Start whatever part of the stack is not running (what stack.sh start does twice)."""
    subprocess.run(["bash", str(STACK_SH), "start"], env=env, timeout=180, check=True)

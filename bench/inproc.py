"""The production loop in one process, in simulated time.

Every `interval_s` the simulator advances; its dcgm samples, its logs (read by the log-metrics
exporter's own parser) and its scheduler state (as the Slurm exporter labels it) become the
metric sources; the detector's `Engine` scores the instant exactly as the service does; the
alert conditions of alertmanager/alerts.yaml are evaluated (bench.online_alerts). From there on
it is the receiver itself (`recovery.app.create_app`, in process through a TestClient, on a
simulated `recovery.clock.ManualClock`): the changes of the firing set are posted to its
webhook as Alertmanager would post them (version 4 JSON; a new alert `firing` with its
startsAt, an alert whose condition stopped `resolved`); then one pass of the production diagnosis
worker (`recovery.worker.run_once`: settle, attribution, recheck, outbox) and of the action
executor (`recovery.actions.reconcile`) runs at the simulated time. Evidence comes from the
simulation through `Settings.sources` (`bench.sim_sources`); actions go through
`recovery.scheduler.simulated` to the simulator's own control API (in-process: no sockets).
What the bench scores is read back from the receiver's HTTP API (incidents, diagnoses, actions).
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.online_alerts import OnlineAlerts
from bench.sim_sources import SimSources
from detector import exposition
from detector import fields as F
from detector.frame import Frame
from detector.pipeline import Config, Engine
from exporters.logmetrics.parser import LogState
from exporters.sim import FIELD_NAMES, Scenario, Simulation
from exporters.sim.dcgm import OFF_BUS_FIELDS
from exporters.sim.logs import LogSink
from recovery import actions, worker
from recovery.clock import ManualClock
from recovery.policy import DEFAULT_FILE
from recovery.scheduler.simulated import SimulatedScheduler
from recovery.settings import Settings

SACCT_WINDOW_S = 3600.0  # the Slurm exporter shows ended jobs this long
_NOT_OFF_BUS = np.array([i not in OFF_BUS_FIELDS for i in range(len(FIELD_NAMES))])
_ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt of a firing alert


@dataclass(frozen=True)
class BenchSettings(Settings):
    """The receiver's settings (production defaults) plus the scheduler adapter that
    `recovery.actions.config` takes from its settings."""

    scheduler_adapter: Any = None


@dataclass
class ActionView:
    kind: str
    default_kind: str | None
    disposition: str | None
    reasons: tuple[str, ...]


@dataclass
class Incident:
    """An incident as the receiver's API shows it (its latest diagnosis and action)."""

    id: int
    job_id: str | None
    node: str | None
    opened_at: float
    resolved_at: float | None = None
    alert_names: list[str] = field(default_factory=list)
    diagnosis: dict[str, Any] | None = None  # the one its action was planned on, else latest
    latest: dict[str, Any] | None = None  # the latest (a later alert re-diagnoses an incident)
    action: ActionView | None = None
    result: str = ""  # executed | failed: ... | not executed (disposition) | "" (none yet)
    diagnose_s: float = 0.0
    updated_at: float | None = None

    def summary(self) -> dict[str, Any]:
        d = self.diagnosis or {}
        a = self.action
        return {
            "id": self.id,
            "job_id": self.job_id,
            "node": self.node,
            "opened_at": self.opened_at,
            "resolved_at": self.resolved_at,
            "alerts": sorted(self.alert_names),
            "outcome": d.get("outcome"),
            "affected_nodes": d.get("affected_nodes", []),
            "latest_affected_nodes": (self.latest or {}).get("affected_nodes", []),
            "confidence": d.get("confidence"),
            "root_cause": (d.get("root_cause") or "")[:200],
            "action": a.kind if a else None,
            "default_action": a.default_kind if a else None,
            "disposition": a.disposition if a else None,
            "reasons": list(a.reasons) if a else [],
            "result": self.result,
        }


def _exporter_state(state: str, reason: str) -> str:
    """The Slurm exporter's node state: base state plus flags joined with '+'."""
    if state == "DOWN":
        return "down+not_responding" if reason.lower().startswith("not responding") else "down"
    if state == "DRAIN":
        return "mixed+drain"
    if state == "DRAINED":
        return "idle+drain"
    return state.lower()


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _labels(raw: dict[str, Any]) -> dict[str, str]:
    """An alert's labels as Prometheus sends them: strings, empty ones dropped."""
    out = {}
    for k, v in raw.items():
        if v is None or (isinstance(v, float) and np.isnan(v)) or str(v) == "":
            continue
        out[str(k)] = str(v)
    return out


def _result(row: dict[str, Any]) -> str:
    state = row["state"]
    if state == "executed":
        return "executed"
    if state == "failed":
        return f"failed: {row.get('last_error') or ''}"[:300]
    if state in ("planning", "waiting_scheduler", "ready", "approved", "executing"):
        return ""
    disposition = (row["body"].get("action") or {}).get("disposition")
    return f"not executed ({disposition or state})"


def score_frames(res: Any, now: float) -> dict[str, pd.DataFrame]:
    """An engine `Result` as the three score sources the alert conditions read (one combined
    series per GPU, as the service exposes it)."""
    f = res.frame
    on, combined, _ = exposition.gpu_combined(res)
    gpu = pd.DataFrame(
        {
            "timestamp": now,
            "job_id": f.job[on],
            "node": f.node[on],
            "gpu": f.gpu[on].astype(str),
            "goodput_gpu_anomaly_score": combined,
        }
    )
    jobs = res.jobs.rename(columns={"score": "goodput_job_anomaly_score"})
    jobs.insert(0, "timestamp", now)
    nodes = res.nodes.rename(columns={"score": "goodput_node_suspect_score"})
    nodes.insert(0, "timestamp", now)
    return {"gpu_score": gpu, "job_score": jobs, "node_score": nodes}


class Harness:
    """One scenario run. `step()` advances one interval; `run_until(t)` loops."""

    def __init__(
        self, scenario: Scenario, seed: int, workdir: Path, interval_s: float | None = None
    ) -> None:
        from fastapi.testclient import TestClient

        from exporters.sim.api import build_app
        from recovery.app import create_app

        self.interval_s = float(interval_s or scenario.interval_s)
        self.logdir = workdir / "logs"
        (self.logdir / "jobs").mkdir(parents=True, exist_ok=True)
        (self.logdir / "kernel").mkdir(parents=True, exist_ok=True)
        self.sink = LogSink(self.logdir)
        self.sim = Simulation(scenario, seed=seed, sink=self.sink)
        self.engine = Engine(Config(interval_s=self.interval_s))
        self.logs = LogState()
        self.alerts = OnlineAlerts(interval_s=self.interval_s)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.client = TestClient(build_app(self.sim))
        self.sched = SimulatedScheduler("http://sim", session=self.client)
        self.sched.verify_timeout_s = 1.0
        self.clock = ManualClock(self.now)
        self.settings = BenchSettings(
            db_url=f"sqlite:///{workdir / 'receiver.db'}",
            require_auth=False,
            log_dir=str(self.logdir),
            clock=self.clock,
            sources=SimSources(self.sim.cluster, self.alerts.hist, self.sink),
            scheduler_adapter=self.sched,
            extra={
                "GOODPUT_MODE": "act",
                "GOODPUT_POLICY_FILE": str(DEFAULT_FILE),
                "GOODPUT_ACTIONS_THREAD": "0",  # the bench runs the executor's passes
            },
        )
        # the evidence window reaches lookback_s before an incident's first alert
        self.alerts.keep_s = max(self.alerts.keep_s, self.settings.lookback_s + 2 * self.interval_s)
        self.app = create_app(self.settings, start_worker=False)
        self.store = self.app.state.engine
        self.receiver = TestClient(self.app)
        self._job_off: dict[str, int] = {}
        self._kern_off: dict[str, int] = {}
        self._active: dict[str, tuple[dict[str, str], float]] = {}  # fingerprint -> (labels, start)
        self._views: dict[int, Incident] = {}
        self.incidents: list[Incident] = []
        self.iters: dict[str, list[tuple[float, float]]] = {}  # job -> (t, iteration)
        self.running: dict[str, list[tuple[float, int]]] = {}  # job -> (t, gpus) while running
        self.recovered: dict[str, float] = {}  # fault_id -> first time running again, progressing
        self.posted = 0  # alerts posted to the receiver (firing and resolved)

    @property
    def now(self) -> float:
        return self.sim.cluster.now

    def close(self) -> None:
        self.sink.close()
        self.client.close()
        self.receiver.close()
        self.store.dispose()

    # ---------------------------------------------------------------- one step
    def step(self) -> None:
        c = self.sim.cluster
        c.step(self.interval_s)
        now = c.now
        # the sample at `now`: what the exporters show after the tick
        self._feed_logs(now)
        dcgm = self._dcgm(now)
        jobm = self._job_metrics(now)
        frames = {"dcgm": dcgm, "jobm": jobm, **self._log_frames(now), **self._slurm_frames(now)}
        # faults due at `now` begin after this sample (Simulation.step's order: tick, then due)
        self.sim.elapsed += self.interval_s
        self.sim._due()  # noqa: SLF001
        names = {j.job_id: j.name for j in c.jobs.values()}
        det = dcgm.rename(columns={"timestamp": "time"})
        if len(det):
            prog = jobm.set_index("job_id") if len(jobm) else None
            for col in (F.LAST_PROGRESS, F.ITER_SECONDS, F.LAST_PAUSE):
                det[col] = det["job_id"].map(prog[col]) if prog is not None else np.nan
        frame = Frame.from_dataframe(det)
        res = self.engine.step(frame, now, names)
        self.engine.end_jobs(set(pd.unique(frame.job)) - {""})
        frames.update(score_frames(res, now))
        self.alerts.add(now, frames)
        self._track(now)
        self.clock.t = now
        posted = self._deliver(now, self.alerts.firing(now))
        t0 = time.perf_counter()
        diagnosed = worker.run_once(self.store, self.settings)  # the worker thread's one pass
        took = time.perf_counter() - t0
        executed = actions.reconcile(self.store, self.settings)  # the executor's one pass
        if posted or diagnosed or executed:
            self._refresh({i: took / len(diagnosed) for i in diagnosed})

    def run_until(self, t: float) -> None:
        while self.now + 1e-6 < t:
            self.step()

    # ---------------------------------------------------------------- the receiver
    def _deliver(self, now: float, firing: list[dict[str, Any]]) -> int:
        """Post what changed in the firing set, as Alertmanager's webhook would (every
        group_interval, 5 s = one step): new alerts firing, ended ones resolved."""
        current = {}
        for raw in firing:
            labels = _labels(raw)
            key = json.dumps(sorted(labels.items()))
            current[hashlib.sha256(key.encode()).hexdigest()[:16]] = labels
        out = []
        for fp, labels in current.items():
            if fp not in self._active:
                self._active[fp] = (labels, now)
                out.append(self._alert(fp, labels, now, "firing"))
        for fp in [fp for fp in self._active if fp not in current]:
            labels, start = self._active.pop(fp)
            out.append(self._alert(fp, labels, start, "resolved", now))
        for i in range(0, len(out), 1000):  # the receiver's MAX_ALERTS per payload
            batch = out[i : i + 1000]
            status = "firing" if any(a["status"] == "firing" for a in batch) else "resolved"
            doc = {"version": "4", "status": status, "receiver": "goodput", "alerts": batch}
            resp = self.receiver.post("/api/v1/alerts", json=doc)
            if resp.status_code != 200:
                raise RuntimeError(f"receiver refused the alerts: {resp.status_code} {resp.text}")
        self.posted += len(out)
        return len(out)

    @staticmethod
    def _alert(
        fp: str, labels: dict[str, str], start: float, status: str, end: float | None = None
    ) -> dict[str, Any]:
        return {
            "status": status,
            "labels": labels,
            "annotations": {},
            "startsAt": _rfc3339(start),
            "endsAt": _rfc3339(end) if end is not None else _ZERO_TIME,
            "fingerprint": fp,
        }

    def _get(self, path: str, **params: Any) -> Any:
        resp = self.receiver.get(path, params=params)
        resp.raise_for_status()
        return resp.json()

    def _refresh(self, diagnose_s: dict[int, float]) -> None:
        """Read the incidents, their latest diagnoses and actions back from the receiver."""
        items: list[dict[str, Any]] = []
        while True:
            page = self._get("/api/v1/incidents", limit=500, offset=len(items))
            items += page["items"]
            if len(items) >= page["total"] or not page["items"]:
                break
        latest: dict[str, dict[str, Any]] = {}
        for a in sorted(
            self._get("/api/v1/actions", limit=1000)["actions"],
            key=lambda a: (a["created_at"], a["id"]),
        ):
            if a["incident_id"]:
                latest[a["incident_id"]] = a
        for it in items:
            v = self._views.get(it["id"])
            if v is None:
                v = self._views[it["id"]] = Incident(it["id"], it["job_id"], it["node"], 0.0)
            v.opened_at, v.resolved_at = it["opened_at"], it["resolved_at"]
            v.alert_names = sorted(it["alert_summary"]["by_name"])
            if it["updated_at"] != v.updated_at and it["outcome"] is not None:
                v.latest = self._get(f"/api/v1/incidents/{it['id']}")["diagnosis"]
            v.updated_at = it["updated_at"]
            v.diagnose_s = max(v.diagnose_s, diagnose_s.get(it["id"], 0.0))
            row = latest.get(str(it["id"]))
            act = (row or {}).get("body", {}).get("action") if row else None
            if act:
                v.action = ActionView(
                    act["kind"],
                    act.get("default_kind"),
                    act.get("disposition"),
                    tuple(act.get("reasons") or ()),
                )
            v.result = _result(row) if row else ""
            v.diagnosis = (row or {}).get("body", {}).get("diagnosis") or v.latest
        self.incidents = [self._views[i] for i in sorted(self._views)]

    # ---------------------------------------------------------------- metric sources
    def _node_job(self) -> dict[str, str]:
        return {n.name: n.jobs[0] for n in self.sim.cluster.nodes.values() if len(n.jobs) == 1}

    def _dcgm(self, now: float) -> pd.DataFrame:
        gpus = [g for n in self.sim.cluster.nodes.values() if n.alive for g in n.gpus]
        if not gpus:
            return pd.DataFrame(columns=["timestamp", "node", "gpu", "job_id", *FIELD_NAMES])
        vals = np.array([g.values for g in gpus], dtype=float)
        off = np.array([g.off_bus for g in gpus])
        if off.any():
            vals[np.ix_(off, _NOT_OFF_BUS)] = np.nan
        df = pd.DataFrame(vals, columns=FIELD_NAMES)
        node_job = self._node_job()
        df.insert(0, "timestamp", now)
        df.insert(1, "node", [g.node_name for g in gpus])
        df.insert(2, "gpu", [str(g.index) for g in gpus])
        # hpc_job, else the node's one job (the rules' join on goodput_slurm_job_node_info),
        # only on nodes where no GPU carries hpc_job (job mapping off): with mapping on, an
        # unlabelled GPU is one the job does not use (a 1-GPU job leaves 7 idle)
        mapped = {g.node_name for g in gpus if g.job_id}
        df.insert(
            3,
            "job_id",
            [
                g.job_id or ("" if g.node_name in mapped else node_job.get(g.node_name, ""))
                for g in gpus
            ],
        )
        return df

    def _feed_logs(self, now: float) -> None:
        for job_id, lines in list(self.sink.jobs.items()):
            off = self._job_off.get(job_id, 0)
            if len(lines) > off:
                self.logs.feed_job(job_id, lines[off:], now)
                self._job_off[job_id] = len(lines)
        for node, lines in list(self.sink.kernel.items()):
            off = self._kern_off.get(node, 0)
            if len(lines) > off:
                self.logs.feed_kernel(node, lines[off:], now)
                self._kern_off[node] = len(lines)

    def _job_metrics(self, now: float) -> pd.DataFrame:
        rows = []
        for job_id, js in self.logs.jobs.items():
            rows.append(
                {
                    "timestamp": now,
                    "job_id": job_id,
                    F.LAST_PROGRESS: max(js.last_progress.values()) if js.last_progress else np.nan,
                    "goodput_job_iteration": np.nan if js.iteration is None else js.iteration,
                    F.ITER_SECONDS: np.nan
                    if js.iteration_seconds is None
                    else js.iteration_seconds,
                    "goodput_job_nan_iterations_total": js.nan_iterations,
                    F.LAST_PAUSE: np.nan if js.last_pause is None else js.last_pause,
                }
            )
        cols = [
            "timestamp",
            "job_id",
            F.LAST_PROGRESS,
            "goodput_job_iteration",
            F.ITER_SECONDS,
            "goodput_job_nan_iterations_total",
            F.LAST_PAUSE,
        ]
        return pd.DataFrame(rows, columns=cols)

    def _log_frames(self, now: float) -> dict[str, pd.DataFrame]:
        node_job = self._node_job()
        pats = [
            {"timestamp": now, "job_id": j, "node": n, "pattern": p, "v": v}
            for (j, n, p), v in self.logs.pattern_matches.items()
        ]
        log = pd.DataFrame(pats, columns=["timestamp", "job_id", "node", "pattern", "v"])
        xids = [
            {"timestamp": now, "node": n, "xid": x, "job_id": node_job.get(n, ""), "v": v}
            for (n, x), v in self.logs.xids.items()
        ]
        xid = pd.DataFrame(xids, columns=["timestamp", "node", "xid", "job_id", "v"])
        return {
            "log": log.rename(columns={"v": "goodput_log_pattern_matches_total"}),
            "xid": xid.rename(columns={"v": "goodput_node_xid_errors_total"}),
        }

    def _slurm_frames(self, now: float) -> dict[str, pd.DataFrame]:
        c = self.sim.cluster
        jobs = [
            {
                "timestamp": now,
                "job_id": j.job_id,
                "job_name": j.name,
                "partition": "sim",
                "state": j.state.lower(),
                "goodput_slurm_job_state": 1.0,
            }
            for j in c.jobs.values()
            if j.state in ("PENDING", "RUNNING") or now - j.end_t <= SACCT_WINDOW_S
        ]
        node_job = self._node_job()
        nodes = [
            {
                "timestamp": now,
                "node": n.name,
                "state": _exporter_state(c.node_state(n), n.reason),
                "reason": n.reason,
                "job_id": node_job.get(n.name, ""),
                "goodput_slurm_node_state": 1.0,
            }
            for n in c.nodes.values()
        ]
        return {"slurm_job": pd.DataFrame(jobs), "slurm_node": pd.DataFrame(nodes)}

    # ---------------------------------------------------------------- ground-truth tracking
    def _track(self, now: float) -> None:
        c = self.sim.cluster
        for j in c.jobs.values():
            if j.state == "RUNNING":
                self.iters.setdefault(j.job_id, []).append((now, j.iteration))
                self.running.setdefault(j.job_id, []).append((now, len(j.alloc)))
        for fid, f in c.faults.items():
            if fid in self.recovered or not f.get("job_id"):
                continue
            fj = c.jobs.get(f["job_id"])
            if (
                fj is not None
                and fj.state == "RUNNING"
                and fj.start_t > f["onset"]
                and fj.last_progress_t > fj.start_t
            ):
                self.recovered[fid] = now

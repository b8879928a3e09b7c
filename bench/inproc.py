"""The production loop in one process, in simulated time.

Every `interval_s` the simulator advances; its dcgm samples, its logs (read by the log-metrics
exporter's own parser) and its scheduler state (as the Slurm exporter labels it) become the
metric sources; the detector's `Engine` scores the instant exactly as the service does; the
alert conditions of alertmanager/alerts.yaml are evaluated (bench.online_alerts); firing alerts
fold into incidents per job as the receiver folds them; a new incident is attributed over the
evidence available at that moment (metrics so far, the log files so far, the scheduler's state)
by `recovery.attribution`, decided by `recovery.decide` under the default policy in act mode,
and executed through `recovery.scheduler.simulated` against the simulator's own control API
(an in-process HTTP client: no sockets).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.online_alerts import OnlineAlerts
from detector import fields as F
from detector.frame import Frame
from detector.pipeline import Config, Engine
from exporters.logmetrics.parser import LogState
from exporters.sim import FIELD_NAMES, Scenario, Simulation
from exporters.sim.dcgm import OFF_BUS_FIELDS
from exporters.sim.logs import LogSink
from recovery import attribution
from recovery.decide import Action, Diagnosis, History, JobView, NodeView, decide
from recovery.evidence import Bundle, Context, Report, Series, SlurmFacts
from recovery.evidence import logs as log_evidence
from recovery.evidence import prometheus as prom_evidence
from recovery.policy import RESTARTS, Policy, load_policy
from recovery.scheduler import SchedulerError
from recovery.scheduler.simulated import SimulatedScheduler
from recovery.settings import Settings

LOOKBACK_S = 900.0  # the receiver's default evidence window before the first alert
RESOLVE_S = 60.0  # an incident resolves when none of its alerts fired for this long
# Alertmanager's group_wait (1 s, alertmanager.yml) + the receiver's settle_s (3 s): a new
# incident is diagnosed this long after its first alert, with the alerts that joined meanwhile
SETTLE_S = 4.0
# the receiver's defaults: an `unknown` verdict on an open incident is diagnosed again this
# much later, at most this often, before any action (recovery.incidents.store_diagnosis)
_RECEIVER = Settings(db_url="sqlite://")
RECHECK_S, RECHECK_MAX = _RECEIVER.recheck_s, _RECEIVER.recheck_max
SACCT_WINDOW_S = 3600.0  # the Slurm exporter shows ended jobs this long
_XID = FIELD_NAMES.index("DCGM_FI_DEV_XID_ERRORS")
_NOT_OFF_BUS = np.array([i not in OFF_BUS_FIELDS for i in range(len(FIELD_NAMES))])


def act_policy() -> Policy:
    """The default policy file, in act mode."""
    return load_policy(env={"GOODPUT_MODE": "act"})


@dataclass
class Incident:
    id: int
    job_id: str | None
    node: str | None
    opened_at: float
    alerts: dict[str, dict[str, Any]] = field(default_factory=dict)
    last_firing: float = 0.0
    resolved_at: float | None = None
    diagnosis: dict[str, Any] | None = None
    action: Action | None = None
    result: str = ""  # executed | failed: ... | not executed (disposition)
    diagnose_s: float = 0.0
    rechecks: int = 0
    recheck_at: float | None = None

    def summary(self) -> dict[str, Any]:
        d = self.diagnosis or {}
        a = self.action
        return {
            "id": self.id,
            "job_id": self.job_id,
            "node": self.node,
            "opened_at": self.opened_at,
            "resolved_at": self.resolved_at,
            "alerts": sorted({al["alertname"] for al in self.alerts.values()}),
            "outcome": d.get("outcome"),
            "affected_nodes": d.get("affected_nodes", []),
            "confidence": d.get("confidence"),
            "root_cause": (d.get("root_cause") or "")[:200],
            "action": a.kind if a else None,
            "default_action": a.default_kind if a else None,
            "disposition": a.disposition if a else None,
            "reasons": list(a.reasons) if a else [],
            "result": self.result,
        }


def _sinfo_state(state: str) -> str:
    """The simulator's node state as sinfo's %T spells it."""
    return {"DRAIN": "draining", "DRAINED": "drained"}.get(state, state.lower())


def _exporter_state(state: str, reason: str) -> str:
    """The Slurm exporter's node state: base state plus flags joined with '+'."""
    if state == "DOWN":
        return "down+not_responding" if reason.lower().startswith("not responding") else "down"
    if state == "DRAIN":
        return "mixed+drain"
    if state == "DRAINED":
        return "idle+drain"
    return state.lower()


def score_frames(res: Any, now: float) -> dict[str, pd.DataFrame]:
    """An engine `Result` as the three score sources the alert conditions read."""
    f = res.frame
    on = np.flatnonzero(f.job != "")
    n_det = len(res.detectors)
    gpu = pd.DataFrame(
        {
            "timestamp": now,
            "job_id": np.repeat(f.job[on], n_det),
            "node": np.repeat(f.node[on], n_det),
            "gpu": np.repeat(f.gpu[on].astype(str), n_det),
            "detector": np.tile(np.array(res.detectors, dtype=object), len(on)),
            "goodput_gpu_anomaly_score": res.gpu[on].reshape(-1),
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
        self,
        scenario: Scenario,
        seed: int,
        workdir: Path,
        policy: Policy | None = None,
        interval_s: float | None = None,
    ) -> None:
        from fastapi.testclient import TestClient

        from exporters.sim.api import build_app

        self.interval_s = float(interval_s or scenario.interval_s)
        self.logdir = workdir / "logs"
        (self.logdir / "jobs").mkdir(parents=True, exist_ok=True)
        (self.logdir / "kernel").mkdir(parents=True, exist_ok=True)
        self.sink = LogSink(self.logdir)
        self.sim = Simulation(scenario, seed=seed, sink=self.sink)
        self.engine = Engine(Config(interval_s=self.interval_s))
        self.logs = LogState()
        self.alerts = OnlineAlerts(interval_s=self.interval_s)
        self.alerts.keep_s = max(self.alerts.keep_s, LOOKBACK_S + 2 * self.interval_s)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.client = TestClient(build_app(self.sim))
        self.sched = SimulatedScheduler("http://sim", session=self.client)
        self.sched.verify_timeout_s = 1.0
        self.policy = policy or act_policy()
        self._job_off: dict[str, int] = {}
        self._kern_off: dict[str, int] = {}
        self.incidents: list[Incident] = []
        self.restarts_done: dict[str, int] = {}
        self.same_cause: dict[tuple[str, str], int] = {}
        self.drain_times: list[float] = []
        self.iters: dict[str, list[tuple[float, float]]] = {}  # job -> (t, iteration)
        self.running: dict[str, list[tuple[float, int]]] = {}  # job -> (t, gpus) while running
        self.recovered: dict[str, float] = {}  # fault_id -> first time running again, progressing
        self.diagnose_s: list[float] = []

    @property
    def now(self) -> float:
        return self.sim.cluster.now

    def close(self) -> None:
        self.sink.close()
        self.client.close()

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
        self._fold(now, self.alerts.firing(now))

    def run_until(self, t: float) -> None:
        while self.now + 1e-6 < t:
            self.step()

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

    # ---------------------------------------------------------------- incidents
    def _fold(self, now: float, firing: list[dict[str, Any]]) -> None:
        c = self.sim.cluster
        for labels in firing:
            key = "|".join(f"{k}={v}" for k, v in sorted(labels.items()))
            job, node = labels.get("job_id"), labels.get("node")
            targets: list[Incident] = []
            if job:
                targets = [self._open(job, None, now)]
            elif node:
                jobs = set(c.nodes[node].jobs) if node in c.nodes else set()
                jobs |= {
                    i.job_id
                    for i in self.incidents
                    if i.resolved_at is None
                    and i.job_id
                    and any(a.get("node") == node for a in i.alerts.values())
                }
                targets = [self._open(j, None, now) for j in sorted(jobs)] or [
                    self._open(None, node, now)
                ]
            else:
                targets = [self._open(None, "", now)]
            for inc in targets:
                inc.alerts.setdefault(key, labels)
                inc.last_firing = now
        for inc in self.incidents:
            first = inc.diagnosis is None and now >= inc.opened_at + SETTLE_S
            if first or (inc.recheck_at is not None and now >= inc.recheck_at):
                self._handle(inc, now)
            if inc.resolved_at is None and now - inc.last_firing >= RESOLVE_S:
                inc.resolved_at = now

    def _open(self, job: str | None, node: str | None, now: float) -> Incident:
        for inc in reversed(self.incidents):
            if inc.resolved_at is None and inc.job_id == job and (job or inc.node == node):
                return inc
        inc = Incident(len(self.incidents) + 1, job, node, now, last_firing=now)
        self.incidents.append(inc)
        return inc

    def _handle(self, inc: Incident, now: float) -> None:
        import time

        t0 = time.perf_counter()
        ctx = self._context(inc, now)
        bundle = self._evidence(ctx, now)
        doc = attribution.attribute(bundle, ctx, incident_id=inc.id)
        inc.diagnosis, inc.recheck_at = doc, None
        if doc["outcome"] == "unknown" and inc.resolved_at is not None:
            inc.result = "not executed (inconclusive, resolved)"
            return
        if doc["outcome"] == "unknown" and inc.rechecks < RECHECK_MAX:
            inc.rechecks += 1
            inc.recheck_at = now + RECHECK_S
            return
        diag = Diagnosis.from_dict(
            {**doc, "incident_id": str(inc.id), "job_id": doc.get("job_id") or inc.job_id}
        )
        job = self.sched.job_state(diag.job_id) if diag.job_id else None
        nodes = self.sched.node_states()
        jv = (
            JobView(job.state, job.restarts, job.exit_code, job.partition, job.start_time)
            if (job)
            else None
        )
        hist = History(
            now=now,
            job=jv,
            restarts_done=self.restarts_done.get(diag.job_id or "", 0),
            same_cause_restarts=self.same_cause.get((diag.job_id or "", diag.cause_key), 0),
            drain_times=tuple(self.drain_times),
            nodes=tuple(NodeView(n.node, n.state, n.partitions) for n in nodes),
        )
        action = decide(diag, hist, self.policy)
        inc.action = action
        inc.diagnose_s = time.perf_counter() - t0
        if action.disposition != "execute":
            inc.result = f"not executed ({action.disposition})"
            return
        inc.result = self._execute(action, diag, job.restarts if job else None, now)

    def _execute(self, a: Action, diag: Diagnosis, restarts: int | None, now: float) -> str:
        """What recovery.actions.execute does, step by step, through the scheduler port."""
        try:
            for node in a.nodes:
                self.sched.drain(node, f"goodput: {diag.outcome} incident {a.incident_id}")
                self.drain_times.append(now)
            if a.kind in RESTARTS and a.job_id:
                self.sched.requeue(
                    a.job_id, a.exclude, expected_restarts=restarts, delay_s=a.delay_s
                )
                self.restarts_done[a.job_id] = self.restarts_done.get(a.job_id, 0) + 1
                key = (a.job_id, diag.cause_key)
                self.same_cause[key] = self.same_cause.get(key, 0) + 1
            elif a.kind == "stop" and a.job_id:
                self.sched.stop(a.job_id, expected_restarts=restarts)
        except (SchedulerError, ValueError) as exc:
            return f"failed: {exc}"[:300]
        return "executed"

    # ---------------------------------------------------------------- evidence
    def _context(self, inc: Incident, now: float) -> Context:
        alerts = list(inc.alerts.values())
        nodes = {str(a["node"]) for a in alerts if a.get("node")}
        if inc.node:
            nodes.add(inc.node)
        gpus = sorted({(a["node"], a["gpu"]) for a in alerts if a.get("node") and a.get("gpu")})
        return Context(
            job_id=inc.job_id,
            nodes=sorted(nodes),
            gpus=gpus,
            start=inc.opened_at - LOOKBACK_S,
            end=now,
            alerts=[{"labels": a, **a} for a in alerts],
        )

    def _evidence(self, ctx: Context, now: float) -> Bundle:
        c = self.sim.cluster
        self.sink.flush()  # the log files as they are now
        bundle = Bundle()
        facts = SlurmFacts(query="simulator scheduler API")
        job = c.jobs.get(ctx.job_id or "")
        if job is not None:
            facts.job = {
                "job_id": job.job_id,
                "name": job.name,
                "state": job.state,
                "exit_code": job.exit_code,
                "restarts": job.restarts,
                "nodes": list(job.nodes),
                "comment": job.comment,
                "argv": "GET /api/v1/scheduler/jobs/" + job.job_id,
            }
            for n in job.nodes:
                if n not in ctx.nodes:
                    ctx.nodes.append(n)
            ctx.job_name = job.name
        facts.nodes = {
            n: {"state": _sinfo_state(c.node_state(c.nodes[n])), "reason": c.nodes[n].reason}
            for n in ctx.nodes
            if n in c.nodes
        }
        bundle.extend(Bundle(slurm=facts, reports=[Report("slurm", "ok")]))
        bundle.extend(log_evidence.collect_dir(ctx, self.logdir))
        bundle.extend(self._prometheus(ctx))
        return bundle

    def _window(self, src: str, ctx: Context) -> pd.DataFrame:
        parts = [df for t, df in self.alerts.hist.get(src, ()) if ctx.start <= t <= ctx.end]
        parts = [p for p in parts if len(p)]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()

    def _prometheus(self, ctx: Context) -> Bundle:
        """The series recovery.evidence.prometheus.queries(ctx) would return."""
        out: list[Series] = []
        dcgm = self._window("dcgm", ctx)

        def add(df: pd.DataFrame, metric: str, keys: list[str], name: str | None = None) -> None:
            if df.empty or metric not in df:
                return
            sub = df[["timestamp", *keys, metric]].dropna(subset=[metric])
            for key, g in sub.groupby(keys, sort=True) if keys else [((), sub)]:
                key = key if isinstance(key, tuple) else (key,)
                lab = dict(zip(keys, key, strict=True))
                out.append(
                    Series(
                        name=name or metric,
                        points=list(
                            zip(g["timestamp"].astype(float), g[metric].astype(float), strict=True)
                        ),
                        node=lab.get("node"),
                        gpu=lab.get("gpu"),
                        job_id=lab.get("job_id") or ctx.job_id,
                        query=f"in-process:{name or metric}",
                    )
                )

        if ctx.job_id and not dcgm.empty:
            mine = dcgm[dcgm["job_id"] == ctx.job_id]
            for m in prom_evidence.DCGM_FIELDS:
                add(mine, m, ["node", "gpu"])
            jobm = self._window("jobm", ctx)
            if not jobm.empty:
                jobm = jobm[jobm["job_id"] == ctx.job_id]
                for m in prom_evidence.JOB_METRICS:
                    add(jobm, m, [])
            ns = self._window("node_score", ctx)
            if not ns.empty:
                add(ns[ns["job_id"] == ctx.job_id], "goodput_node_suspect_score", ["node"])
            gs = self._window("gpu_score", ctx)
            if not gs.empty:
                add(
                    gs[gs["job_id"] == ctx.job_id],
                    "goodput_gpu_anomaly_score",
                    ["node", "gpu", "detector"],
                )
        elif ctx.nodes and not dcgm.empty:
            for m in prom_evidence.DCGM_FIELDS:
                add(dcgm[dcgm["node"].isin(ctx.nodes)], m, ["node", "gpu"])
        if ctx.nodes:
            xid = self._window("xid", ctx)
            if not xid.empty:
                add(
                    xid[xid["node"].isin(ctx.nodes)],
                    "goodput_node_xid_errors_total",
                    ["node", "xid"],
                )
            if not dcgm.empty:
                add(
                    dcgm[dcgm["node"].isin(ctx.nodes)],
                    prom_evidence.PRESENCE,
                    ["node", "gpu"],
                    name="node_presence",
                )
        status = "ok" if out else "empty"
        return Bundle(series=out, reports=[Report("prometheus", status, "in-process history")])

"""The production loop in one process, in simulated time.

Every `interval_s` the simulator advances; its dcgm samples, its logs (read by the log-metrics
exporter's own parser) and its scheduler state (as the Slurm exporter labels it) become the
metric sources; the detector's `Engine` scores the instant exactly as the service does; the
alert conditions of alertmanager/alerts.yaml are evaluated (bench.online_alerts). From there on
it is the receiver itself (`bench.receiver`: `recovery.app.create_app`, in process through a
TestClient, on a simulated `recovery.clock.ManualClock`): the changes of the firing set are
posted to its webhook as Alertmanager would post them (version 4 JSON; a new alert `firing` with its
startsAt, an alert whose condition stopped `resolved`; an alert alertmanager.yml's inhibit rules
mute is held back while muted, `bench.inhibition`); then one pass of the production diagnosis
worker (`recovery.worker.run_once`: settle, attribution, recheck, outbox) and of the action
executor (`recovery.reconciler.reconcile`) runs at the simulated time. Evidence comes from the
simulation through `Settings.sources` (`bench.sim_sources`); actions go through
`recovery.scheduler.simulated` to the simulator's own control API (in-process: no sockets).
What the bench scores is read back from the receiver's HTTP API (incidents, diagnoses, actions).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.online_alerts import OnlineAlerts
from bench.receiver import Incident, Receiver
from bench.sim_sources import SimSources
from detector import exposition
from detector import fields as F
from detector.frame import Frame, counter_rate
from detector.pipeline import Config, Engine
from exporters.logmetrics.parser import LogState
from exporters.sim import FIELD_NAMES, Scenario, Simulation
from exporters.sim.dcgm import OFF_BUS_FIELDS
from exporters.sim.logs import LogSink
from recovery.clock import ManualClock
from recovery.scheduler.simulated import SimulatedScheduler

SACCT_WINDOW_S = 3600.0  # the Slurm exporter shows ended jobs this long
_NOT_OFF_BUS = np.array([i not in OFF_BUS_FIELDS for i in range(len(FIELD_NAMES))])


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
    """An engine `Result` as the score sources the alert conditions read (one combined series
    per GPU, as the service exposes it), and the per-job series it exports (what the detectors
    learned of each job, its pause allowance)."""
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
    per_job = [
        pd.DataFrame(cols).rename(columns={"value": name}).set_index("job_id")
        for name, cols in exposition.job_series(res).items()
    ]
    job = pd.concat(per_job, axis=1).reset_index() if per_job else pd.DataFrame()
    job.insert(0, "timestamp", now)
    return {"gpu_score": gpu, "job_score": jobs, "node_score": nodes, "job_exported": job}


# the frames each exporter gives (the scenario's gap sources)
_SOURCE = {"log": "logs", "xid": "logs", "slurm_job": "slurm", "slurm_node": "slurm"}


class Harness:
    """One scenario run. `step()` advances one interval; `run_until(t)` loops."""

    def __init__(
        self, scenario: Scenario, seed: int, workdir: Path, interval_s: float | None = None
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
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.client = TestClient(build_app(self.sim))
        self.sched = SimulatedScheduler("http://sim", session=self.client)
        self.sched.verify_timeout_s = 1.0
        self.rx = Receiver(
            workdir,
            ManualClock(self.now),
            SimSources(self.sim.cluster, self.alerts.hist, self.sink),
            self.logdir,
            self.sched,
        )
        # the evidence window reaches lookback_s before an incident's first alert
        lookback = self.rx.settings.lookback_s
        self.alerts.keep_s = max(self.alerts.keep_s, lookback + 2 * self.interval_s)
        self._job_off: dict[str, int] = {}
        self._kern_off: dict[str, int] = {}
        self.iters: dict[str, list[tuple[float, float]]] = {}  # job -> (t, iteration)
        self.running: dict[str, list[tuple[float, int]]] = {}  # job -> (t, gpus) while running
        # job -> its runs as the simulator timed them: [start, end (None: running), gpus]
        self.runs: dict[str, list[list[Any]]] = {}
        self.recovered: dict[str, float] = {}  # fault_id -> first time running again, progressing
        self._cpu_last: pd.DataFrame | None = None  # the last sample's host CPU counters

    @property
    def now(self) -> float:
        return self.sim.cluster.now

    def close(self) -> None:
        self.sink.close()
        self.client.close()
        self.rx.close()

    @property
    def incidents(self) -> list[Incident]:
        return self.rx.incidents

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
        frames = self._scraped(frames, self.sim.elapsed + self.interval_s)
        dcgm, jobm = frames["dcgm"], frames["jobm"]
        # faults due at `now` begin after this sample (Simulation.step's order: tick, then due)
        self.sim.elapsed += self.interval_s
        self.sim._due()  # noqa: SLF001
        names = {j.job_id: j.name for j in c.jobs.values()}
        det = dcgm.rename(columns={"timestamp": "time"})
        det[F.HOST_CPU] = self._host_cores(det)
        if len(det):
            prog = jobm.set_index("job_id") if len(jobm) else None
            for col in (F.LAST_PROGRESS, F.ITER_SECONDS, F.LAST_PAUSE):
                det[col] = det["job_id"].map(prog[col]) if prog is not None else np.nan
        frame = Frame.from_dataframe(det)
        res = self.engine.step(frame, now, names)
        self.engine.end_jobs(set(pd.unique(frame.job)) - {""}, now)  # as the service does
        frames.update(score_frames(res, now))
        self.alerts.add(now, frames)
        self._track(now)
        self.rx.step(now, self.alerts.firing(now))

    def _scraped(self, frames: dict[str, pd.DataFrame], t: float) -> dict[str, pd.DataFrame]:
        """The frames Prometheus got at scenario time `t`: an unscraped exporter's (the
        scenario's gaps) are empty, its series stale, as after a failed scrape."""
        gaps = self.sim.scenario
        return {
            name: df.iloc[0:0] if gaps.unscraped(_SOURCE.get(name, name), t) else df
            for name, df in frames.items()
        }

    def run_until(self, t: float) -> None:
        while self.now + 1e-6 < t:
            self.step()

    # ---------------------------------------------------------------- metric sources
    def _node_job(self) -> dict[str, str]:
        return {n.name: n.jobs[0] for n in self.sim.cluster.nodes.values() if len(n.jobs) == 1}

    def _host_cores(self, det: pd.DataFrame) -> np.ndarray:
        """Each GPU's host CPU counter as the service reads it, irate(): its increase since
        the GPU's previous sample, per second (NaN at its first)."""
        cols = ["time", "node", "gpu", F.HOST_CPU_COUNTER]
        last, self._cpu_last = self._cpu_last, det[cols]
        if not len(det):
            return np.full(0, np.nan)
        both = pd.concat([x for x in (last, det[cols]) if x is not None and len(x)])
        rate = counter_rate(
            both["time"].to_numpy(dtype=float),
            both["node"].to_numpy(dtype=object),
            pd.to_numeric(both["gpu"]).to_numpy(dtype=float),
            both[F.HOST_CPU_COUNTER].to_numpy(dtype=float),
        )
        return rate[len(both) - len(det) :]

    def _dcgm(self, now: float) -> pd.DataFrame:
        gpus = [g for n in self.sim.cluster.nodes.values() if n.alive for g in n.gpus]
        if not gpus:
            return pd.DataFrame(
                columns=["timestamp", "node", "gpu", "job_id", "modelName", *FIELD_NAMES]
            )
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
        df.insert(4, "modelName", [g.model_name for g in gpus])  # as dcgm-exporter labels it
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
    def _track_runs(self, j: Any) -> None:
        """A job's runs with the simulator's start and end times (a run ends when the job
        fails, ends, or a scheduler verb requeues, holds or cancels it)."""
        runs = self.runs.setdefault(j.job_id, [])
        last = runs[-1] if runs else None
        if last is not None and last[1] is None:
            if j.state != "RUNNING" or j.start_t != last[0]:  # ended (and maybe ran again)
                end = j.end_t if last[0] <= j.end_t else self.now
                last[1] = min(end, j.start_t) if j.state == "RUNNING" else end
        if j.state == "RUNNING" and (not runs or runs[-1][0] != j.start_t):
            runs.append([j.start_t, None, len(j.alloc)])

    def _track(self, now: float) -> None:
        c = self.sim.cluster
        for j in c.jobs.values():
            if j.state == "RUNNING":
                self.iters.setdefault(j.job_id, []).append((now, j.iteration))
                self.running.setdefault(j.job_id, []).append((now, len(j.alloc)))
            self._track_runs(j)
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

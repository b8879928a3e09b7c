"""The detector service: every interval, a FIXED set of Prometheus queries (independent of the
number of jobs), one engine step, and the scores on /metrics (127.0.0.1:19420 by default).

Queries per cycle: one for all DCGM fields (`{__name__=~"DCGM_FI_...|..."}`), one for the
job -> node join (`goodput_slurm_job_node_info`), one each for the job's last progress,
iteration seconds and last pause start. Prometheus down: the cycle's scores are withdrawn
(they go stale), `goodput_detector_query_errors_total` rises, and the loop carries on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from catalogue import promql
from detector import fields as F
from detector.baselines import BaselineStore
from detector.frame import JOB_RE, NODE_RE, Frame, FrameError
from detector.pipeline import Config, Engine, Result
from detector.promclient import PromClient, PromError

log = logging.getLogger("goodput.detector")
NODE_INFO = "goodput_slurm_job_node_info"


@dataclass
class ServiceConfig:
    prometheus_url: str = "http://127.0.0.1:19090"
    host: str = "127.0.0.1"
    port: int = 19420
    interval_s: float = 5.0
    host_map: dict[str, str] | None = None


def fetch(
    client: PromClient, host_map: dict[str, str] | None = None, now: float | None = None
) -> tuple[Frame, dict[str, str]]:
    """Query Prometheus (fixed query count) and build this instant's frame + job names."""
    now = time.time() if now is None else now
    dcgm = client.query(promql.selector(__name__=(*F.DCGM_FIELDS, *F.ALIASES)))
    info = client.query(NODE_INFO)
    progress = client.query(f"max by (job_id) ({F.LAST_PROGRESS})")
    iters = client.query(f"max by (job_id) ({F.ITER_SECONDS})")
    pauses = client.query(f"max by (job_id) ({F.LAST_PAUSE})")
    node_jobs: dict[str, set[str]] = {}
    names: dict[str, str] = {}
    for labels, _ in info:
        job, node = labels.get("job_id", ""), labels.get("node", "")
        if JOB_RE.match(job) and NODE_RE.match(node):
            node_jobs.setdefault(node, set()).add(job)
            names[job] = labels.get("job_name") or job
    rows: dict[tuple[str, str, str], dict[str, float | str]] = {}
    mapped = {lab.get("Hostname") or lab.get("hostname") for lab, _ in dcgm if lab.get("hpc_job")}
    for labels, value in dcgm:
        host = labels.get("Hostname") or labels.get("hostname") or ""
        node = (host_map or {}).get(host, host)
        gpu = labels.get("gpu", "")
        job = labels.get("hpc_job") or ""
        # join by node when unambiguous and the node has no job mapping (with mapping on, an
        # unlabelled GPU is one no job uses: a 1-GPU job leaves the node's others idle)
        if not job and host not in mapped and len(node_jobs.get(node, ())) == 1:
            job = next(iter(node_jobs[node]))
        if not (NODE_RE.match(node) and gpu.isdigit()) or (job and not JOB_RE.match(job)):
            continue  # invalid labels never reach the engine
        row = rows.setdefault(
            (node, gpu, job),
            {"time": now, "node": node, "gpu": gpu, "job_id": job, "modelName": ""},
        )
        row[labels["__name__"]] = value
        row["modelName"] = labels.get("modelName", "")[:128] or row["modelName"]
    prog = {lab.get("job_id"): v for lab, v in progress}
    it = {lab.get("job_id"): v for lab, v in iters}
    pause = {lab.get("job_id"): v for lab, v in pauses}
    df = (
        pd.DataFrame(list(rows.values()), columns=["time", "node", "gpu", "job_id"])
        if not rows
        else pd.DataFrame(list(rows.values()))
    )
    if len(df):
        df[F.LAST_PROGRESS] = df["job_id"].map(prog).astype(float)
        df[F.ITER_SECONDS] = df["job_id"].map(it).astype(float)
        df[F.LAST_PAUSE] = df["job_id"].map(pause).astype(float)
    return Frame.from_dataframe(df), names


class Scores(Collector):
    """Exposes the latest cycle; `goodput_*` names as in docs/contracts.md."""

    def __init__(self) -> None:
        self.result: Result | None = None
        self.cycle_seconds = 0.0
        self.series = 0
        self.errors = 0
        self.last_cycle = 0.0
        self.lock = threading.Lock()

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        with self.lock:
            res = self.result
            yield GaugeMetricFamily(
                "goodput_detector_cycle_seconds",
                "Duration of the last detector cycle.",
                self.cycle_seconds,
            )
            yield GaugeMetricFamily(
                "goodput_detector_series_scored",
                "GPU series scored in the last cycle.",
                self.series,
            )
            yield CounterMetricFamily(
                "goodput_detector_query_errors", "Failed Prometheus queries or cycles.", self.errors
            )
            yield GaugeMetricFamily(
                "goodput_detector_last_cycle_timestamp_seconds",
                "Unix time of the last successful cycle.",
                self.last_cycle,
            )
        if res is None:
            return
        gpu = GaugeMetricFamily(
            "goodput_gpu_anomaly_score",
            "Per-GPU anomaly score; 1.0 is the nominal alarm level (alert thresholds are tuned).",
            labels=["job_id", "node", "gpu", "detector"],
        )
        f = res.frame
        on_job = np.flatnonzero(f.job != "")
        for d, name in enumerate(res.detectors):
            col = res.gpu[:, d]
            for i in on_job:
                gpu.add_metric([f.job[i], f.node[i], str(f.gpu[i]), name], float(col[i]))
        yield gpu
        job = GaugeMetricFamily(
            "goodput_job_anomaly_score",
            "Per-job anomaly score (detector=combined is the max).",
            labels=["job_id", "detector"],
        )
        for r in res.jobs.itertuples():
            job.add_metric([r.job_id, r.detector], float(r.score))
        yield job
        node = GaugeMetricFamily(
            "goodput_node_suspect_score",
            "How strongly a node is suspected in a job; 1.0 = threshold.",
            labels=["job_id", "node"],
        )
        for r in res.nodes.itertuples():
            node.add_metric([r.job_id, r.node], float(r.score))
        yield node


class Service:
    def __init__(
        self,
        cfg: ServiceConfig,
        engine_cfg: Config | None = None,
        store: BaselineStore | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.cfg = cfg
        self.client = PromClient(cfg.prometheus_url)
        ecfg = engine_cfg or Config()
        ecfg.interval_s = cfg.interval_s
        self.engine = Engine(ecfg, store or BaselineStore())
        self.scores = Scores()
        self.registry = registry or CollectorRegistry()
        self.registry.register(self.scores)
        self.stop = threading.Event()

    def cycle(self, now: float | None = None) -> bool:
        """One query-score-publish cycle; never raises on bad input or a down Prometheus."""
        t0 = time.perf_counter()
        try:
            frame, names = fetch(self.client, self.cfg.host_map, now)
            res = self.engine.step(
                frame, float(frame.time[0]) if len(frame) else time.time(), names
            )
            self.engine.end_jobs(set(pd.unique(frame.job)) - {""})
        except (PromError, FrameError, ValueError, KeyError) as exc:
            log.warning("detector cycle failed: %s", exc)
            with self.scores.lock:
                self.scores.errors += 1
                self.scores.result = None  # scores go stale rather than lie
            return False
        with self.scores.lock:
            self.scores.result = res
            self.scores.series = len(frame)
            self.scores.cycle_seconds = time.perf_counter() - t0
            self.scores.last_cycle = time.time()
        return True

    def serve(self) -> None:
        start_http_server(self.cfg.port, addr=self.cfg.host, registry=self.registry)
        log.info(
            "detector on %s:%d, Prometheus %s, every %.1fs",
            self.cfg.host,
            self.cfg.port,
            self.cfg.prometheus_url,
            self.cfg.interval_s,
        )
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                self.cycle()
            except Exception:  # noqa: BLE001 - the loop must survive anything
                log.exception("unexpected error in a detector cycle")
                with self.scores.lock:
                    self.scores.errors += 1
            self.stop.wait(max(0.0, self.cfg.interval_s - (time.monotonic() - started)))

"""The detector service: every interval, a FIXED set of Prometheus queries (independent of the
number of jobs and GPUs), one engine step, and the scores on /metrics (127.0.0.1:19420).

Queries per cycle: one per DCGM field the engine reads, aggregated by Prometheus down to one
label (`max by` of node, gpu and job joined: the answer holds only what the engine reads),
`goodput_slurm_job_node_info` (job -> node where dcgm has no `hpc_job`), and the jobs' last
progress, iteration seconds and last pause (checkpoint save, start-up). With `--shard K/N`
every query selects `goodput_shard="K"`, the label Prometheus computes at scrape time (hashmod
of `hpc_job` / `job_id`), so a job's GPUs are always scored together and each replica's work is
O(its GPUs). Prometheus down: the scores are withdrawn (stale),
`goodput_detector_query_errors_total` rises, the loop goes on.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pandas as pd
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from catalogue import promql
from clients.prometheus import PromClient, PromError, column, samples
from detector import exposition
from detector import fields as F
from detector.baselines import BaselineStore
from detector.frame import JOB_RE, NODE_RE, Frame, FrameError
from detector.pipeline import Config, Engine
from detector.thresholds import level

log = logging.getLogger("goodput.detector")
NODE_INFO = "goodput_slurm_job_node_info"
KEY = "gpukey"  # the one label of the per-GPU answers: Hostname,hostname,gpu,hpc_job,modelName
PHASES = ("fetch", "score", "render")
PER_JOB = (F.LAST_PROGRESS, F.ITER_SECONDS, F.LAST_PAUSE)  # log-derived, one value per job


@dataclass(frozen=True)
class Shard:
    """This replica's share: jobs whose `goodput_shard` label is `index` (of `count`)."""

    index: int
    count: int

    @staticmethod
    def parse(text: str) -> Shard:
        k, sep, n = text.partition("/")
        if not (sep and k.isdigit() and n.isdigit() and 0 <= int(k) < int(n) <= 4096):
            raise ValueError(f"shard {text!r}: want K/N with 0 <= K < N <= 4096")
        return Shard(int(k), int(n))

    def owns(self, job_id: str) -> bool:
        """Prometheus' hashmod: md5 of the value, its low 8 bytes big-endian, mod N."""
        digest = hashlib.md5(job_id.encode(), usedforsecurity=False).digest()
        return int.from_bytes(digest[8:], "big") % self.count == self.index


@dataclass
class ServiceConfig:
    prometheus_url: str = "http://127.0.0.1:19090"
    host: str = "127.0.0.1"
    port: int = 19420
    interval_s: float = 5.0
    host_map: dict[str, str] | None = None
    shard: Shard | None = None


def queries(shard: Shard | None = None) -> dict[str, str]:
    """field -> PromQL, for this cycle's fixed set (the DCGM fields, node info, progress)."""
    # a shard reads its jobs' GPUs and the GPUs with no job (no label: matched by "")
    gpu_sel: dict[str, Any] = {"goodput_shard": [str(shard.index), ""]} if shard else {}
    job_sel = {"goodput_shard": str(shard.index)} if shard else {}
    labels = ", ".join(promql.quote(n) for n in ("Hostname", "hostname", "gpu", "hpc_job"))
    spelled = {name: [name] for name in F.DCGM_FIELDS}  # a field and its other names
    for alias, name in F.ALIASES.items():
        spelled[name].append(alias)
    out = {
        name: f"max by ({KEY}) (label_join({promql.selector(__name__=names, **gpu_sel)}, "
        f'"{KEY}", ",", {labels}, "modelName"))'
        for name, names in spelled.items()
    }
    out[NODE_INFO] = promql.selector(NODE_INFO, **job_sel)
    for name in PER_JOB:
        out[name] = f"max by (job_id) ({promql.selector(name, **job_sel)})"
    return out


def _per_job(result: list[Any]) -> dict[str, float]:
    jobs, vals = column(result, "job_id")
    return dict(zip(jobs, vals.tolist(), strict=True))


def fetch(
    client: PromClient,
    host_map: dict[str, str] | None = None,
    now: float | None = None,
    shard: Shard | None = None,
) -> tuple[Frame, dict[str, str]]:
    """Query Prometheus (fixed query count) and build this instant's frame + job names."""
    now = time.time() if now is None else now
    qs = queries(shard)
    rows = _Rows(_LAST_SPLIT[0][0] if _LAST_SPLIT[0] is not None else [])
    small = (NODE_INFO, *PER_JOB)  # asked first: their answers wait while the fields decode
    answers = client.raw_many([qs[n] for n in small] + [qs[n] for n in F.DCGM_FIELDS])
    info, *per_job_raw = [next(answers) for _ in small]
    for name, result in zip(F.DCGM_FIELDS, answers, strict=True):
        rows.add(F.ALL_FIELDS.index(name), *column(result, KEY))
    node_jobs: dict[str, set[str]] = {}
    names: dict[str, str] = {}
    for labels, _ in samples(info):
        j, h = labels.get("job_id", ""), labels.get("node", "")
        if JOB_RE.match(j) and NODE_RE.match(h):
            node_jobs.setdefault(h, set()).add(j)
            names[j] = labels.get("job_name") or j
    per_job = {name: _per_job(r) for name, r in zip(PER_JOB, per_job_raw, strict=True)}
    values = rows.values()
    lab = _split(rows.keys, host_map, node_jobs)
    jcodes, juniq = lab.jobs

    def by_job(name: str) -> np.ndarray:
        return np.array([per_job[name].get(j, np.nan) for j in juniq], dtype=float)[jcodes]

    last, pause = by_job(F.LAST_PROGRESS), by_job(F.LAST_PAUSE)
    values[:, F.ALL_FIELDS.index(F.ITER_SECONDS)] = by_job(F.ITER_SECONDS)
    values[:, F.ALL_FIELDS.index(F.STALL_SECONDS)] = np.maximum(now - last, 0.0)
    with np.errstate(invalid="ignore"):  # seconds since the job's last pause (save, start-up)
        values[:, F.ALL_FIELDS.index(F.SINCE_PAUSE)] = np.where(pause <= now, now - pause, np.nan)
    rows_of, template = lab.frame
    return template.with_values(np.full(len(template), now), values[rows_of]), names


class _Rows:
    """One row per distinct key over the fields' answers. Prometheus answers every field in
    the same series order, so a field whose keys equal the last one's reuses its codes (one
    list comparison); any other order is indexed."""

    def __init__(self, last: list[Any]) -> None:
        self.keys: list[Any] = []
        self.index = pd.Index([], dtype=object)
        self.parts: list[tuple[int, np.ndarray, np.ndarray]] = []
        self.last = last  # the last cycle's keys: a first answer in that order keeps them
        self._last: tuple[list[Any], np.ndarray] = ([], np.zeros(0, dtype=np.int64))

    def add(self, col: int, keys: list[Any], vals: np.ndarray) -> None:
        if not self.keys and self.last and keys == self.last:
            self.keys = self.last
            self.index = pd.Index(self.keys, dtype=object)
            self._last = (keys, np.arange(len(keys)))
        if keys == self._last[0]:
            codes = self._last[1]
        else:
            codes = self.index.get_indexer(keys) if len(self.index) else np.full(len(keys), -1)
            new = np.flatnonzero(codes < 0)
            if len(new):
                inv, fresh = pd.factorize(np.array(keys, dtype=object)[new])
                codes[new] = len(self.keys) + inv
                self.keys += fresh.tolist()
                self.index = pd.Index(self.keys, dtype=object)
            self._last = (keys, codes)
        self.parts.append((col, codes, vals))

    def values(self) -> np.ndarray:
        out = np.full((len(self.keys), len(F.ALL_FIELDS)), np.nan)
        for col, codes, vals in self.parts:
            out[codes, col] = vals
        return out


class _Split:
    """The answers' rows split into labels (`_labels`), with what depends on them alone: the
    jobs' codes and the frame's validated, sorted rows (`frame`)."""

    def __init__(self, keys: list[Any], host_map: dict[str, str] | None, node_jobs) -> None:
        self.node, self.gpu, self.job, self.model = _labels(
            np.array(keys, dtype=object), host_map, node_jobs
        )
        for a in (self.node, self.gpu, self.job, self.model):
            a.setflags(write=False)

    @cached_property
    def jobs(self) -> tuple[np.ndarray, np.ndarray]:
        return pd.factorize(self.job)

    @cached_property
    def frame(self) -> tuple[np.ndarray, Frame]:
        """(the answer rows the frame takes, in its order; the frame with no values yet)."""
        ok = np.flatnonzero(self.node != "")
        n = len(ok)
        probe = Frame.from_columns(  # the row numbers ride along as values to learn the order
            np.zeros(n), self.node[ok], self.gpu[ok].astype(float), self.job[ok],
            ok[:, None].astype(float), model=self.model[ok],
        )  # fmt: skip
        rows = probe.values[:, 0].astype(np.int64)
        template = probe.with_values(probe.time, np.zeros((n, len(F.ALL_FIELDS))))
        template.job_codes, template.node_codes, template.job_groups  # noqa: B018 - shared
        return rows, template


_LAST_SPLIT: list[Any] = [None]  # (keys, host map, node jobs, split): the last `_split`


def _split(
    keys: list[Any], host_map: dict[str, str] | None, node_jobs: dict[str, set[str]]
) -> _Split:
    """`_Split` of the keys, reused while the keys, the host map and the job -> node join are
    those of the last call (as from one cycle to the next in steady state: the split and the
    frame's sort were a fifth of a cycle at 10,000 GPUs). Its arrays are read-only."""
    last = _LAST_SPLIT[0]
    if last is not None and last[0] == keys and last[1] == host_map and last[2] == node_jobs:
        return last[3]
    out = _Split(keys, host_map, node_jobs)
    _LAST_SPLIT[0] = (keys, dict(host_map) if host_map else host_map, node_jobs, out)
    return out


def _labels(
    keys: np.ndarray, host_map: dict[str, str] | None, node_jobs: dict[str, set[str]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Split the joined keys (one per GPU row) into node, gpu, job, model; an invalid row gets
    node "" (dropped: invalid labels never reach the engine). A row without `hpc_job` takes its
    node's job when the node runs exactly one and has no job mapping (with mapping on, an
    unlabelled GPU is one no job uses: a 1-GPU job leaves the node's other GPUs idle)."""
    blank = ["", "", "", "", ""]
    split = [
        p if len(p) == 5 else blank
        for p in (k.split(",", 4) if isinstance(k, str) else blank for k in keys.tolist())
    ]
    host = np.array([p[0] or p[1] for p in split], dtype=object)
    gpu_s = np.array([p[2] for p in split], dtype=object)
    job = np.array([p[3] for p in split], dtype=object)
    model = np.array([p[4][:128] for p in split], dtype=object)
    hcodes, huniq = pd.factorize(host)
    mapped_hosts = np.zeros(len(huniq) + 1, dtype=bool)
    mapped_hosts[hcodes[job != ""]] = True
    mapped = [(host_map or {}).get(h, h) for h in huniq.tolist()]
    only = [
        next(iter(node_jobs[m])) if len(node_jobs.get(m, ())) == 1 and not mapped_hosts[i] else ""
        for i, m in enumerate(mapped)
    ]
    valid = np.array([bool(m) and NODE_RE.match(m) is not None for m in mapped] + [False])
    node = np.array(mapped + [""], dtype=object)[hcodes]
    joined = np.array(only + [""], dtype=object)[hcodes]
    job = np.where(job == "", joined, job)
    gcodes, guniq = pd.factorize(gpu_s)
    gnum = np.array([int(g) if g.isdigit() and len(g) <= 3 else -1 for g in guniq] + [-1])
    gpu = gnum[gcodes]
    jcodes, juniq = pd.factorize(job)
    jvalid = np.array([j == "" or JOB_RE.match(j) is not None for j in juniq] + [False])
    ok = valid[hcodes] & (gpu >= 0) & jvalid[jcodes]
    return np.where(ok, node, ""), np.where(ok, gpu, 0), np.where(ok, job, ""), model


@contextmanager
def no_gc() -> Iterator[None]:
    """The cyclic garbage collector paused: decoding an answer allocates millions of objects
    (none in a cycle: reference counting frees them), and the collections those allocations
    trigger cost 5-10x the decoding itself (bench/results/scale.md)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Scores(Collector):
    """The service's own health; the score families are rendered per cycle (exposition.py)."""

    def __init__(self, shard: Shard | None = None) -> None:
        self.text = b""  # the cycle's score families; b"" = withdrawn
        self.cycle_seconds = 0.0
        self.phases = dict.fromkeys(PHASES, 0.0)
        self.phases_cpu = dict.fromkeys(PHASES, 0.0)  # this thread's CPU seconds (not exposed)
        self.series = 0
        self.errors = 0
        self.last_cycle = 0.0
        self.shard = shard
        self.lock = threading.Lock()

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        with self.lock:
            yield GaugeMetricFamily(
                "goodput_detector_cycle_seconds",
                "Duration of the last detector cycle.",
                self.cycle_seconds,
            )
            phase = GaugeMetricFamily(
                "goodput_detector_cycle_phase_seconds",
                "The last cycle's time per phase (fetch: queries and frame; score; render).",
                labels=["phase"],
            )
            for name, seconds in self.phases.items():
                phase.add_metric([name], seconds)
            yield phase
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
            info = GaugeMetricFamily(
                "goodput_detector_shard_info",
                "This replica's shard (K of N); shard=all when it scores every job.",
                labels=["shard", "shards"],
            )
            sh = self.shard
            info.add_metric([str(sh.index), str(sh.count)] if sh else ["all", "1"], 1.0)
            yield info


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
        self.scores = Scores(cfg.shard)
        self.registry = registry or CollectorRegistry()
        self.registry.register(self.scores)
        self.gpu_level = level("gpu")
        self.renderer = exposition.Renderer()
        self.stop = threading.Event()

    def cycle(self, now: float | None = None) -> bool:
        """One query-score-publish cycle; never raises on bad input or a down Prometheus."""
        with no_gc():
            return self._cycle(now)

    def _cycle(self, now: float | None) -> bool:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            frame, names = fetch(self.client, self.cfg.host_map, now, self.cfg.shard)
            t1, c1 = time.perf_counter(), time.thread_time()
            res = self.engine.step(
                frame, float(frame.time[0]) if len(frame) else time.time(), names
            )
            self.engine.end_jobs(set(frame.job_codes[1].tolist()) - {""})
            t2, c2 = time.perf_counter(), time.thread_time()
            text = self.renderer.render(res, self.gpu_level)
        except (PromError, FrameError, ValueError, KeyError) as exc:
            log.warning("detector cycle failed: %s", exc)
            with self.scores.lock:
                self.scores.errors += 1
                self.scores.text = b""  # scores go stale rather than lie
            return False
        t3, c3 = time.perf_counter(), time.thread_time()
        with self.scores.lock:
            self.scores.text = text
            self.scores.series = len(frame)
            self.scores.cycle_seconds = t3 - t0
            self.scores.phases = {"fetch": t1 - t0, "score": t2 - t1, "render": t3 - t2}
            self.scores.phases_cpu = {"fetch": c1 - c0, "score": c2 - c1, "render": c3 - c2}
            self.scores.last_cycle = time.time()
        return True

    def exposition(self) -> bytes:
        """What /metrics answers: the health families, then the cycle's scores."""
        with self.scores.lock:
            text = self.scores.text
        return generate_latest(self.registry) + text

    def serve(self) -> None:
        server = ThreadingHTTPServer((self.cfg.host, self.cfg.port), _handler(self))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        log.info(
            "detector on %s:%d, Prometheus %s, every %.1fs, shard %s",
            self.cfg.host,
            self.cfg.port,
            self.cfg.prometheus_url,
            self.cfg.interval_s,
            f"{self.cfg.shard.index}/{self.cfg.shard.count}" if self.cfg.shard else "all",
        )
        try:
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    self.cycle()
                except Exception:  # noqa: BLE001 - the loop must survive anything
                    log.exception("unexpected error in a detector cycle")
                    with self.scores.lock:
                        self.scores.errors += 1
                self.stop.wait(max(0.0, self.cfg.interval_s - (time.monotonic() - started)))
        finally:
            server.shutdown()
            server.server_close()


def _handler(service: Service) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                self.send_error(404)
                return
            body = service.exposition()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler

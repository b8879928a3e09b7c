"""The detector service: every interval, the fixed set of Prometheus queries (`ingest`), one
engine step, and the scores on /metrics (127.0.0.1:19420). Prometheus down: the scores are
withdrawn (stale), `goodput_detector_query_errors_total` rises, the loop goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from clients.prometheus import PromClient, PromError
from detector import exposition
from detector.baselines import BaselineStore
from detector.frame import FrameError
from detector.ingest import Shard, fetch, no_gc
from detector.pipeline import Config, Engine
from detector.thresholds import level

log = logging.getLogger("goodput.detector")
PHASES = ("fetch", "score", "render")


@dataclass
class ServiceConfig:
    prometheus_url: str = "http://127.0.0.1:19090"
    host: str = "127.0.0.1"
    port: int = 19420
    interval_s: float = 5.0
    host_map: dict[str, str] | None = None
    shard: Shard | None = None


class Scores(Collector):
    """The service's own health; the score families are rendered per cycle (exposition.py)."""

    def __init__(self, shard: Shard | None = None) -> None:
        self.text = b""  # the cycle's score families; b"" = withdrawn
        self.cycle_seconds = 0.0
        self.phases = dict.fromkeys(PHASES, 0.0)
        self.phases_cpu = dict.fromkeys(PHASES, 0.0)  # this thread's CPU seconds (not exposed)
        self.series = 0
        self.errors = 0
        self.baseline_errors = 0  # the store's, read at each cycle's end
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
            yield CounterMetricFamily(
                "goodput_detector_baseline_errors",
                "Baselines not saved or not loaded (a full disk, a bad file; see the log).",
                self.baseline_errors,
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
        self.store = store or BaselineStore(background=True)
        self.engine = Engine(ecfg, self.store)
        self.scores = Scores(cfg.shard)
        self.registry = registry or CollectorRegistry()
        self.registry.register(self.scores)
        self.gpu_level = level("gpu")
        self.renderer = exposition.Renderer()
        self.stop = threading.Event()

    def cycle(self, now: float | None = None) -> bool:
        """One query-score-publish cycle; never raises on bad input or a down Prometheus. The
        baselines it saves are written after it (`BaselineStore.busy`)."""
        with no_gc(), self.store.busy():
            return self._cycle(now)

    def _cycle(self, now: float | None) -> bool:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            frame, names = fetch(self.client, self.cfg.host_map, now, self.cfg.shard)
            t1, c1 = time.perf_counter(), time.thread_time()
            now_s = float(frame.time[0]) if len(frame) else time.time()
            res = self.engine.step(frame, now_s, names)
            self.engine.end_jobs(set(frame.job_codes[1].tolist()) - {""}, now_s)
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
            self.scores.baseline_errors = self.store.error_count
        return True

    def guarded_cycle(self) -> bool:
        """`cycle`, surviving anything: an unexpected error counts, and leaves the scores
        stale (none exposed) as an expected one does, rather than the last cycle's."""
        try:
            return self.cycle()
        except Exception:  # noqa: BLE001 - the loop must survive anything
            log.exception("unexpected error in a detector cycle")
            with self.scores.lock:
                self.scores.errors += 1
                self.scores.text = b""
            return False

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
                self.guarded_cycle()
                self.stop.wait(max(0.0, self.cfg.interval_s - (time.monotonic() - started)))
        finally:
            server.shutdown()
            server.server_close()
            if not self.store.flush(10.0):
                log.warning("%d baselines not saved at exit", self.store.pending)


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

"""The log-metrics exporter: job output and kernel logs -> Prometheus metrics on :19411.

Follows `$GOODPUT_LOG_DIR/jobs/slurm-<job_id>.out` (job id from the file name) and
`$GOODPUT_LOG_DIR/kernel/<node>.log` (node from the file name); files whose names do not give
a valid job id / node are ignored. A job's series live as long as its log file: deleting the
file (log retention) removes them. A background thread polls the files; `collect()` reads the
state at scrape time. An optional `on_lines(kind, key, lines)` hook (e.g. the Loki shipper)
receives every batch of lines; it must not block.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from catalogue import names
from exporters.logmetrics.parser import JOB_ID, NODE, LogState
from exporters.logmetrics.tailer import DirectoryFollower, TailStats

log = logging.getLogger(__name__)
DEFAULT_PORT = 19411
JOB_FILE = re.compile(rf"\Aslurm-(?P<job_id>{names.JOB_ID_PATTERN})\.out\Z")
KERNEL_FILE = re.compile(rf"\A(?P<node>{names.NODE_PATTERN})\.log\Z")

LineHook = Callable[[str, str, list[str]], None]


def default_log_dir() -> Path:
    env = os.environ.get("GOODPUT_LOG_DIR")
    if env:
        return Path(env)
    stack = os.environ.get("GOODPUT_STACK_DIR", "/tmp/goodput-stack")  # noqa: S108
    return Path(stack) / "logs" / "cluster"


class LogMetrics(Collector):
    """Owns the followers and the state; `poll_once()` reads, `collect()` exposes."""

    def __init__(
        self, log_dir: Path, from_end: bool = False, on_lines: LineHook | None = None
    ) -> None:
        self.log_dir = Path(log_dir)
        self.state = LogState()
        self.jobs = DirectoryFollower(self.log_dir / "jobs", "slurm-*.out", from_end)
        self.kernel = DirectoryFollower(self.log_dir / "kernel", "*.log", from_end)
        self.on_lines = on_lines
        self.ignored_files: set[str] = set()
        self.poll_seconds = 0.0
        self._lock = threading.Lock()

    def poll_once(self, now: float | None = None) -> int:
        """Read every followed file once; returns the number of lines read."""
        start = time.perf_counter()
        wall = time.time() if now is None else now
        count = 0
        for kind, follower, rx in (
            ("job", self.jobs, JOB_FILE),
            ("kernel", self.kernel, KERNEL_FILE),
        ):
            batches = follower.poll()
            for path, lines in batches:
                m = rx.match(path.name)
                if m is None:
                    self.ignored_files.add(path.name)
                    continue
                key = m.group(1)
                ts = min(wall, _mtime(path, wall))
                try:
                    with self._lock:
                        if kind == "job":
                            self.state.feed_job(key, lines, ts)
                        else:
                            self.state.feed_kernel(key, lines, ts)
                except Exception:  # one file's batch: the other files' and the hook go on
                    log.exception("reading %s failed: its batch is skipped", path.name)
                count += len(lines)
                if self.on_lines is not None:
                    try:
                        self.on_lines(kind, key, lines)
                    except Exception:  # a hook must never stop the tailer
                        log.exception("on_lines hook failed")
            if kind == "job":  # a deleted job log takes its series with it
                for path in follower.dropped:
                    m = rx.match(path.name)
                    if m is not None:
                        with self._lock:
                            self.state.forget_job(m.group(1))
        self.poll_seconds = time.perf_counter() - start
        return count

    def run(self, stop: threading.Event, interval: float = 0.5) -> None:
        while not stop.is_set():
            try:
                self.poll_once()
            except Exception:  # keep following whatever one bad poll did
                log.exception("log poll failed")
            stop.wait(interval)

    def tail_stats(self) -> TailStats:
        total = TailStats()
        total.add(self.jobs.retired)
        total.add(self.kernel.retired)
        for follower in (*self.jobs.followers.values(), *self.kernel.followers.values()):
            total.add(follower.stats)
        return total

    def collect(self) -> Iterator:
        with self._lock:
            yield from self._collect()

    def _collect(self) -> Iterator:
        s = self.state
        progress = GaugeMetricFamily(
            "goodput_job_last_progress_timestamp_seconds",
            "When the job (rank, where the line says it) last logged training progress.",
            labels=["job_id", "rank"],
        )
        gauges = {
            "iteration": GaugeMetricFamily(
                "goodput_job_iteration", "Last training iteration logged.", labels=["job_id"]
            ),
            "iteration_seconds": GaugeMetricFamily(
                "goodput_job_iteration_seconds",
                "Last logged time per iteration.",
                labels=["job_id"],
            ),
            "throughput": GaugeMetricFamily(
                "goodput_job_throughput_samples_per_second",
                "Samples per second (logged, or global batch / iteration time).",
                labels=["job_id"],
            ),
            "loss": GaugeMetricFamily("goodput_job_loss", "Last logged loss.", labels=["job_id"]),
            "last_checkpoint": GaugeMetricFamily(
                "goodput_job_last_checkpoint_timestamp_seconds",
                "When the job last logged a saved checkpoint.",
                labels=["job_id"],
            ),
            "last_pause": GaugeMetricFamily(
                "goodput_job_last_pause_timestamp_seconds",
                "When the job last logged a line that begins a pause (checkpoint, start-up).",
                labels=["job_id"],
            ),
        }
        nan = CounterMetricFamily(
            "goodput_job_nan_iterations", "Iterations with a NaN/Inf loss.", labels=["job_id"]
        )
        skipped = CounterMetricFamily(
            "goodput_job_skipped_iterations", "Iterations skipped (logged).", labels=["job_id"]
        )
        for job_id, job in s.jobs.items():
            for rank, ts in job.last_progress.items():
                progress.add_metric([job_id, rank], ts)
            for attr, family in gauges.items():
                value = getattr(job, attr)
                if value is not None:
                    family.add_metric([job_id], value)
            if job.last_progress:
                nan.add_metric([job_id], job.nan_iterations)
                skipped.add_metric([job_id], job.skipped_iterations)
        patterns = CounterMetricFamily(
            "goodput_log_pattern_matches",
            "Log lines matching a catalogue pattern (job_id empty for kernel logs).",
            labels=["job_id", "node", "pattern"],
        )
        for (job_id, node, pattern), n in s.pattern_matches.items():
            patterns.add_metric([job_id, node, pattern], n)
        xids = CounterMetricFamily(
            "goodput_node_xid_errors",
            "NVRM Xid lines in the node's kernel log.",
            labels=["node", "xid"],
        )
        for (node, xid), n in s.xids.items():
            xids.add_metric([node, xid], n)
        lines = CounterMetricFamily("goodput_log_lines", "Log lines read.", labels=["source"])
        for source in ("job", "kernel"):
            lines.add_metric([source], s.lines.get(source, 0.0))
        t = self.tail_stats()
        truncated = CounterMetricFamily(
            "goodput_log_lines_truncated", "Huge lines cut at the line-length limit."
        )
        truncated.add_metric([], t.truncated_lines)
        errors = CounterMetricFamily("goodput_log_read_errors", "File read errors.")
        errors.add_metric([], t.read_errors)
        files = GaugeMetricFamily(
            "goodput_log_files_followed", "Files being followed.", labels=["source"]
        )
        files.add_metric(["job"], len(self.jobs.followers))
        files.add_metric(["kernel"], len(self.kernel.followers))
        poll = GaugeMetricFamily("goodput_log_poll_seconds", "Duration of the last poll.")
        poll.add_metric([], self.poll_seconds)
        yield progress
        yield from gauges.values()
        yield from (nan, skipped, patterns, xids, lines, truncated, errors, files, poll)


def _mtime(path: Path, default: float) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return default


def serve(
    log_dir: Path | None = None,
    port: int = DEFAULT_PORT,
    host: str = "127.0.0.1",
    interval: float = 0.5,
    from_end: bool = False,
    stop: threading.Event | None = None,
    on_lines: LineHook | None = None,
    extra_collectors: tuple[Collector, ...] = (),
) -> None:
    """Expose /metrics on host:port and follow the logs until `stop` is set."""
    from prometheus_client import CollectorRegistry, start_http_server

    metrics = LogMetrics(log_dir or default_log_dir(), from_end=from_end, on_lines=on_lines)
    registry = CollectorRegistry()
    registry.register(metrics)
    for collector in extra_collectors:
        registry.register(collector)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    log.info(
        "log-metrics exporter on http://%s:%d/metrics, following %s", host, port, metrics.log_dir
    )
    try:
        metrics.run(stop or threading.Event(), interval)
    finally:
        server.shutdown()


__all__ = ["JOB_ID", "NODE", "DEFAULT_PORT", "LogMetrics", "default_log_dir", "serve"]

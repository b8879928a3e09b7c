"""The log-metrics exporter: job output and kernel logs -> Prometheus metrics on :19411.

Follows `$GOODPUT_LOG_DIR/jobs/slurm-<job_id>.out` (job id from the file name) and
`$GOODPUT_LOG_DIR/kernel/<node>.log` (node from the file name); files whose names do not give
a valid job id / node are ignored. A job's series live as long as its log file: deleting the
file (log retention) removes them. A background thread polls the files; `collect()` reads the
state at scrape time. An optional `on_lines(kind, key, lines)` hook (e.g. the Loki shipper)
receives every batch of lines; it must not block.

With a `state_file` (the CLI's `--state-file`, default `$GOODPUT_STATE_DIR/logmetrics/state.json`)
a restart neither counts old lines again nor resets a counter: every `SAVE_SECONDS` (when
something changed) and at shutdown, the read positions (the tailer's `position()`, as the Loki
shipper's `positions.json`: device, inode, offset, fingerprint; paths relative to the log dir)
and the whole parsed state (every exported counter and gauge) are written together, atomically
(tmp + rename), between two polls, so they always agree. On start the state is restored and each
file resumes at its saved position, so after a rotation the counters go on from their totals
(4 -> 5, not 4 -> 1) and an outage re-reads nothing. Decisions:

- a file with no saved position (or whose saved one no longer fits: another inode, shorter,
  another fingerprint) is read from its start, whatever its age (and `from_end` is ignored):
  its lines were not in the saved totals (it appeared, was rotated in or copy-truncated after
  the last save), so they are new to the counters and counted once;
- a job's or a node's restored series are dropped when its log file is gone (deleted or moved
  aside while the exporter was down), as a restart before this state file did;
- lines read after the last periodic save and before a crash are read again from the saved
  positions on top of the saved totals, so they count once; `serve` polls once before it
  answers scrapes, so Prometheus never sees the restored (lower) totals as a reset;
- no state file, an unreadable or corrupt one, another version, or one written for another log
  dir: a warning, and the exporter starts as before (every file from its start, or its end with
  `from_end`); the next save replaces it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from catalogue import names
from exporters.logmetrics.parser import JOB_ID, NODE, JobState, LogState
from exporters.logmetrics.tailer import DirectoryFollower, Position, TailStats
from exporters.lokispool import write_atomic

log = logging.getLogger(__name__)
DEFAULT_PORT = 19411
JOB_FILE = re.compile(rf"\Aslurm-(?P<job_id>{names.JOB_ID_PATTERN})\.out\Z")
KERNEL_FILE = re.compile(rf"\A(?P<node>{names.NODE_PATTERN})\.log\Z")
STATE_VERSION = 1
SAVE_SECONDS = 5.0  # between saves of the state file (and at shutdown)

LineHook = Callable[[str, str, list[str]], None]


def default_log_dir() -> Path:
    env = os.environ.get("GOODPUT_LOG_DIR")
    if env:
        return Path(env)
    stack = os.environ.get("GOODPUT_STACK_DIR", "/tmp/goodput-stack")  # noqa: S108
    return Path(stack) / "logs" / "cluster"


def default_state_file() -> Path:
    """`$GOODPUT_LOG_STATE_FILE`, else `$GOODPUT_STATE_DIR/logmetrics/state.json` (the state dir
    the Loki shipper keeps its positions in; default `~/.local/state/goodput`)."""
    env = os.environ.get("GOODPUT_LOG_STATE_FILE")
    if env:
        return Path(env).expanduser()
    state = Path(os.environ.get("GOODPUT_STATE_DIR", "~/.local/state/goodput")).expanduser()
    return state / "logmetrics" / "state.json"


class LogMetrics(Collector):
    """Owns the followers and the state; `poll_once()` reads, `collect()` exposes;
    `save_state()` writes `state_file` (when given), which the next start restores."""

    def __init__(
        self,
        log_dir: Path,
        from_end: bool = False,
        on_lines: LineHook | None = None,
        state_file: Path | None = None,
        save_seconds: float = SAVE_SECONDS,
    ) -> None:
        self.log_dir = Path(log_dir)
        self.state = LogState()
        self.state_file = None if state_file is None else Path(state_file)
        self.save_seconds = save_seconds
        self.restored_tail = TailStats()  # truncated lines and read errors before the restart
        self.restored = False
        resume = self._restore() if self.state_file is not None else {}
        skip = from_end and not self.restored  # a file the saved state lacks is new: all of it
        jobs, kernel = self.log_dir / "jobs", self.log_dir / "kernel"
        self.jobs = DirectoryFollower(
            jobs, "slurm-*.out", skip, {p: v for p, v in resume.items() if p.parent == jobs}
        )
        self.kernel = DirectoryFollower(
            kernel, "*.log", skip, {p: v for p, v in resume.items() if p.parent == kernel}
        )
        self.on_lines = on_lines
        self.ignored_files: set[str] = set()
        self.poll_seconds = 0.0
        self._lock = threading.Lock()
        self._poll_lock = threading.RLock()  # a save sees no poll half done
        self._saved: bytes | None = None
        self._saved_at = time.monotonic()

    def poll_once(self, now: float | None = None) -> int:
        """Read every followed file once; returns the number of lines read."""
        with self._poll_lock:
            return self._poll_once(now)

    def _poll_once(self, now: float | None) -> int:
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
        try:
            while not stop.is_set():
                try:
                    self.poll_once()
                except Exception:  # keep following whatever one bad poll did
                    log.exception("log poll failed")
                if time.monotonic() - self._saved_at >= self.save_seconds:
                    self._saved_at = time.monotonic()
                    self.save_state()
                stop.wait(interval)
        finally:
            self.save_state()

    # ------------------------------------------------------------------ state file
    def save_state(self) -> bool:
        """Write the positions and the parsed state to `state_file` (when it changed);
        False when there is none or it could not be written (logged, never raised)."""
        if self.state_file is None:
            return False
        try:
            with self._poll_lock, self._lock:
                blob = json.dumps(self._snapshot(), sort_keys=True).encode()
            if blob != self._saved:
                self.state_file.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(self.state_file, blob)
                self._saved = blob
        except Exception as exc:  # the exporter goes on; the next save tries again
            log.warning("could not save the log-metrics state to %s: %s", self.state_file, exc)
            return False
        return True

    def _snapshot(self) -> dict:
        s = self.state
        positions = {}
        for follower in (self.jobs, self.kernel):
            for path, (ident, offset, fingerprint) in follower.positions().items():
                rel = f"{follower.directory.name}/{path.name}"
                positions[rel] = [*ident, offset, fingerprint]
        t = self.tail_stats()
        return {
            "version": STATE_VERSION,
            "log_dir": os.path.abspath(self.log_dir),
            "positions": positions,
            "jobs": {job_id: _job_to_json(job) for job_id, job in s.jobs.items()},
            "pattern_matches": [[*key, n] for key, n in s.pattern_matches.items()],
            "xids": [[*key, n] for key, n in s.xids.items()],
            "lines": dict(s.lines),
            "tail": {"truncated_lines": t.truncated_lines, "read_errors": t.read_errors},
        }

    def _restore(self) -> dict[Path, Position]:
        """The saved state into `self.state`; the saved positions (empty when none)."""
        path = self.state_file
        assert path is not None
        try:
            data = json.loads(path.read_bytes())
            if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
                raise ValueError(f"not a version {STATE_VERSION} state")
            if data["log_dir"] != os.path.abspath(self.log_dir):
                raise ValueError(f"written for another log dir, {data['log_dir']}")
            state, positions = _state_from_json(data, self.log_dir)
        except FileNotFoundError:
            log.warning("no state file %s: every log is read from its start", path)
            return {}
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            log.warning("unusable state file %s (%s): every log is read from its start", path, exc)
            return {}
        self.state = state
        tail = data.get("tail") or {}
        self.restored_tail.truncated_lines = int(tail.get("truncated_lines", 0))
        self.restored_tail.read_errors = int(tail.get("read_errors", 0))
        self.restored = True
        log.info("restored %s: %d jobs, %d positions", path, len(state.jobs), len(positions))
        return positions

    def tail_stats(self) -> TailStats:
        total = TailStats()
        total.add(self.restored_tail)
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


def _job_to_json(job: JobState) -> dict:
    out = {}
    for f in dataclasses.fields(JobState):
        value = getattr(job, f.name)
        if isinstance(value, set):
            value = sorted(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"not a number: {value!r}")
    return float(value)


def _count(value: object) -> float:
    n = _number(value)
    if not (math.isfinite(n) and n >= 0):
        raise ValueError(f"not a count: {value!r}")
    return n


def _job_from_json(data: dict) -> JobState:
    job = JobState()
    for f in dataclasses.fields(JobState):
        if f.name not in data:
            continue
        value, default = data[f.name], getattr(job, f.name)
        if isinstance(default, dict):
            value = {str(k): _number(v) for k, v in value.items()}
        elif isinstance(default, set):
            value = {str(v) for v in value}
        elif f.name == "_samples":
            value = None if value is None else tuple(value)
        elif value is not None:
            value = _number(value)
        setattr(job, f.name, value)
    return job


def _state_from_json(data: dict, log_dir: Path) -> tuple[LogState, dict[Path, Position]]:
    """The saved state, less the series of jobs and nodes whose log file is gone."""
    state = LogState()
    for job_id, job in data["jobs"].items():
        if not JOB_ID.match(job_id):
            raise ValueError(f"invalid job_id {job_id!r}")
        if (log_dir / "jobs" / f"slurm-{job_id}.out").exists():
            state.jobs[job_id] = _job_from_json(job)
    nodes: dict[str, bool] = {}

    def node_log(node: str) -> bool:
        if not NODE.match(node):
            raise ValueError(f"invalid node {node!r}")
        if node not in nodes:
            nodes[node] = (log_dir / "kernel" / f"{node}.log").exists()
        return nodes[node]

    for job_id, node, pattern, n in data["pattern_matches"]:
        if (job_id in state.jobs) if job_id else node_log(str(node)):
            state.pattern_matches[(str(job_id), str(node), str(pattern))] = _count(n)
    for node, xid, n in data["xids"]:
        if node_log(str(node)):
            state.xids[(str(node), str(xid))] = _count(n)
    for source, n in data["lines"].items():
        state.lines[str(source)] = _count(n)
    positions: dict[Path, Position] = {}
    for rel, (dev, ino, offset, fingerprint) in data["positions"].items():
        kind, _, name = str(rel).partition("/")
        if kind not in ("jobs", "kernel") or not name or "/" in name:
            raise ValueError(f"invalid position path {rel!r}")
        fp = None if fingerprint is None else str(fingerprint)
        positions[log_dir / kind / name] = ((int(dev), int(ino)), int(offset), fp)
    return state, positions


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
    state_file: Path | None = None,
) -> None:
    """Expose /metrics on host:port and follow the logs until `stop` is set; with `state_file`,
    resume from it and keep it (module docstring)."""
    from prometheus_client import CollectorRegistry, start_http_server

    metrics = LogMetrics(
        log_dir or default_log_dir(), from_end=from_end, on_lines=on_lines, state_file=state_file
    )
    if metrics.restored:  # catch up on what the last save missed before the first scrape
        try:
            metrics.poll_once()
        except Exception:
            log.exception("log poll failed")
    registry = CollectorRegistry()
    registry.register(metrics)
    for collector in extra_collectors:
        registry.register(collector)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    log.info(
        "log-metrics exporter on http://%s:%d/metrics, following %s", host, port, metrics.log_dir
    )
    if not metrics.log_dir.is_dir():  # followed once it appears; said now, not found later
        log.warning(
            "%s is not a directory (yet): no log is read until it is (--log-dir, "
            "$GOODPUT_LOG_DIR); goodput_log_files_followed stays 0",
            metrics.log_dir,
        )
    try:
        metrics.run(stop or threading.Event(), interval)
    finally:
        server.shutdown()


__all__ = [
    "JOB_ID",
    "NODE",
    "DEFAULT_PORT",
    "LogMetrics",
    "default_log_dir",
    "default_state_file",
    "serve",
]

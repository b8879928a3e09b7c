"""Ship job output and kernel logs to Loki, resuming where it left off and losing nothing.

`LokiShipper(url, log_dir, state_dir)` follows `<log_dir>/jobs/slurm-<job_id>.out` and
`<log_dir>/kernel/<node>.log` (the log-metrics exporter's layout) and labels lines by the
contract in `catalogue/logstreams.py`. Each line keeps the time it carries
(`catalogue/logtime.py`; a stamp without a zone is in `log_zone`, default the host's local
zone, as syslog, Python logging and glog print it); a line without one (a traceback, a
wrapped message) takes the previous line's time plus 1 ns per line, and the first lines of a
file without any take the time they were read. A monotonic kernel stamp uses the node's boot
time when given (`boot_times`), else a boot time learned from when the lines were read.

Read lines go to a spool on disk (`<state_dir>/spool`, one JSON file per batch, at most
`spool_max_bytes`; when it is full the shipper stops reading, so the log files hold the rest)
and only then is the read position saved (`<state_dir>/positions.json`: path -> device, inode,
offset, last time, fingerprint of the bytes read), so a restart resumes and a rotated or
truncated file (also one truncated and written past the offset again) is read from its start.
A batch leaves the spool when Loki took it: 429, 5xx, timeouts and connection errors keep it
and back off (honouring `Retry-After`); a 400 drops the entries Loki's answer names (counted
by reason) and sends the rest once more (Loki keeps one copy of a repeated entry); a 413 splits
the batch.
"""

from __future__ import annotations

import json
import logging
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import tzinfo
from pathlib import Path
from typing import Any

import requests
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from catalogue import logstreams, logtime
from clients.loki import Entry, LokiClient, LokiError, labels_key
from exporters.logmetrics.exporter import JOB_FILE, KERNEL_FILE
from exporters.logmetrics.tailer import DirectoryFollower, Position
from exporters.lokiapi import refused, retry_after
from exporters.lokispool import Spool, write_atomic

log = logging.getLogger(__name__)
LABEL_NAME = re.compile(r"\A[a-zA-Z_][a-zA-Z0-9_]*\Z")
FUTURE_S = 600.0  # a line stamped further ahead than this (a wrong zone) takes the read time
SAME_S = 1.0  # a stamp this close before the previous line's keeps file order (+1 ns)
RETRY = {408, 429} | set(range(500, 600))


class LokiShipper(Collector):
    """`start()` a thread that follows, spools and pushes; or call `poll_once()` and
    `send_once()` yourself; `close()` flushes what it can within its timeout."""

    def __init__(
        self,
        url: str,
        log_dir: Path,
        state_dir: Path,
        static_labels: dict[str, str] | None = None,
        boot_times: dict[str, float] | None = None,
        tenant: str | None = None,
        batch_max_lines: int = 2000,
        batch_max_bytes: int = 1 << 20,
        spool_max_bytes: int = 256 << 20,
        interval: float = 1.0,
        backoff_base: float = 0.5,
        backoff_max: float = 60.0,
        retry_after_max: float = 600.0,
        timeout: float = 10.0,
        session: requests.Session | None = None,
        clock: Callable[[], float] = time.time,
        log_zone: tzinfo | str | None = None,
    ) -> None:
        # the zone of stamps without one: a tzinfo, an IANA name, or None/"" for the host's
        self.log_zone = (
            log_zone if isinstance(log_zone, tzinfo) else logtime.named_zone(log_zone or "")
        )
        self.static_labels = dict(static_labels or {})
        for name, value in self.static_labels.items():
            if not LABEL_NAME.match(name) or name in (logstreams.SOURCE, "job_id", "node"):
                raise ValueError(f"invalid or reserved Loki label name {name!r}")
            if not value:
                raise ValueError(f"empty value for Loki label {name!r}")
        self.log_dir, self.state_dir = Path(log_dir), Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.spool = Spool(self.state_dir / "spool", spool_max_bytes)
        self.positions_path = self.state_dir / "positions.json"
        self.boot_times = dict(boot_times or {})
        self.batch_max_lines, self.batch_max_bytes = batch_max_lines, batch_max_bytes
        self.interval, self.timeout, self.clock = interval, timeout, clock
        self.backoff_base, self.backoff_max = backoff_base, backoff_max
        self.retry_after_max = retry_after_max
        self.loki = LokiClient(url, timeout, tenant, session=session)
        self._last_ns: dict[Path, int] = {}
        resume = self._load_positions()
        self.followers = (
            ("job", DirectoryFollower(self.log_dir / "jobs", "slurm-*.out", resume=resume)),
            ("kernel", DirectoryFollower(self.log_dir / "kernel", "*.log", resume=resume)),
        )
        self._clocks: dict[str, logtime.BootClock] = {}
        self.sent = 0
        self.refused: Counter[str] = Counter()  # reason -> lines
        self.errors: Counter[str] = Counter()  # HTTP status or "connection" -> pushes
        self.times: Counter[str] = Counter()  # line | previous | read_time -> lines
        self.failures = 0  # consecutive failed pushes (backoff exponent)
        self.next_try = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ reading
    def poll_once(self) -> int:
        """Read new lines into the spool, then save the positions; 0 while the spool is full."""
        if self.spool.full():
            return 0
        batch: list[Entry] = []
        read_at = self.clock()
        for kind, follower in self.followers:
            rx = JOB_FILE if kind == "job" else KERNEL_FILE
            for path, lines in follower.poll():
                m = rx.match(path.name)
                if m is not None:
                    batch += self.stamp(kind, m.group(1), path, lines, read_at)
        for chunk in _chunks(batch, self.batch_max_lines, self.batch_max_bytes):
            self.spool.append(chunk)
        self._save_positions()
        return len(batch)

    def stamp(
        self, kind: str, key: str, path: Path, lines: list[str], read_at: float
    ) -> list[Entry]:
        """Entries for lines of one file read at `read_at`, each with its own time."""
        labels = labels_key({**self.static_labels, **logstreams.stream_labels(kind, key)})
        boot = self.boot_times.get(key) if kind == logstreams.KERNEL else None
        stamps = [logtime.parse(line, read_at, boot, self.log_zone) for line in lines]
        mono = [
            (i, s.monotonic)
            for i, s in enumerate(stamps)
            if s is not None and s.time is None and s.monotonic is not None
        ]
        placed: dict[int, float] = {}
        if mono:
            clock = self._clocks.setdefault(key, logtime.BootClock())
            walls = clock.place([m for _i, m in mono], read_at)
            placed = {i: t for (i, _m), t in zip(mono, walls, strict=True)}
        out: list[Entry] = []
        last = self._last_ns.get(path)
        for i, line in enumerate(lines):
            s = stamps[i]
            t = placed.get(i, logtime.trusted(s, None if last is None else last / 1e9))
            if t is not None and t <= read_at + FUTURE_S:
                ts, source = int(round(t * 1e9)), "line"
                if last is not None and last - SAME_S * 1e9 < ts <= last:
                    ts = last + 1
            elif last is not None:
                ts, source = last + 1, "previous"
            else:
                ts, source = int(read_at * 1e9), "read_time"
            self.times[source] += 1
            last = ts
            out.append((labels, ts, line))
        if last is not None:
            self._last_ns[path] = last
        return out

    def _load_positions(self) -> dict[Path, Position]:
        try:
            data = json.loads(self.positions_path.read_text())
            out = {}
            for p, (d, i, o, last, *fp) in data.items():  # fp: none in an older file
                out[Path(p)] = ((int(d), int(i)), int(o), str(fp[0]) if fp and fp[0] else None)
                if last is not None:
                    self._last_ns[Path(p)] = int(last)
            return out
        except FileNotFoundError:
            return {}
        except (ValueError, TypeError, AttributeError):
            log.warning("unreadable %s: reading every file from its start", self.positions_path)
            return {}

    def _save_positions(self) -> None:
        now: dict[str, Any] = {}
        for _kind, follower in self.followers:
            for path, f in follower.followers.items():
                pos = f.position()
                if pos is not None:
                    now[str(path)] = [*pos[0], pos[1], self._last_ns.get(path), pos[2]]
            for path, (ident, offset, fp) in follower.resume.items():  # not reopened yet
                if path.exists():
                    now.setdefault(str(path), [*ident, offset, self._last_ns.get(path), fp])
        write_atomic(self.positions_path, json.dumps(now, sort_keys=True).encode())
        # files no longer followed (a job's log deleted): forgotten, not kept for good
        self._last_ns = {p: t for p, t in self._last_ns.items() if str(p) in now}

    # ------------------------------------------------------------------ sending
    def send_once(self) -> int:
        """Push spooled batches, oldest first, until the spool is empty or a push fails;
        returns the batches left."""
        while self.clock() >= self.next_try:
            files = self.spool.files()
            if not files:
                return 0
            if not self._push(files[0]):
                break
        return len(self.spool.files())

    def _push(self, path: Path) -> bool:
        """One push of one spooled batch; False when it must wait (backoff)."""
        try:
            entries, resent = self.spool.read(path)
        except (OSError, ValueError, KeyError, TypeError) as exc:  # set aside, never stuck on it
            log.error("unreadable spool file %s set aside: %s", path, exc)
            path.rename(path.with_suffix(".bad"))
            self.refused["unreadable_spool"] += 1
            return True
        try:
            self.loki.push(entries)
        except LokiError as exc:
            return self._answer(path, entries, resent, exc)
        self.sent += len(entries)
        self.failures = 0
        path.unlink()
        return True

    def _answer(self, path: Path, entries: list[Entry], resent: bool, exc: LokiError) -> bool:
        """What a push Loki did not take means for the batch; False when it must wait."""
        if exc.status is None:
            return self._failed("connection", str(exc), None)
        if exc.status == 400:
            self._refused(path, entries, resent, exc.body)
            return True
        if exc.status == 413 and len(entries) > 1:
            self.errors["413"] += 1
            half, seq = len(entries) // 2, int(path.stem)
            path.unlink()
            self.spool.append(entries[half:], resent, seq=seq)
            self.spool.append(entries[:half], resent, seq=seq - 1)
            return True
        if exc.status == 413:
            self.errors["413"] += 1
            self.refused["too_large"] += 1
            path.unlink()
            return True
        return self._failed(str(exc.status), exc.body, exc.headers.get("Retry-After"))

    def _refused(self, path: Path, entries: list[Entry], resent: bool, body: str) -> None:
        self.errors["400"] += 1
        gone = refused(body, entries)
        self.refused.update(gone.values())
        rest = [e for i, e in enumerate(entries) if i not in gone]
        log.warning("Loki refused %d of %d lines: %s", len(gone), len(entries), body[:300])
        path.unlink()
        if rest and (gone or not resent):
            self.spool.append(rest, resent=True, seq=int(path.stem))
        elif rest:  # refused again, for reasons the answer does not name
            self.refused["unknown"] += len(rest)

    def _failed(self, code: str, text: str, after: str | None) -> bool:
        self.errors[code] += 1
        self.failures += 1
        wait = retry_after(after, self.clock())
        if wait is None:
            wait = min(self.backoff_max, self.backoff_base * 2 ** (self.failures - 1))
            wait *= 0.5 + random.random() / 2
        else:
            wait = min(wait, self.retry_after_max)
        self.next_try = self.clock() + wait
        log.warning("Loki push: %s: %s (next try in %.1f s)", code, text.strip()[:300], wait)
        return False

    # ------------------------------------------------------------------ running
    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.poll_once()
                self.send_once()
            except Exception:  # keep shipping whatever one bad round did
                log.exception("Loki shipper round failed")
            stop.wait(self.interval)

    def start(self) -> LokiShipper:
        self._thread = threading.Thread(
            target=self.run, args=(self._stop,), name="loki-shipper", daemon=True
        )
        self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread, read what is left and push it until `timeout` (the spool keeps
        the rest for the next start)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        deadline = time.monotonic() + timeout
        self.poll_once()
        while self.spool.files() and time.monotonic() < deadline:
            if self.send_once() and self.clock() < self.next_try:
                break

    def collect(self) -> Iterator:
        lines = CounterMetricFamily(
            "goodput_loki_lines", "Log lines by outcome of the push.", labels=["result"]
        )
        lines.add_metric(["sent"], self.sent)
        lines.add_metric(["refused"], sum(self.refused.values()))
        refusals = CounterMetricFamily(
            "goodput_loki_refused_lines", "Lines Loki refused, by reason.", labels=["reason"]
        )
        for reason, n in sorted(self.refused.items()):
            refusals.add_metric([reason], n)
        errors = CounterMetricFamily(
            "goodput_loki_push_errors", "Failed pushes by status code.", labels=["code"]
        )
        for code, n in sorted(self.errors.items()):
            errors.add_metric([code], n)
        times = CounterMetricFamily(
            "goodput_loki_line_times",
            "Where each shipped line's time came from.",
            labels=["source"],
        )
        for source in ("line", "previous", "read_time"):
            times.add_metric([source], self.times[source])
        spooled = GaugeMetricFamily("goodput_loki_spool_bytes", "Bytes waiting in the spool.")
        spooled.add_metric([], self.spool.bytes())
        full = GaugeMetricFamily("goodput_loki_spool_full", "1 while reading waits for Loki.")
        full.add_metric([], float(self.spool.full()))
        yield from (lines, refusals, errors, times, spooled, full)


def host_boot_time(stat: Path = Path("/proc/stat")) -> float | None:
    """This machine's boot time (`btime` in /proc/stat), for kernel logs read on the node."""
    try:
        for line in stat.read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _chunks(entries: list[Entry], max_lines: int, max_bytes: int) -> Iterator[list[Entry]]:
    chunk: list[Entry] = []
    size = 0
    for e in entries:
        n = len(e[2]) + 64
        if chunk and (len(chunk) >= max_lines or size + n > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(e)
        size += n
    if chunk:
        yield chunk

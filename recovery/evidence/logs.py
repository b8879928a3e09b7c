"""Log evidence: the job's Slurm output and the nodes' kernel logs (files), or Loki.

Files live at `<log_dir>/jobs/slurm-<job_id>.out` and `<log_dir>/kernel/<node>.log`; paths
are built only from validated ids. Each line gets a time: its own timestamp when it carries
one (`catalogue/logtime.py`: ISO, `dmesg -T`, journald, syslog, PyTorch/glog, ...; a monotonic
`dmesg` stamp is placed by the file's mtime, when its last line was written), else the previous
line's. A stamp without a zone is in the nodes' zone (`GOODPUT_LOG_TIMEZONE`, default the
host's: `Settings.log_zone`); files read without settings (a recording) take UTC. Only the
tail of a big file is read; a `.gz` one (a rotated log) is decompressed.
Loki streams follow `catalogue/logstreams.py`.
"""

from __future__ import annotations

import calendar
import gzip
import time
from collections.abc import Iterable
from datetime import tzinfo
from pathlib import Path

from catalogue import logfiles, logstreams, logtime, promql
from clients.loki import LokiClient, LokiError
from recovery import validate
from recovery.evidence import Bundle, Context, LogLine, Report
from recovery.settings import Settings

MAX_BYTES = 32 << 20  # read at most the last 32 MiB of a file
GZIP_MAGIC = b"\x1f\x8b"
MAX_LINES = 500_000
SLACK_S = 120.0


def line_time(text: str, year: int, zone: tzinfo | None = None) -> float | None:
    """The timestamp a log line carries, a stamp without a year taken in `year`, or None."""
    ref = calendar.timegm((year, 12, 31, 23, 59, 59))
    return logtime.line_time(text, ref=ref, zone=zone)


def _times(
    lines: list[str], ref: float, mtime: float, zone: tzinfo | None = None
) -> list[float | None]:
    """Each line's own time (a stamp without a zone in `zone`, None: UTC); monotonic stamps
    placed so the last was written at `mtime`."""
    stamps = [logtime.parse(raw, ref, zone=zone) for raw in lines]
    mono = [(i, s.monotonic) for i, s in enumerate(stamps) if s and s.monotonic is not None]
    walls = logtime.BootClock().place([m for _i, m in mono], mtime)
    placed = {i: t for (i, _m), t in zip(mono, walls, strict=True)}
    out: list[float | None] = []
    previous: float | None = None
    for i, s in enumerate(stamps):
        out.append(placed.get(i, logtime.trusted(s, previous)))
        previous = out[-1] if out[-1] is not None else previous
    return out


def _tail(path: Path, follow: bool = True) -> tuple[bytes, bool]:
    """The file's last MAX_BYTES, decompressed where its name ends in `.gz` (a rotated log
    given to `goodput attribute`; the receiver reads `.out` and `.log` files only, whose
    bytes a job controls), and whether anything before them was left out. Unless `follow`,
    only a regular file, not through a link (`catalogue.logfiles`)."""
    with path.open("rb") if follow else logfiles.open_regular(path) as f:
        if path.suffix != ".gz":
            skip = max(0, f.seek(0, 2) - MAX_BYTES)
            f.seek(skip)
            return f.read(), skip > 0
        if f.read(2) != GZIP_MAGIC:
            raise ValueError(f"{path}: named .gz but not gzip")
    data, cut = bytearray(), False
    try:
        with gzip.open(path, "rb") as g:
            while chunk := g.read(1 << 20):
                data += chunk
                if len(data) > MAX_BYTES:
                    del data[: len(data) - MAX_BYTES]
                    cut = True
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"{path}: not a readable gzip file ({exc})") from exc
    return bytes(data), cut


def read_lines(
    path: Path,
    kind: str,
    node: str | None = None,
    job_id: str | None = None,
    start: float | None = None,
    end: float | None = None,
    follow: bool = True,
    zone: tzinfo | None = None,
) -> list[LogLine]:
    """Lines of one log file with their times, kept when inside [start-slack, end+slack];
    unless `follow`, only a regular file, not through a link. Stamps without a zone are in
    `zone` (None: UTC)."""
    mtime = path.stat().st_mtime if follow else path.lstat().st_mtime
    data, skip = _tail(path, follow)
    text = data.decode("utf-8", "replace")
    first_line = 1
    if skip:
        cut = text.find("\n") + 1
        text = text[cut:]
        first_line = 0  # unknown: we started mid-file
    raws = text.splitlines()[-MAX_LINES:]
    out: list[LogLine] = []
    last: float | None = None
    for i, (raw, t) in enumerate(
        zip(raws, _times(raws, end or time.time(), mtime, zone), strict=True)
    ):
        if t is not None:
            last = t
        t = last
        # the look-back is the operator's (GOODPUT_RECEIVER_LOOKBACK_S): no slack before start
        if t is not None and start is not None and t < start:
            continue
        if t is not None and end is not None and t > end + SLACK_S:
            continue
        out.append(
            LogLine(
                path=str(path),
                line=(first_line + i) if first_line else None,
                text=raw[:8192],
                time=t,
                node=node,
                job_id=job_id,
                kind=kind,
            )
        )
    return out


def files_for(ctx: Context, log_dir: Path) -> Iterable[tuple[Path, str, str | None]]:
    """(path, kind, node) for the job log and each node's kernel log."""
    if ctx.job_id:
        yield log_dir / "jobs" / f"slurm-{validate.job_id(ctx.job_id)}.out", "job", None
    for n in ctx.nodes:
        yield log_dir / "kernel" / f"{validate.node(n)}.log", "kernel", n


def collect_dir(
    ctx: Context, log_dir: Path, connector: str = "logs", zone: tzinfo | None = None
) -> Bundle:
    """The job's and its nodes' log lines in the incident's window; stamps without a zone
    are in `zone` (None: the host's local zone)."""
    zone = logtime.HOST_ZONE if zone is None else zone
    lines: list[LogLine] = []
    missing = []
    run_start: float | None = None  # the job's current run: its output file starts there
    for path, kind, node in files_for(ctx, log_dir):
        if not path.is_file() and not path.is_symlink():
            missing.append(path.name)
            continue
        start = ctx.start
        if kind == "kernel" and run_start is not None:
            # a node's older kernel lines belong to earlier jobs or runs, not this incident
            start = max(start, run_start - SLACK_S)
        try:
            got = read_lines(path, kind, node, ctx.job_id, start, ctx.end, follow=False, zone=zone)
        except (OSError, ValueError) as exc:  # one unreadable file costs only its own lines
            missing.append(f"{path.name} ({type(exc).__name__})")
            continue
        if kind == "job":
            run_start = next((ln.time for ln in got if ln.time is not None), None)
        lines += got
    if not lines:
        reason = f"no log lines (missing: {', '.join(missing)})" if missing else "no lines"
        return Bundle(reports=[Report(connector, "empty", reason)])
    reason = f"missing: {', '.join(missing)}" if missing else ""
    return Bundle(lines=lines, reports=[Report(connector, "ok", reason)])


def collect(ctx: Context, settings: Settings) -> Bundle:
    if not settings.log_dir:
        return Bundle(reports=[Report("logs", "error", "no log directory configured")])
    log_dir = Path(settings.log_dir)
    if not log_dir.is_dir():
        return Bundle(reports=[Report("logs", "error", f"log directory {log_dir} not found")])
    return collect_dir(ctx, log_dir, zone=settings.log_zone)


LOKI_NODES = 100  # nodes per kernel-stream query: a 512-node job asks 6 queries, not 512


def loki_streams(ctx: Context, chunk: int = LOKI_NODES) -> list[tuple[str, str, list[str]]]:
    """(LogQL, kind, nodes): the job's stream, then the nodes' kernel streams, `chunk` nodes
    to a query: `node="n1"` for one, else the anchored RE2 alternation `node=~"n1|n2"` that
    LogQL's stream selectors take as PromQL's do (`catalogue.promql`: values escaped)."""
    out: list[tuple[str, str, list[str]]] = []
    if ctx.job_id:
        out.append((logstreams.job_selector(validate.job_id(ctx.job_id)), "job", []))
    nodes = list(dict.fromkeys(validate.node(n) for n in ctx.nodes))
    for i in range(0, len(nodes), max(1, chunk)):
        group = nodes[i : i + max(1, chunk)]
        if len(group) == 1:
            query = logstreams.kernel_selector(group[0])
        else:
            labels = logstreams.stream_labels(logstreams.KERNEL, group[0])
            del labels[logstreams.NODE]  # {source="kernel", node=~"n1|n2"}
            query = promql.selector("", promql.matcher(logstreams.NODE, group), **labels)
        out.append((query, "kernel", group))
    return out


def _named(query: str, nodes: list[str]) -> str:
    """A query for a report: one naming several nodes is shortened to their count and ends."""
    if len(nodes) < 2:
        return query
    return f'{{source="kernel", node=~<{len(nodes)} nodes: {nodes[0]} .. {nodes[-1]}>}}'


def collect_loki(
    ctx: Context, settings: Settings, limit: int = 5000, chunk: int = LOKI_NODES
) -> Bundle:
    """Lines from Loki's query_range API, and a report of what each stream gave.

    Each query takes the NEWEST `limit` lines of the window (`direction=backward`: the fault
    and its traceback are near the alert, at the window's end; a file is read from its tail
    likewise), put back in time order. The kernel streams of up to `chunk` nodes are one query.
    A query Loki refuses costs only its own lines; one it does not answer (down, timed out)
    ends the collection, since the next would wait as long; either is named in the report,
    `error` only when nothing came back."""
    if not settings.loki_url:
        return Bundle(reports=[Report("loki", "error", "Loki is not configured")])
    lines: list[LogLine] = []
    counts: list[str] = []
    failed: list[str] = []
    loki = LokiClient(settings.loki_url, timeout=settings.http_timeout_s)
    streams = loki_streams(ctx, chunk)
    for i, (query, kind, nodes) in enumerate(streams):
        try:
            got = loki.query_range(query, ctx.start, ctx.end, limit, "backward")
        except LokiError as exc:
            said = str(exc) if exc.status is None else f"answered {exc.status}: {exc.reason}"
            failed.append(f"{_named(query, nodes)}: {said[:100]}")
            if exc.status is None and i + 1 < len(streams):  # no answer: the rest would wait
                failed.append(f"{len(streams) - i - 1} more queries not sent")
                break
            continue
        full = " (limit reached)" if len(got) >= limit else ""
        node = nodes[0] if len(nodes) == 1 else None
        mine: dict[str | None, list[LogLine]] = {n: [] for n in nodes} if nodes else {None: []}
        for e in sorted(reversed(got), key=lambda e: e.ts_ns):  # oldest first, as Loki wrote
            n = e.labels.get("node") or node
            n = n if validate.NODE.fullmatch(n or "") else node
            if nodes and n not in mine:
                continue  # not a node this query named
            where = logstreams.kernel_selector(n) if nodes and n else query
            mine[n if nodes else None].append(
                LogLine(
                    path=f"loki:{where}",
                    line=None,
                    text=e.line[:8192],
                    time=e.ts_ns / 1e9,
                    node=n,
                    job_id=ctx.job_id,
                    kind=kind,
                )
            )
        for n, got_n in mine.items():  # the job's lines, or each node's in the job's order
            lines += got_n
            counts.append(f"{len(got_n)} {kind} lines{full}" + (f" ({n})" if n else ""))
    if failed and not lines:
        return Bundle(reports=[Report("loki", "error", "; ".join(failed)[:300])])
    status = "ok" if lines else "empty"
    reason = ", ".join(counts) or "no streams"
    if failed:
        reason = f"failed: {'; '.join(failed)}; got: {reason}"
    return Bundle(lines=lines, reports=[Report("loki", status, reason)])

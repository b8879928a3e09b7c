"""Log evidence: the job's Slurm output and the nodes' kernel logs (files), or Loki.

Files live at `<log_dir>/jobs/slurm-<job_id>.out` and `<log_dir>/kernel/<node>.log`; paths
are built only from validated ids. Each line gets a time: its own timestamp when it carries
one (ISO 8601, `[YYYY-mm-dd HH:MM:SS]`, PyTorch's `E0321 02:07:08.408`, syslog's
`May 18 19:02:39`), else the previous line's. Only the tail of a big file is read.
"""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Iterable
from pathlib import Path

import requests

from recovery import validate
from recovery.evidence import Bundle, Context, LogLine, Report
from recovery.settings import Settings

MAX_BYTES = 32 << 20  # read at most the last 32 MiB of a file
MAX_LINES = 500_000
SLACK_S = 120.0

_ISO = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|[+-]\d{2}:?\d{2})?"
)
_TORCH = re.compile(r"\[[EWIF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})(\.\d+)?")
_SYSLOG = re.compile(r"^([A-Z][a-z]{2}) {1,2}(\d{1,2}) (\d{2}):(\d{2}):(\d{2})")
_MONTHS = {m: i for i, m in enumerate(calendar.month_abbr) if m}


def line_time(text: str, year: int) -> float | None:
    """The timestamp a log line carries (UTC unless it says otherwise), or None."""
    m = _ISO.search(text[:200])
    if m:
        y, mo, d, h, mi, s, frac, tz = m.groups()
        t = calendar.timegm((int(y), int(mo), int(d), int(h), int(mi), int(s)))
        if tz and tz not in ("Z",):
            sign = 1 if tz[0] == "+" else -1
            digits = tz[1:].replace(":", "")
            t -= sign * (int(digits[:2]) * 3600 + int(digits[2:4]) * 60)
        return t + (float(frac) if frac else 0.0)
    m = _TORCH.search(text[:200])
    if m:
        mo, d, h, mi, s, frac = m.groups()
        t = calendar.timegm((year, int(mo), int(d), int(h), int(mi), int(s)))
        return t + (float(frac[:10]) if frac else 0.0)
    m = _SYSLOG.match(text)
    if m and m.group(1) in _MONTHS:
        mon, d, h, mi, s = m.groups()
        return float(calendar.timegm((year, _MONTHS[mon], int(d), int(h), int(mi), int(s))))
    return None


def read_lines(
    path: Path,
    kind: str,
    node: str | None = None,
    job_id: str | None = None,
    start: float | None = None,
    end: float | None = None,
) -> list[LogLine]:
    """Lines of one log file with their times, kept when inside [start-slack, end+slack]."""
    size = path.stat().st_size
    with path.open("rb") as f:
        skip = max(0, size - MAX_BYTES)
        f.seek(skip)
        data = f.read()
    text = data.decode("utf-8", "replace")
    first_line = 1
    if skip:
        cut = text.find("\n") + 1
        text = text[cut:]
        first_line = 0  # unknown: we started mid-file
    year = time.gmtime(end if end else time.time()).tm_year
    out: list[LogLine] = []
    last: float | None = None
    for i, raw in enumerate(text.splitlines()[-MAX_LINES:]):
        t = line_time(raw, year)
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


def collect_dir(ctx: Context, log_dir: Path, connector: str = "logs") -> Bundle:
    lines: list[LogLine] = []
    missing = []
    run_start: float | None = None  # the job's current run: its output file starts there
    for path, kind, node in files_for(ctx, log_dir):
        if not path.is_file():
            missing.append(path.name)
            continue
        start = ctx.start
        if kind == "kernel" and run_start is not None:
            # a node's older kernel lines belong to earlier jobs or runs, not this incident
            start = max(start, run_start - SLACK_S)
        got = read_lines(path, kind, node, ctx.job_id, start, ctx.end)
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
    return collect_dir(ctx, log_dir)


def loki_queries(ctx: Context) -> list[tuple[str, str, str | None]]:
    """(LogQL, kind, node): the job's stream and each node's kernel stream."""
    out: list[tuple[str, str, str | None]] = []
    if ctx.job_id:
        out.append((f'{{job_id="{validate.job_id(ctx.job_id)}"}}', "job", None))
    for n in ctx.nodes:
        out.append((f'{{node="{validate.node(n)}", source="kernel"}}', "kernel", n))
    return out


def collect_loki(ctx: Context, settings: Settings, limit: int = 5000) -> Bundle:
    """Lines from Loki's query_range API (streams labelled by the Loki shipper)."""
    if not settings.loki_url:
        return Bundle(reports=[Report("loki", "error", "Loki is not configured")])
    lines: list[LogLine] = []
    for query, kind, node in loki_queries(ctx):
        resp = requests.get(
            f"{settings.loki_url.rstrip('/')}/loki/api/v1/query_range",
            params={
                "query": query,
                "start": str(int(ctx.start * 1e9)),
                "end": str(int(ctx.end * 1e9)),
                "limit": str(limit),
                "direction": "forward",
            },
            timeout=settings.http_timeout_s,
        )
        resp.raise_for_status()
        for stream in resp.json().get("data", {}).get("result", []):
            labels = stream.get("stream", {})
            n = labels.get("node") or node
            n = n if isinstance(n, str) and validate.NODE.fullmatch(n) else node
            for ts, text in stream.get("values", []):
                lines.append(
                    LogLine(
                        path=f"loki:{query}",
                        line=None,
                        text=str(text)[:8192],
                        time=int(ts) / 1e9,
                        node=n,
                        job_id=ctx.job_id,
                        kind=kind,
                    )
                )
    status = "ok" if lines else "empty"
    return Bundle(lines=lines, reports=[Report("loki", status, "" if lines else "no lines")])

"""A user's job log, kernel logs and Slurm state -> the recording format's pieces.

- `job_metrics(lines, job_id, times)`: the `goodput_job_*` columns of `job_metrics.csv.gz` at
  each sample time, derived by the production log parser (`exporters.logmetrics.parser`) fed
  line by line at each line's own timestamp.
- `kernel_lines(lines, boot_time)`: kernel log lines (`dmesg`, `dmesg -T`, journald `short`,
  `short-iso` or `-o json`) with an ISO 8601 UTC time put in front, so every reader of the
  recording finds the time where it looks first.
- `slurm_state(text, where, job_id)`: the job's facts from `sacct --json`, `squeue --json`,
  `sacct -P` or `scontrol show job -o` / plain `key=value` lines (of `job_id` where the file
  holds several).
Errors raise `ImportFailure` with the file, the line or field, and what would be accepted.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from catalogue import logtime, names, recording
from exporters import slurm_exporter
from exporters.logmetrics.parser import LogState


class ImportFailure(ValueError):
    """Input that cannot become part of a recording; the message says what is accepted."""


def line_time(text: str, ref: float, boot_time: float | None = None) -> tuple[float | None, str]:
    """(unix time or None, form) of a log line, by the shared parser (catalogue/logtime.py).
    `ref`: a time near the log, for stamps without a year."""
    stamp = logtime.parse(text, ref, boot_time)
    return (None, "") if stamp is None else (stamp.time, stamp.form)


def iso_utc(t: float) -> str:
    """Unix seconds as ISO 8601 UTC to the millisecond."""
    whole, ms = divmod(int(round(t * 1000)), 1000)  # x.9996 s is the next second's .000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{ms:03d}Z"


# --- job log -> job metrics -------------------------------------------------------------------
def timed(lines: Iterable[str], ref: float) -> list[tuple[float | None, str]]:
    """Each line with its time (its own timestamp, else the previous line's)."""
    out: list[tuple[float | None, str]] = []
    last: float | None = None
    for line in lines:
        t, _ = line_time(line, ref)
        last = t if t is not None else last
        out.append((last, line))
    return out


def job_metrics(
    lines: Iterable[str], job_id: str, times: Iterable[float], where: str = "job log"
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(rows of job_metrics.csv.gz at each of `times` once the job has logged progress, stats).

    Each line is fed to the production parser at its own time, so progress, iteration time,
    loss and checkpoints read as the log exporter would have exported them live."""
    if not names.valid_job_id(job_id):
        raise ImportFailure(f"--job-id {job_id!r}: want a Slurm job id (123 or 123_4)")
    grid = sorted(set(float(t) for t in times))
    items = timed(lines, grid[-1] if grid else time.time())
    stamped = sum(1 for t, _ in items if t is not None)
    if items and not stamped:
        raise ImportFailure(
            f"{where}: no line carries a timestamp, so progress cannot be placed in time "
            "(accepted: ISO 8601 or [YYYY-mm-dd HH:MM:SS] at the start of lines, syslog, dmesg -T)"
        )
    state = LogState()
    rows: list[dict[str, Any]] = []
    i = 0
    for t in grid:
        while i < len(items) and ((lt := items[i][0]) is None or lt <= t):
            text = items[i][1]
            if lt is not None:
                state.feed_job(job_id, [text], lt)
            i += 1
        job = state.jobs.get(job_id)
        if job is None or not job.last_progress:
            continue
        rows.append(_row(t, job_id, job))
    matched = {p: int(n) for (j, _, p), n in state.pattern_matches.items() if j == job_id}
    stats = {"lines": len(items), "timed": stamped, "patterns": matched, "rows": len(rows)}
    return rows, stats


def _row(t: float, job_id: str, job: Any) -> dict[str, Any]:
    values = (
        job.iteration,
        max(job.last_progress.values()),
        job.iteration_seconds,
        job.throughput,
        job.loss,
        job.nan_iterations,
        job.skipped_iterations,
        job.last_checkpoint,
        job.last_pause,
    )
    return {
        "timestamp": t,
        "job_id": job_id,
        **dict(zip(recording.JOB_METRICS, values, strict=True)),
    }


# --- kernel logs ------------------------------------------------------------------------------
def kernel_lines(
    lines: Iterable[str], where: str, ref: float, boot_time: float | None = None
) -> tuple[list[str], dict[str, int]]:
    """Kernel lines, each led by its ISO UTC time; (lines, count per timestamp kind)."""
    out: list[str] = []
    kinds: dict[str, int] = {}
    for n, raw in enumerate(lines, 1):
        line = raw.rstrip("\n")
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):  # journalctl -o json
            line = _journal_json(line, where, n)
        t, kind = line_time(line, ref, boot_time)
        if kind == "monotonic" and t is None:
            raise ImportFailure(
                f"{where}:{n}: time since boot ({line[:40]!r}); pass --boot-time "
                "(unix seconds or ISO 8601), or give `dmesg -T` / journalctl output instead"
            )
        kinds[kind or "untimed"] = kinds.get(kind or "untimed", 0) + 1
        out.append(line if t is None or kind == "iso" else f"{iso_utc(t)} {line}")
    return out, kinds


JOURNAL_MAX_S = 253402300800.0  # year 10000: beyond it no calendar (or gmtime) has a date


def seconds(value: Any) -> float:
    """Unix seconds from a number or its text; a ValueError unless 0 <= t < year 10000 (NaN and
    infinity are none: `iso_utc` could not write them)."""
    t = float(value)
    if not 0 <= t < JOURNAL_MAX_S:
        raise ValueError(f"{value!r} is not a time")
    return t


def _journal_json(line: str, where: str, n: int) -> str:
    try:
        doc = json.loads(line)
        t = int(doc["__REALTIME_TIMESTAMP"]) / 1e6
        msg = doc.get("MESSAGE", "")
        if not 0 <= t < JOURNAL_MAX_S:
            raise ValueError(f"__REALTIME_TIMESTAMP {t:.0f} s is not a time")
        if isinstance(msg, list):  # journald stores non-UTF-8 messages as byte arrays
            msg = bytes(msg).decode("utf-8", "replace")
        if not isinstance(msg, str):
            raise TypeError(f"MESSAGE is a {type(msg).__name__}")
    except (ValueError, KeyError, TypeError, OverflowError) as exc:
        raise ImportFailure(
            f"{where}:{n}: not a journalctl -o json record (want __REALTIME_TIMESTAMP and "
            f"MESSAGE): {exc}"
        ) from None
    return f"{iso_utc(t)} {msg}"


# --- Slurm state ------------------------------------------------------------------------------
_KV = re.compile(r"([A-Za-z_]+)=(\S*)")
_KEYS = {
    "jobid": "job_id",
    "job_id": "job_id",
    "jobname": "name",
    "name": "name",
    "jobstate": "state",
    "state": "state",
    "exitcode": "exit_code",
    "exit_code": "exit_code",
    "nodelist": "nodes",
    "nodes": "nodes",
    "starttime": "start",
    "start": "start",
    "endtime": "end",
    "end": "end",
    "restarts": "restarts",
    "restart_cnt": "restarts",
}


def slurm_state(text: str, where: str, job_id: str | None = None) -> dict[str, Any]:
    """{job_id, name, state, exit_code, nodes, start, end, restarts} (what the file says); of
    job `job_id` where the file holds several (`sacct --json` of a user's day, say), which it
    must name then."""
    body = text.strip()
    if body.startswith("{"):
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise ImportFailure(f"{where}: unreadable JSON: {exc}") from None
        jobs = doc.get("jobs") if isinstance(doc, dict) else None
        if not isinstance(jobs, list) or not jobs:
            raise ImportFailure(f"{where}: want sacct --json or squeue --json (a 'jobs' list)")
        return _one([partial(_json_job, j, where) for j in jobs], where, job_id)
    if all(line.count("|") == 6 for line in body.splitlines()):
        rows = [line.split("|") for line in body.splitlines()]  # the name second, as documented
        rows = [[r[0], *r[2:], r[1], r[0]] for r in rows]  # as the exporter asks sacct
        jobs = slurm_exporter.parse_sacct("\n".join("|".join(r) for r in rows))
        if not jobs:
            raise ImportFailure(
                f"{where}: want `sacct -X -n -P -o JobID,JobName,Partition,State,ExitCode,"
                "NodeList,AllocTRES`"
            )
        return _one([partial(_exported, j, where) for j in jobs.values()], where, job_id)
    kv = {_KEYS[k.lower()]: v for k, v in _KV.findall(body) if k.lower() in _KEYS}
    if "state" not in kv and "exit_code" not in kv:
        raise ImportFailure(
            f"{where}: no job state; accepted: sacct/squeue --json, sacct -P, or key=value "
            "(JobId= JobState= ExitCode= NodeList= as scontrol show job prints, or job_id= "
            "state= exit_code= nodes=)"
        )
    out: dict[str, Any] = dict(kv)
    if "exit_code" in kv:
        code, _, sig = kv["exit_code"].partition(":")
        if not code.lstrip("-").isdigit():
            raise ImportFailure(f"{where}: exit_code {kv['exit_code']!r}: want N or N:SIGNAL")
        out["exit_code"] = 128 + int(sig) if sig.isdigit() and int(sig) else int(code)
    if "nodes" in kv:
        out["nodes"] = _as(_hostlist, kv["nodes"], where, "NodeList", None)
    if "state" in kv:
        out["state"] = kv["state"].split()[0].upper()
    for key in ("start", "end"):
        if key in kv:
            out[key] = _when(kv[key], where, key)
    if "restarts" in kv:
        out["restarts"] = int(kv["restarts"]) if kv["restarts"].isdigit() else None
    return _clean(out, where)


def _one(
    parsers: list[Callable[[], dict[str, Any]]], where: str, job_id: str | None
) -> dict[str, Any]:
    """The job `job_id` of a file's jobs, or its only one; an ImportFailure naming them else.
    A job the file spells wrong refuses the file only when it is the one wanted (or may be)."""
    jobs, errors = [], []
    for parse in parsers:
        try:
            jobs.append(parse())
        except ImportFailure as exc:
            errors.append(exc)
    if errors and (not jobs or job_id is None):
        raise errors[0]
    ids = list(dict.fromkeys(str(j.get("job_id")) for j in jobs))
    if job_id is not None:
        match = [j for j in jobs if str(j.get("job_id")) == job_id]
        if not match:
            if errors:
                raise errors[0]
            raise ImportFailure(f"{where} has no job {job_id} (it holds {_listed(ids)})")
        return match[0]
    if len(ids) > 1:
        raise ImportFailure(f"{where} holds jobs {_listed(ids)}: pass --job-id")
    return jobs[0]


def _listed(ids: list[str]) -> str:
    return ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")


def _exported(j: Any, where: str, restarts: bool = False) -> dict[str, Any]:
    """A job parsed by the Slurm exporter's own parsers (sacct or squeue), as a state record."""
    out = {"job_id": j.job_id, "name": j.name, "state": j.state.upper(), "exit_code": j.exit_code,
           "nodes": j.nodes}  # fmt: skip
    if restarts:
        out["restarts"] = j.restarts
    return _clean(out, where)


def _json_job(j: Any, where: str) -> dict[str, Any]:
    if not isinstance(j, dict):
        raise ImportFailure(f"{where}: 'jobs' holds {json.dumps(j)[:40]}: want job objects")
    if "job_state" in j:  # squeue --json: the exporter's own parser
        parsed = slurm_exporter.parse_squeue(json.dumps({"jobs": [j]}))
        if not parsed:
            raise ImportFailure(f"{where}: the squeue job has no valid job_id")
        return _exported(next(iter(parsed.values())), where, restarts=True)
    state = j.get("state", {})
    current = state.get("current") if isinstance(state, dict) else state
    current = current[0] if isinstance(current, list) and current else current
    ec = j.get("exit_code", {})
    code = _number(ec.get("return_code") if isinstance(ec, dict) else ec)
    sig = ec.get("signal", {}) if isinstance(ec, dict) else None
    sig = _number(sig.get("id") if isinstance(sig, dict) else sig)
    code = _as(int, code, where, "exit_code", "a whole number")
    sig = _as(int, sig, where, "exit_code.signal.id", "a signal number")
    t = j.get("time", {}) if isinstance(j.get("time"), dict) else {}
    nodes = j.get("nodes")
    nodes = ",".join(map(str, nodes)) if isinstance(nodes, list) else str(nodes or "")
    out = {
        "job_id": str(j.get("job_id", "")),
        "name": str(j.get("name", ""))[:128],
        "state": str(current or "").upper() or None,
        "exit_code": 128 + sig if sig else code,
        "nodes": _as(_hostlist, nodes, where, "nodes", None),
        "start": _as(seconds, _number(t.get("start")) or None, where, "time.start", _SECONDS),
        "end": _as(seconds, _number(t.get("end")) or None, where, "time.end", _SECONDS),
        "restarts": _as(int, _number(j.get("restart_cnt")), where, "restart_cnt", "a count"),
    }
    return _clean(out, where)


_SECONDS = "unix seconds (from 1970 to the year 9999)"


def _number(value: Any) -> Any:
    """A number of Slurm's JSON as it is, or Slurm 23.02's `{"set": ..., "number": N}`'s N (None
    when unset)."""
    if isinstance(value, dict) and "number" in value:
        return value["number"] if value.get("set", True) else None
    return value


def _hostlist(text: str) -> list[str]:
    return names.expand_hostlist(text, skip_invalid=True)


def _as(convert: Callable[[Any], Any], value: Any, where: str, key: str, want: str | None) -> Any:
    """`convert(value)` (None for None or ""), or an ImportFailure naming the file, the field,
    the value and what is wanted (`want`; None: the converter's own words)."""
    if value is None or value == "":
        return None
    try:
        return convert(value)
    except (ValueError, TypeError, OverflowError) as exc:
        why = f": {exc}" if want is None else f" {json.dumps(value)[:40]}: want {want}"
        raise ImportFailure(f"{where}: {key}{why}") from None


def _when(text: str, where: str, key: str) -> float | None:
    if text in ("", "Unknown", "None", "N/A"):
        return None
    try:
        return seconds(text)
    except ValueError:
        pass
    t, kind = line_time(text, time.time())
    if t is None or kind != "iso":
        raise ImportFailure(f"{where}: {key}={text!r}: want {_SECONDS} or ISO 8601")
    return t


def _clean(doc: dict[str, Any], where: str) -> dict[str, Any]:
    job = doc.get("job_id")
    if job is not None and not names.valid_job_id(str(job)):
        raise ImportFailure(f"{where}: job_id {job!r} is not a Slurm job id")
    start, end = doc.get("start"), doc.get("end")
    if start is not None and end is not None and end < start:
        raise ImportFailure(
            f"{where}: job {job}: its end ({end:.0f}) is before its start ({start:.0f})"
        )
    return {k: v for k, v in doc.items() if v not in (None, "", [])}

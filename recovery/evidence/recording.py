"""Offline evidence: a recording directory (docs/contracts.md "Recording format") and files.

Produces the same `Bundle` the live collectors do, so `goodput attribute` runs the same
engine: GPU rows of the job become `Series` (blank cells are absent samples), job metrics
become `Series` named after their columns, logs become `LogLine`s.
"""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path
from typing import Any

from catalogue.recording import gzip_checked, read_meta
from recovery import validate
from recovery.evidence import Bundle, Context, LogLine, Report, Series, SlurmFacts
from recovery.evidence.logs import read_lines

_ID_COLS = {"timestamp", "node", "gpu", "job_id"}


def read_truth(directory: Path) -> list[dict[str, Any]]:
    path = directory / "truth.json"
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    return data if isinstance(data, list) else data.get("faults", [])


PRESENCE = "DCGM_FI_DEV_GPU_UTIL"
GPU_FILES = ("gpu_metrics.csv.gz", "gpu_metrics.csv")
JOB_FILES = ("job_metrics.csv.gz", "job_metrics.csv")
_KEYS = {  # the columns a recording's CSV must have (docs/contracts.md)
    **dict.fromkeys(GPU_FILES, ("timestamp", "node", "gpu")),
    **dict.fromkeys(JOB_FILES, ("timestamp", "job_id")),
}


def _rows(path: Path) -> Any:
    """The CSV's rows as dicts; a ValueError naming `path` when it is empty or lacks a column
    its kind must have (`_KEYS`)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with gzip_checked(path), opener(path, "rt", newline="") as f:  # type: ignore[operator]
        reader = csv.DictReader(f)
        if reader.fieldnames is None:
            raise ValueError(f"{path}: empty (want a CSV with a header line)")
        if missing := [k for k in _KEYS.get(path.name, ()) if k not in reader.fieldnames]:
            raise ValueError(f"{path}: no {missing[0]} column")
        yield from reader


def _number(row: dict[str, Any], col: str, path: Path) -> float:
    """`row[col]` as a number, or a ValueError naming the file, the column and the value."""
    try:
        return float(row[col])
    except (TypeError, ValueError):
        raise ValueError(f"{path}: column {col!r}: {row[col]!r} is not a number") from None


def _series(path: Path, job_id: str | None, nodes: set[str]) -> list[Series]:
    acc: dict[tuple[str, str | None, str | None], list[tuple[float, float]]] = {}
    for row in _rows(path):
        row_job = row.get("job_id") or None
        node = row.get("node") or None
        if nodes and node in nodes and row.get(PRESENCE) not in ("", None):
            # node_presence: is the node answering at all, whatever runs there
            acc.setdefault(("node_presence", node, row.get("gpu") or None), []).append(
                (_number(row, "timestamp", path), _number(row, PRESENCE, path))
            )
        if job_id is not None and row_job != job_id:
            continue
        if job_id is None and nodes and node not in nodes:
            continue
        if node is not None and not validate.NODE.fullmatch(node):
            continue
        gpu = row.get("gpu") or None
        t = _number(row, "timestamp", path)
        for col, value in row.items():
            if col in _ID_COLS or value in ("", None):
                continue
            try:
                v = float(value)
            except ValueError:
                continue
            acc.setdefault((col, node, gpu), []).append((t, v))
    return [
        Series(
            name=name,
            points=sorted(pts),
            node=node,
            gpu=gpu,
            job_id=job_id,
            query=f"{path.name}:{name}",
        )
        for (name, node, gpu), pts in acc.items()
    ]


def jobs_in(directory: Path) -> list[dict[str, Any]]:
    """The recording's jobs: meta.json's list, else the job ids its GPU rows carry."""
    jobs = read_meta(directory).get("jobs", [])
    if jobs:
        return jobs
    for name in GPU_FILES:
        if (directory / name).is_file():
            ids = sorted({r.get("job_id") or "" for r in _rows(directory / name)} - {""})
            return [{"job_id": j} for j in ids]
    return []


def choose_job(directory: Path, job_id: str | None) -> tuple[str | None, str]:
    """(job id, why it was chosen). Never guessed from ground truth: several jobs and no
    `job_id` is a ValueError listing them."""
    jobs = jobs_in(directory)
    ids = [str(j.get("job_id")) for j in jobs]
    listing = ", ".join(f"{j.get('job_id')} ({j.get('name') or '?'})" for j in jobs)
    if job_id is not None:
        if ids and job_id not in ids:
            raise ValueError(f"job {job_id} is not in {directory.name}; its jobs: {listing}")
        return job_id, "given with --job-id"
    if len(ids) == 1:
        return ids[0], f"the only job in {directory.name}"
    if not ids:
        return None, f"{directory.name} names no job"
    raise ValueError(f"{directory.name} holds {len(ids)} jobs; pick one with --job-id: {listing}")


def context(directory: Path, job_id: str | None = None) -> Context:
    """The incident context for `job_id` in a recording: its nodes and the window. Without a
    job id (notebooks on simulated recordings) the faulty job of truth.json, else the first;
    `goodput attribute` never relies on that: it asks `choose_job` first."""
    meta = read_meta(directory)
    if job_id is None:
        truth = read_truth(directory)
        job_id = next((str(f["job_id"]) for f in truth if f.get("job_id")), None)
        if job_id is None and meta.get("jobs"):
            job_id = str(meta["jobs"][0]["job_id"])
    job: dict[str, Any] = next(
        (j for j in meta.get("jobs", []) if str(j.get("job_id")) == job_id), {}
    )
    nodes = [n for n in job.get("nodes") or [] if validate.NODE.fullmatch(n)]
    if not nodes and job_id is not None:
        nodes = sorted(n for n in meta.get("nodes") or [] if validate.NODE.fullmatch(str(n)))
    start = float(meta.get("start", job.get("start", 0)) or 0)
    end = float(meta.get("end", job.get("end", start)) or start)
    return Context(job_id=job_id, nodes=nodes, start=start, end=end, job_name=job.get("name"))


def collect(directory: Path, ctx: Context) -> Bundle:
    """Metrics and logs of the recording for `ctx`."""
    bundle = Bundle()
    series: list[Series] = []
    held: list[str] = []
    for group in (GPU_FILES, JOB_FILES):
        path = next((directory / n for n in group if (directory / n).is_file()), None)
        if path is None:
            held.append(f"{group[0]}: absent")
            continue
        if group[0].startswith("job") and not ctx.job_id:
            continue
        got = _series(path, ctx.job_id, set(ctx.nodes) if group[0].startswith("gpu") else set())
        series += got
        names = {x.name for x in got if x.name != "node_presence"}
        held.append(
            f"{path.name}: {len(names)} metric(s) of job {ctx.job_id}"
            if names
            else f"{path.name}: no rows of job {ctx.job_id}"
        )
    bundle.series = series
    bundle.reports.append(Report("prometheus", "ok" if series else "empty", "; ".join(held)))
    logs = directory / "logs"
    lines: list[LogLine] = []
    seen: list[str] = []
    paths: list[tuple[Path, str, str | None]] = []
    if ctx.job_id:
        paths.append((logs / "jobs" / f"slurm-{validate.job_id(ctx.job_id)}.out", "job", None))
    paths += [(logs / "kernel" / f"{validate.node(n)}.log", "kernel", n) for n in ctx.nodes]
    for p, kind, node in paths:
        rel = p.relative_to(directory)
        if p.is_file():
            got_lines = read_lines(p, kind, node, ctx.job_id, None, None)
            lines += got_lines
            seen.append(f"{rel}: {len(got_lines)} lines")
        else:
            seen.append(f"{rel}: absent")
    bundle.lines = lines
    bundle.reports.append(
        Report("logs", "ok" if lines else "empty", "; ".join(seen) or "no job and no nodes")
    )
    job = next(
        (j for j in read_meta(directory).get("jobs", []) if str(j.get("job_id")) == ctx.job_id),
        None,
    )
    if job and job.get("state"):
        bundle.slurm = SlurmFacts(
            job={
                "job_id": ctx.job_id,
                "name": job.get("name"),
                "state": job["state"],
                "exit_code": job.get("exit_code"),
                "restarts": job.get("restarts"),
                "nodes": ctx.nodes,
                "argv": "meta.json",
            },
            query="meta.json",
        )
        state = f"{job['state']}, exit code {job.get('exit_code')}"
        bundle.reports.append(Report("slurm", "ok", f"meta.json: job {ctx.job_id} {state}"))
    else:
        if job:  # its nodes, at least: where a node its log names may be blamed
            bundle.slurm = SlurmFacts(
                job={"job_id": ctx.job_id, "name": job.get("name"), "nodes": ctx.nodes},
                query="meta.json",
            )
        bundle.reports.append(Report("slurm", "empty", "meta.json: no job state (absent)"))
    return bundle


def collect_files(ctx: Context, job_log: Path | None, kernel_logs: list[Path]) -> Bundle:
    """Evidence from explicit files (kernel log `<node>.log` names its node)."""
    lines = []
    if job_log is not None:
        lines += read_lines(job_log, "job", None, ctx.job_id, None, None)
    for p in kernel_logs:
        node = p.stem if validate.NODE.fullmatch(p.stem) else None
        if node and node not in ctx.nodes:
            ctx.nodes.append(node)
        lines += read_lines(p, "kernel", node, ctx.job_id, None, None)
    return Bundle(lines=lines, reports=[Report("logs", "ok" if lines else "empty")])

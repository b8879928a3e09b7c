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

from recovery import validate
from recovery.evidence import Bundle, Context, Report, Series, SlurmFacts
from recovery.evidence.logs import read_lines

_ID_COLS = {"timestamp", "node", "gpu", "job_id"}


def read_meta(directory: Path) -> dict[str, Any]:
    path = directory / "meta.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def read_truth(directory: Path) -> list[dict[str, Any]]:
    path = directory / "truth.json"
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    return data if isinstance(data, list) else data.get("faults", [])


def _rows(path: Path) -> Any:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as f:  # type: ignore[operator]
        yield from csv.DictReader(f)


PRESENCE = "DCGM_FI_DEV_GPU_UTIL"


def _series(path: Path, job_id: str | None, nodes: set[str]) -> list[Series]:
    acc: dict[tuple[str, str | None, str | None], list[tuple[float, float]]] = {}
    for row in _rows(path):
        row_job = row.get("job_id") or None
        node = row.get("node") or None
        if nodes and node in nodes and row.get(PRESENCE) not in ("", None):
            # node_presence: is the node answering at all, whatever runs there
            acc.setdefault(("node_presence", node, row.get("gpu") or None), []).append(
                (float(row["timestamp"]), float(row[PRESENCE]))
            )
        if job_id is not None and row_job != job_id:
            continue
        if job_id is None and nodes and node not in nodes:
            continue
        if node is not None and not validate.NODE.fullmatch(node):
            continue
        gpu = row.get("gpu") or None
        t = float(row["timestamp"])
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


def context(directory: Path, job_id: str | None = None) -> Context:
    """The incident context a recording implies: the faulty (or first) job, its nodes, window."""
    meta = read_meta(directory)
    truth = read_truth(directory)
    jobs = meta.get("jobs", [])
    if job_id is None:
        job_id = next((str(f["job_id"]) for f in truth if f.get("job_id")), None)
    if job_id is None and jobs:
        job_id = str(jobs[0]["job_id"])
    job: dict[str, Any] = next((j for j in jobs if str(j.get("job_id")) == job_id), {})
    nodes = [n for n in job.get("nodes", []) if validate.NODE.fullmatch(n)]
    start = float(meta.get("start", job.get("start", 0)) or 0)
    end = float(meta.get("end", job.get("end", start)) or start)
    return Context(job_id=job_id, nodes=nodes, start=start, end=end, job_name=job.get("name"))


def collect(directory: Path, ctx: Context) -> Bundle:
    """Metrics and logs of the recording for `ctx`."""
    bundle = Bundle()
    series: list[Series] = []
    for name in ("gpu_metrics.csv.gz", "gpu_metrics.csv"):
        if (directory / name).is_file():
            series += _series(directory / name, ctx.job_id, set(ctx.nodes))
            break
    for name in ("job_metrics.csv.gz", "job_metrics.csv"):
        if (directory / name).is_file() and ctx.job_id:
            series += _series(directory / name, ctx.job_id, set())
            break
    bundle.series = series
    bundle.reports.append(
        Report(
            "prometheus",
            "ok" if series else "empty",
            f"recording {directory.name}" if series else "no metrics",
        )
    )
    logs = directory / "logs"
    lines = []
    if ctx.job_id:
        p = logs / "jobs" / f"slurm-{validate.job_id(ctx.job_id)}.out"
        if p.is_file():
            lines += read_lines(p, "job", None, ctx.job_id, None, None)
    for n in ctx.nodes:
        p = logs / "kernel" / f"{validate.node(n)}.log"
        if p.is_file():
            lines += read_lines(p, "kernel", n, ctx.job_id, None, None)
    bundle.lines = lines
    bundle.reports.append(Report("logs", "ok" if lines else "empty", "" if lines else "no logs"))
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
        bundle.reports.append(Report("slurm", "ok", "from the recording's meta.json"))
    else:
        bundle.reports.append(Report("slurm", "empty", "offline: no scheduler facts"))
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

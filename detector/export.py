"""Export one job's time range from Prometheus as a recording (docs/contracts.md format).

What is read (range queries on one step grid, chunked under Prometheus' 11,000 points):
- the job's nodes and name: `goodput_slurm_job_node_info{job_id}`, and dcgm series whose
  `hpc_job` is the job;
- every `DCGM_FI_*` series of those nodes (`Hostname` or `hostname`), all GPUs, so peers and
  idle GPUs are there too; a row's `job_id` is its `hpc_job`, else the job while Slurm placed it
  on that node; and, where exported, the GPUs' processes on the host in cores (irate of the NVML
  exporter's `goodput_gpu_process_cpu_seconds_total`, as the detector reads it);
- the job's `goodput_job_*` log metrics (max over ranks).
Logs are copied from a log directory laid out as on the local stack (`jobs/slurm-<id>.out`,
`kernel/<node>.log`) when one is given. No `truth.json`: ground truth is not known.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

from catalogue import logfiles, names, promql, recording
from clients.prometheus import PromClient, PromError
from detector import fields as F
from detector.frame import JOB_RE, NODE_RE
from detector.ingest import host_cores

FORMAT = recording.FORMAT
MAX_RANGE_S = 31 * 86400
JOB_METRICS = recording.JOB_METRICS
HOST_LABELS = ("Hostname", "hostname")
MAX_BYTES = 512 << 20  # one answer: every DCGM field of the nodes over up to 10,000 steps


class ExportError(ValueError):
    """Bad input, Prometheus unreachable or in error, or nothing to export."""


def _range(
    prom: PromClient, expr: str, start: float, end: float, step: float
) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
    try:
        return prom.query_range(expr, start, end, step)
    except PromError as exc:
        raise ExportError(str(exc)) from exc


def _num(v: float) -> str:
    if math.isnan(v) or math.isinf(v):
        return "nan" if math.isnan(v) else ""
    return repr(float(v)) if abs(v) >= 1e6 else f"{v:.10g}"


def export_recording(
    prometheus_url: str,
    job_id: str,
    start: float,
    end: float,
    out: str | Path,
    step: float = 5.0,
    log_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Write the recording directory `out`; returns its meta.json content."""
    if not JOB_RE.match(job_id):
        raise ExportError(f"--job-id must look like a Slurm job id (123 or 123_4), not {job_id!r}")
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        raise ExportError("--end must be after --start (unix seconds)")
    if end - start > MAX_RANGE_S:
        raise ExportError(f"the range is longer than {MAX_RANGE_S // 86400} days; export less")
    if not 0.1 <= step <= 3600:
        raise ExportError("--step must be between 0.1 and 3600 seconds")
    try:
        prom = PromClient(prometheus_url, timeout=30.0, max_bytes=MAX_BYTES)
    except ValueError as exc:
        raise ExportError(f"--prometheus: {exc}") from None
    grid = (start, end, step)

    placed: dict[str, set[float]] = defaultdict(set)  # node -> times Slurm had the job there
    name = job_id
    for labels, values in _range(
        prom,
        "max by (node, job_name) "
        f"({promql.selector('goodput_slurm_job_node_info', job_id=job_id)})",
        *grid,
    ):
        node = labels.get("node", "")
        if NODE_RE.match(node):
            placed[node].update(t for t, _ in values)
            name = labels.get("job_name") or name
    for host in HOST_LABELS:
        for labels, _ in _range(
            prom,
            f"count by ({host}) ({promql.selector('DCGM_FI_DEV_GPU_TEMP', hpc_job=job_id)})",
            *grid,
        ):
            if NODE_RE.match(labels.get(host, "")):
                placed.setdefault(labels[host], set())
    if not placed:
        raise ExportError(
            f"job {job_id}: no nodes found between {start:.0f} and {end:.0f} "
            "(neither goodput_slurm_job_node_info nor dcgm hpc_job)"
        )
    nodes = sorted(placed)

    gpu_rows: dict[tuple[float, str, str], dict[str, Any]] = {}
    fields: set[str] = set()
    for host in HOST_LABELS:
        expr = promql.selector("", '__name__=~"DCGM_FI_.+"', **{host: nodes})
        for labels, values in _range(prom, expr, *grid):
            metric, node, gpu = labels.get("__name__", ""), labels.get(host, ""), labels.get("gpu")
            if node not in placed or gpu is None or not gpu.isdigit():
                continue
            fields.add(metric)
            hpc = labels.get("hpc_job", "")
            model = labels.get("modelName", "")[: names.MODEL_NAME_MAX]
            for t, v in values:
                row = gpu_rows.setdefault((t, node, gpu), {"job_id": ""})
                row[metric] = v
                if model:
                    row["modelName"] = model
                if hpc:
                    row["job_id"] = hpc
                elif not row["job_id"] and t in placed[node]:
                    row["job_id"] = job_id
    if not gpu_rows:
        raise ExportError(f"job {job_id}: no DCGM_FI_* series for nodes {nodes} in the range")
    cpu = promql.selector(F.HOST_CPU_COUNTER, node=nodes)  # the GPUs' processes on the host
    for labels, values in _range(prom, host_cores(cpu), *grid):
        node, gpu = labels.get("node", ""), labels.get("gpu", "")
        for t, v in values:  # as the detector reads them, onto the GPUs the fields found
            if (t, node, gpu) in gpu_rows:
                gpu_rows[(t, node, gpu)][F.HOST_CPU] = v
                fields.add(F.HOST_CPU)

    job_rows: dict[float, dict[str, float]] = defaultdict(dict)
    for metric in JOB_METRICS:
        for _, values in _range(
            prom, f"max by (job_id) ({promql.selector(metric, job_id=job_id)})", *grid
        ):
            for t, v in values:
                job_rows[t][metric] = v

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cols = sorted(fields)
    with gzip.open(out / "gpu_metrics.csv.gz", "wt", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["timestamp", "node", "gpu", "job_id", "modelName", *cols])
        for (t, node, gpu), row in sorted(
            gpu_rows.items(), key=lambda kv: (kv[0][0], kv[0][1], int(kv[0][2]))
        ):
            ids = [f"{t:.3f}", node, gpu, row["job_id"], row.get("modelName", "")]
            w.writerow([*ids, *(_cell(row.get(c)) for c in cols)])
    with gzip.open(out / "job_metrics.csv.gz", "wt", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["timestamp", "job_id", *JOB_METRICS])
        for t in sorted(job_rows):
            w.writerow([f"{t:.3f}", job_id, *(_cell(job_rows[t].get(c)) for c in JOB_METRICS)])
    on_job = sorted({t for (t, _, _), r in gpu_rows.items() if r["job_id"] == job_id})
    gpus = {(n, g) for (_, n, g) in gpu_rows}
    meta = {
        "format": FORMAT,
        "scenario": None,
        "source": "prometheus",
        "seed": None,
        "start": start,
        "end": end,
        "interval_s": step,
        "nodes": nodes,
        "gpus_per_node": max(sum(1 for n2, _ in gpus if n2 == n) for n in nodes),
        "jobs": [
            {
                "job_id": job_id,
                "name": name,
                "nodes": nodes,
                "start": on_job[0] if on_job else None,
                "end": on_job[-1] if on_job and on_job[-1] < end - step else None,
            }
        ],
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    if log_dir:
        _copy_logs(Path(log_dir), out / "logs", job_id, nodes)
    return meta


def write_recording(
    out: str | Path,
    gpu: Any,
    jobs: Any | None,
    meta: dict[str, Any],
    logs: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """Write a recording from tables: `gpu` (timestamp, node, gpu, job_id, modelName where
    known, DCGM_FI_*), `jobs`
    (timestamp, job_id, goodput_job_*) or None, `meta` (format and interval added when
    missing), `logs` relative path under logs/ -> lines. Returns the meta written."""
    import pandas as pd

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    g = gpu.copy()
    g["timestamp"] = g["timestamp"].map(lambda t: f"{float(t):.3f}")
    g.to_csv(out / "gpu_metrics.csv.gz", index=False, float_format="%.10g", na_rep="")
    if jobs is not None and len(jobs):
        j = pd.DataFrame(jobs).reindex(columns=["timestamp", "job_id", *JOB_METRICS])
        j["timestamp"] = j["timestamp"].map(lambda t: f"{float(t):.3f}")
        for c in (  # unix times to the millisecond (%.10g would cut them to whole seconds)
            "goodput_job_last_progress_timestamp_seconds",
            "goodput_job_last_checkpoint_timestamp_seconds",
            "goodput_job_last_pause_timestamp_seconds",
        ):
            j[c] = j[c].map(lambda t: "" if pd.isna(t) else f"{float(t):.3f}")
        j.to_csv(out / "job_metrics.csv.gz", index=False, float_format="%.10g", na_rep="")
    for rel, lines in (logs or {}).items():
        path = out / "logs" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{ln}\n" for ln in lines))
    meta = {"format": FORMAT, **meta}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta


def _cell(v: float | None) -> str:
    return "" if v is None else _num(v)


def _copy_logs(src: Path, dst: Path, job_id: str, nodes: list[str]) -> None:
    pairs = [(src / "jobs" / f"slurm-{job_id}.out", dst / "jobs" / f"slurm-{job_id}.out")]
    pairs += [(src / "kernel" / f"{n}.log", dst / "kernel" / f"{n}.log") for n in nodes]
    for a, b in pairs:
        try:  # only a regular file, not through a link: the job's user wrote the directory
            f = logfiles.open_regular(a)
        except OSError:
            continue  # absent, a link or a FIFO: the recording has no log of it
        with f:
            b.parent.mkdir(parents=True, exist_ok=True)
            with b.open("wb") as out:
                shutil.copyfileobj(f, out)

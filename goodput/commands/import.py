"""`goodput import`: your own files (GPU samples, job log, kernel logs, Slurm state) -> a
recording directory (docs/contracts.md) that `goodput replay` and `goodput attribute` read.

Wiring only: GPU samples by `detector.samples`, job metrics from the job log by the production
log parser and kernel/Slurm files by `exporters.importer`, the directory by
`detector.export.write_recording`.
"""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path
from typing import Any

import pandas as pd
import typer

from catalogue.logfiles import unreadable

app = typer.Typer(help="Bring your own files: DCGM samples, logs, Slurm state -> a recording.")


def command(
    metrics: list[Path] = typer.Option(
        ..., "--metrics", help="GPU samples: CSV/Parquet (wide or long) or Prometheus JSON."
    ),
    out: Path = typer.Option(..., "--out", help="Recording directory to write (new or empty)."),
    job_log: Path | None = typer.Option(
        None, "--job-log", help="The job's output, timestamped lines (.gz read as gzip)."
    ),
    kernel_log: list[str] = typer.Option(
        [], "--kernel-log", help="[NODE=]FILE: dmesg, dmesg -T or journalctl; repeatable."
    ),
    slurm: Path | None = typer.Option(
        None, "--slurm", help="sacct/squeue --json, sacct -P, or key=value (scontrol show job)."
    ),
    job_id: str | None = typer.Option(
        None, "--job-id", help="Slurm job id (default: from --slurm)."
    ),
    job_name: str | None = typer.Option(
        None, "--job-name", help="Job name (baselines are per name)."
    ),
    node: str | None = typer.Option(None, "--node", help="Node of files without a node column."),
    gpu: int | None = typer.Option(None, "--gpu", help="GPU index of files without a GPU column."),
    boot_time: str | None = typer.Option(
        None, "--boot-time", help="Unix s or ISO 8601: for dmesg lines in seconds since boot."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Write OUT as a recording; say what each file was read as."""
    from catalogue import names
    from detector import samples
    from detector.export import write_recording
    from exporters import importer

    def fail(msg: str) -> typer.Exit:
        typer.echo(f"import: {msg}", err=True)
        return typer.Exit(2)

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise fail(f"--out {out}: exists and is not an empty directory")
    for p in [*metrics, job_log, slurm]:
        if p is not None and (why := unreadable(p)):
            raise fail(f"{p}: {why}")
    if gpu is not None and not 0 <= gpu <= 999:
        raise fail("--gpu must be a GPU index 0..999")
    if job_id is not None and not names.valid_job_id(job_id):
        raise fail(f"--job-id {job_id!r}: want a Slurm job id (123 or 123_4)")
    report: dict[str, Any] = {"out": str(out), "files": {}}
    try:
        boot = _boot(boot_time, importer) if boot_time else None
        job: dict[str, Any] = {}
        if slurm is not None:
            job = importer.slurm_state(slurm.read_text(errors="replace"), str(slurm), job_id)
            report["files"][str(slurm)] = [f"Slurm state: {_fields(job)}"]
        if job_id and job.get("job_id") and job["job_id"] != job_id:
            raise importer.ImportFailure(f"--job-id {job_id} but {slurm} is job {job['job_id']}")
        job_id = job_id or job.get("job_id")
        read = [samples.read(p, node=node, gpu=gpu) for p in metrics]
        for p, got in zip(metrics, read, strict=True):
            report["files"][str(p)] = [*got.notes, f"{len(got.gpu)} rows"]
        gpu_df = pd.concat([g.gpu for g in read], ignore_index=True)
        files = [str(p) for p, g in zip(metrics, read, strict=True) for _ in range(len(g.gpu))]
        gpu_df, merged = samples.merge_repeats(gpu_df, files)
        for name, note in merged:
            report["files"][name].append(note)
        gpu_df = gpu_df.sort_values(["timestamp", "node", "gpu"], kind="stable")
        jobs_in = sorted(set(gpu_df.job_id) - {""})
        if job_id is None and len(jobs_in) == 1:
            job_id = jobs_in[0]
        if job_id is None:
            raise importer.ImportFailure(
                "no job id: pass --job-id or --slurm"
                + (f" (the samples carry {jobs_in})" if jobs_in else "")
            )
        n = samples.label(gpu_df, job_id, job.get("start"), job.get("end"))
        window = "within the Slurm start/end" if job.get("start") or job.get("end") else "all"
        mine = (gpu_df.job_id == job_id).to_numpy()
        of_job = int(mine.sum())
        if not of_job:
            t = gpu_df.timestamp.astype(float)
            raise importer.ImportFailure(
                f"no sample is of job {job_id}: the samples span {_iso(t.min())} to "
                f"{_iso(t.max())}, Slurm's start/end {_iso(job.get('start'))} to "
                f"{_iso(job.get('end'))}"
                if window != "all"
                else f"no sample is of job {job_id} (the samples carry {jobs_in})"
            )
        report["files"][str(metrics[0])].append(
            f"{n} rows given job {job_id} ({window})"
            if of_job == n  # else the samples carried it (dcgm-exporter's hpc_job)
            else f"{of_job} rows of job {job_id} ({of_job - n} labelled so in the samples, "
            f"{n} given it: {window})"
        )
        times = sorted(set(gpu_df.loc[mine, "timestamp"]))
        nodes = sorted(set(gpu_df.node))
        logs: dict[str, list[str]] = {}
        job_rows: list[dict[str, Any]] = []
        extra = [g.jobs for g in read if g.jobs is not None]
        if job_log is not None:
            lines = _lines(job_log)
            job_rows, stats = importer.job_metrics(lines, job_id, times, str(job_log))
            logs[f"jobs/slurm-{job_id}.out"] = lines
            report["files"][str(job_log)] = [
                f"{stats['lines']} lines, {stats['timed']} with a timestamp",
                f"patterns: {stats['patterns']}",
                f"{stats['rows']} job-metric samples derived (production log parser)",
            ]
        ref = times[-1] if times else time.time()
        for spec in kernel_log:
            k_node, path = _kernel_spec(spec, nodes, importer)
            klines, kinds = importer.kernel_lines(_lines(path), str(path), ref, boot)
            logs[f"kernel/{k_node}.log"] = klines
            report["files"][str(path)] = [f"kernel log of {k_node}: {len(klines)} lines {kinds}"]
    except (samples.SampleError, importer.ImportFailure, OSError) as exc:
        raise fail(str(exc)) from None
    jobs = pd.DataFrame(job_rows) if job_rows else (pd.concat(extra) if extra else None)
    if jobs is None:
        why = "no progress lines in --job-log" if job_log is not None else "no --job-log"
        report["warning"] = f"no job metrics ({why}): replay's progress detector is blind"
    on = gpu_df.loc[mine, "timestamp"]
    per_node = gpu_df.groupby("node").gpu.nunique()
    step = samples.gpu_interval(gpu_df.timestamp.to_numpy(), gpu_df.node, gpu_df.gpu)
    entry: dict[str, Any] = {
        "job_id": job_id,
        "name": job_name or job.get("name") or job_id,
        "nodes": job.get("nodes") or sorted(set(gpu_df.loc[mine].node)),
        "start": job.get("start", float(on.min()) if len(on) else None),
        "end": job.get("end", float(on.max()) if len(on) else None),
        **{k: job[k] for k in ("state", "exit_code", "restarts") if k in job},
    }
    meta: dict[str, Any] = {
        "scenario": None,
        "source": "import",
        "seed": None,
        "start": float(gpu_df.timestamp.min()),
        "end": float(gpu_df.timestamp.max()),
        "interval_s": round(step, 3) if step else None,
        "nodes": nodes,
        "gpus_per_node": int(per_node.max()),
        "jobs": [entry],
    }
    try:
        write_recording(out, gpu_df, jobs, meta, logs)
    except OSError as exc:
        raise fail(f"--out {out}: {exc.strerror or exc}") from None
    report["recording"] = {k: meta[k] for k in ("nodes", "gpus_per_node", "interval_s", "jobs")}
    if as_json:
        typer.echo(json.dumps(report, indent=1))
        return
    for path, notes in report["files"].items():
        typer.echo(f"{path}:")
        for note in notes:
            typer.echo(f"  {note}")
    if "warning" in report:
        typer.echo(f"warning: {report['warning']}")
    j = entry
    typer.echo(
        f"wrote {out}: job {j['job_id']} ({j['name']}) on {', '.join(nodes)}, "
        f"{meta['gpus_per_node']} GPU(s) per node, "
        + (f"every {meta['interval_s']} s" if meta["interval_s"] else "one instant")
        + (f", Slurm {j['state']} exit {j.get('exit_code')}" if "state" in j else "")
    )


def _iso(t: float | None) -> str:
    from exporters.importer import iso_utc

    return "-" if t is None else iso_utc(t)


def _lines(path: Path) -> list[str]:
    """A log's lines (gzipped when its name ends in .gz)."""
    from catalogue.recording import gzip_checked
    from exporters.importer import ImportFailure

    if path.suffix == ".gz":
        with gzip_checked(path, ImportFailure), gzip.open(path, "rt", errors="replace") as fh:
            return fh.read().splitlines()
    return path.read_text(errors="replace").splitlines()


def _fields(job: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in job.items())


def _boot(text: str, importer: Any) -> float:
    """--boot-time as unix seconds: a time in the past (a day's grace for clocks)."""
    try:
        value = float(text)
    except ValueError:
        t, kind = importer.line_time(text, time.time())
        if t is None or kind != "iso":
            raise importer.ImportFailure(
                f"--boot-time {text!r}: want unix seconds or ISO 8601"
            ) from None
        value = float(t)
    if not 0 <= value <= time.time() + 86400:  # NaN fails too
        raise importer.ImportFailure(
            f"--boot-time {text!r}: want a time in the past: unix seconds >= 0 or ISO 8601"
        )
    return value


def _kernel_spec(spec: str, nodes: list[str], importer: Any) -> tuple[str, Path]:
    """NODE=FILE, or FILE named <node>.log, or FILE when the samples have one node."""
    from catalogue import names

    name, sep, rest = spec.partition("=")
    if sep and names.valid_node(name):
        path = Path(rest)
    else:
        name, path = "", Path(spec)
    if why := unreadable(path):
        raise importer.ImportFailure(f"--kernel-log {spec}: {why}")
    node = name or (path.stem if path.stem in nodes else (nodes[0] if len(nodes) == 1 else ""))
    if not names.valid_node(node):
        raise importer.ImportFailure(
            f"--kernel-log {spec}: which node? write NODE=FILE (nodes: {', '.join(nodes)})"
        )
    return node, path

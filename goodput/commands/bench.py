"""`goodput bench`: the benchmarks. `faults` runs every fault scenario in simulated time."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import typer

from catalogue.logfiles import unreadable

app = typer.Typer(help="Benchmarks (results under bench/results/).", no_args_is_help=True)


def _progress(r: dict[str, Any]) -> None:
    """One line per finished fault-benchmark run."""
    f = r["faults"][0] if r["faults"] else None
    what = (
        f"{f['kind']}: detected={f['detected']} latency={f.get('latency_s')} "
        f"outcome={f.get('outcome')} action={f.get('effective_action')}"
        if f
        else f"healthy: {sum(i['class'] == 'false' for i in r['incidents'])} false incidents"
        f" in {r['healthy_gpu_hours']:g} GPU-h"
    )
    typer.echo(f"  {r['scenario']} seed {r['run']['seed']} ({r['wall_s']:g} s): {what}")


def _quiet() -> None:
    warnings.filterwarnings("ignore", module="starlette|httpx|fastapi")
    warnings.filterwarnings("ignore", category=DeprecationWarning)


def _out_dir(out: Path) -> Path:
    """--out: a directory to write into (made when missing), refused before any run when a file
    is in the way (a scale run found out only at its end)."""
    if out.exists() and not out.is_dir():
        raise typer.BadParameter(f"{out} exists and is not a directory")
    return out


def _out(files: str) -> Any:
    """The --out option of a benchmark writing `files`."""
    return typer.Option(Path("bench/results"), "--out", help=f"where {files} go", callback=_out_dir)


def _check_pattern(scenario: str | None) -> None:
    if scenario is not None and (not scenario or len(scenario) > 100 or "/" in scenario):
        raise typer.BadParameter("--scenario is a file-stem glob such as 'spin*'")


@app.command("faults")
def faults(
    quick: bool = typer.Option(False, "--quick", help="a few scenarios, one seed (CI)"),
    seeds: int = typer.Option(3, "--seeds", min=1, max=50, help="seeds per fault scenario"),
    scenario: str | None = typer.Option(
        None, "--scenario", help="only scenarios whose file stem matches this glob"
    ),
    out: Path = _out("faults.json/.md"),
    workers: int = typer.Option(
        0, "--workers", min=0, max=64, help="processes (0: 1 with --quick, else up to 2)"
    ),
) -> None:
    """Fault-injection benchmark: detector, alerts, attribution and policy, in simulated time."""
    from bench import faults as bench_faults

    _quiet()
    _check_pattern(scenario)
    n = workers or (1 if quick else min(2, os.cpu_count() or 1))

    try:
        bench_faults.benchmark(quick, seeds, scenario, out, n, _progress)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    typer.echo("")
    typer.echo((out / "faults.md").read_text())


@app.command("tuning")
def tuning(
    after: Path = typer.Option(..., "--after", help="the tuned alert conditions file"),
    before: Path | None = typer.Option(
        None, "--before", help="the file to compare with (default: alertmanager/alerts.yaml)"
    ),
    prediction: Path | None = typer.Option(
        None, "--prediction", help="prediction.json written by notebooks/tune_detector.ipynb"
    ),
    quick: bool = typer.Option(False, "--quick", help="a few scenarios, one seed"),
    seeds: int = typer.Option(3, "--seeds", min=1, max=50, help="seeds per fault scenario"),
    scenario: str | None = typer.Option(
        None, "--scenario", help="only scenarios whose file stem matches this glob"
    ),
    out: Path = _out("tuning.json/.md"),
    workers: int = typer.Option(0, "--workers", min=0, max=64, help="processes (0: up to 2)"),
) -> None:
    """The fault benchmark with two alert condition files, side by side (before/after tuning)."""
    import json

    from alertdsl import spec as A
    from bench import tuning as bench_tuning

    _quiet()
    _check_pattern(scenario)
    pred = None
    try:
        for p in (after, before, prediction):
            if p is not None and (why := unreadable(p)):
                raise typer.BadParameter(f"{p}: {why}")
        if prediction is not None:
            try:
                pred = bench_tuning.check_prediction(json.loads(prediction.read_text()))
            except ValueError as exc:
                raise typer.BadParameter(f"{prediction}: {exc}") from None
        doc = bench_tuning.compare(
            after,
            before or A.DEFAULT_PATH,
            pred,
            quick,
            seeds,
            scenario,
            workers or min(2, os.cpu_count() or 1),
            _progress,
        )
    except (ValueError, A.AlertsError) as exc:
        raise typer.BadParameter(str(exc)) from None
    bench_tuning.write(doc, out)
    typer.echo("")
    typer.echo((out / "tuning.md").read_text())


@app.command("e2e")
def e2e(
    quick: bool = typer.Option(False, "--quick", help="only the GPU off the bus (CI-sized)"),
    out: Path = _out("e2e.json/.md"),
) -> None:
    """Faults through the real stack (simulator in real time, Prometheus, Alertmanager, the
    receiver, Slurm), timed on the wall clock. Starts the stack and Goodput's services."""
    from rich.console import Console

    from bench import e2e as bench_e2e
    from goodput import demo

    faults = demo.FAULTS[:1] if quick else demo.FAULTS
    report = bench_e2e.run(Console(width=120).print, faults=faults, out=out)
    typer.echo((out / "e2e.md").read_text())
    if report["summary"]["handled"] < len(faults):
        raise typer.Exit(1)


@app.command("scale")
def scale(
    sizes: str = typer.Option(
        "1000,10000,100000", "--sizes", help="comma-separated GPU counts (1,000..200,000)"
    ),
    shards: int = typer.Option(
        10, "--shards", min=1, max=64, help="shards above 10,000 GPUs (--live: replicas)"
    ),
    cycles: int = typer.Option(
        24, "--cycles", min=2, max=50, help="timed cycles per service (after 72 warm ones)"
    ),
    out: Path = _out("scale.json/.md"),
    live: bool = typer.Option(
        False,
        "--live",
        help="instead: the simulator, a real Prometheus and detector replicas (--sizes are "
        "GPUs, 8 per node; run under the stack lock)",
    ),
) -> None:
    """The detector service's whole cycle (query, decode, score, render /metrics) at 1k-100k
    GPUs from Prometheus answers in dcgm-exporter's shape, beside a bare orjson parse and a
    bare numpy pass of the same data; 100k GPUs as N shards. `--live`: the same service as
    processes against the simulator scraped by a real Prometheus, 1 replica and N shards."""
    from bench import scale as bench_scale
    from bench import scale_live

    try:
        counts = [int(x) for x in sizes.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter("--sizes is a comma-separated list of GPU counts") from None
    if not counts or not all(1000 <= n <= 200_000 for n in counts):
        raise typer.BadParameter("--sizes: each between 1,000 and 200,000 GPUs")
    if live:
        nodes = ",".join(str(n // 8) for n in counts)
        scale_live.main(["--nodes", nodes, "--shards", str(shards), "--out", str(out), "--keep"])
    else:
        bench_scale.run(counts, shards, cycles, out)
    typer.echo((out / "scale.md").read_text())


@app.command("webhook")
def webhook(
    stores: str = typer.Option("sqlite,postgresql", "--stores", help="sqlite and/or postgresql"),
    threads: int = typer.Option(16, "--threads", min=1, max=128, help="client threads"),
    seconds: float = typer.Option(15.0, "--seconds", min=1.0, max=600.0, help="per run"),
    rate: float = typer.Option(500.0, "--rate", min=1.0, max=100_000.0, help="open-loop alerts/s"),
    repeats: int = typer.Option(3, "--repeats", min=1, max=20, help="open-loop runs per store"),
    label: str = typer.Option("", "--label", help="a note kept with the results"),
    out: Path = _out("webhook.json/.md"),
) -> None:
    """Alertmanager webhook payloads posted over HTTP to the production receiver process
    (SQLite and PostgreSQL): alerts/s and p50/p99 latency, closed loop and at --rate."""
    from bench import webhook as bench_webhook

    chosen = [s.strip() for s in stores.split(",") if s.strip()]
    if not chosen or any(s not in ("sqlite", "postgresql") for s in chosen):
        raise typer.BadParameter("--stores: a comma list of sqlite, postgresql")
    try:
        bench_webhook.run(chosen, threads, seconds, rate, out, label[:200], repeats)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    typer.echo((out / "webhook.md").read_text())

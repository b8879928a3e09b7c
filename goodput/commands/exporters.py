"""`goodput exporter slurm|logs|nvml`: run one of the exporters in the foreground."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from pathlib import Path

import typer

app = typer.Typer(help="Exporters for real sources: Slurm, job/kernel logs, NVML GPUs.")


def _stop_event() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


@app.callback()
def _setup(verbose: bool = typer.Option(False, "--verbose", "-v")) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@app.command("logs")
def logs(
    log_dir: Path = typer.Option(None, help="default: $GOODPUT_LOG_DIR"),
    port: int = typer.Option(19411),
    host: str = typer.Option("127.0.0.1"),
    interval: float = typer.Option(0.5, help="seconds between polls of the files"),
    from_end: bool = typer.Option(
        False, help="skip what the files already hold (when there is no state file to resume)"
    ),
    state_file: Path = typer.Option(
        None,
        help="read positions and counters kept across restarts (default: "
        "$GOODPUT_LOG_STATE_FILE, else $GOODPUT_STATE_DIR/logmetrics/state.json)",
    ),
    loki_url: str = typer.Option("", help="also ship the job and kernel logs to this Loki"),
    loki_state_dir: Path = typer.Option(
        None, help="Loki shipper's read positions and spool (default: $GOODPUT_STATE_DIR/loki)"
    ),
    log_timezone: str = typer.Option(
        "",
        envvar="GOODPUT_LOG_TIMEZONE",
        help="IANA zone (e.g. America/New_York) of log stamps without one, for the Loki "
        "shipper; default: this host's local zone",
    ),
) -> None:
    """Follow job output and kernel logs; expose progress and error-pattern metrics."""
    from catalogue import logtime
    from exporters.logmetrics.exporter import default_log_dir, default_state_file, serve

    try:
        zone = logtime.named_zone(log_timezone)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--log-timezone") from None
    shipper = None
    if loki_url:
        from exporters.loki import LokiShipper, host_boot_time

        boot = host_boot_time()  # this host's kernel log (if it is one of them) gets its boot time
        node = socket.gethostname().split(".")[0]
        state = (
            loki_state_dir
            or Path(os.environ.get("GOODPUT_STATE_DIR", "~/.local/state/goodput")).expanduser()
            / "loki"
        )
        shipper = LokiShipper(
            loki_url, log_dir or default_log_dir(), state,
            boot_times={node: boot} if boot is not None else None, log_zone=zone,
        ).start()  # fmt: skip
    try:
        serve(
            log_dir, port, host, interval, from_end, _stop_event(),
            extra_collectors=(shipper,) if shipper else (),
            state_file=state_file or default_state_file(),
        )  # fmt: skip
    finally:
        if shipper is not None:
            shipper.close()


@app.command("slurm")
def slurm(
    port: int = typer.Option(19410),
    host: str = typer.Option("127.0.0.1"),
    interval: float = typer.Option(5.0, help="seconds between Slurm refreshes"),
    timeout: float = typer.Option(10.0, help="timeout of each Slurm command"),
    sacct_window: int = typer.Option(3600, help="seconds of ended jobs to ask sacct for"),
    since: float | None = typer.Option(
        None, help="unix s: ask sacct for no job that ended before this", min=0
    ),
) -> None:
    """Expose Slurm job and node state (squeue/sinfo --json, sacct)."""
    from exporters.slurm_exporter import serve

    serve(port, host, interval, timeout, sacct_window, _stop_event(), since)


@app.command("nvml")
def nvml(
    port: int = typer.Option(19412),
    host: str = typer.Option("127.0.0.1"),
    hpc_job_mapping_dir: Path = typer.Option(
        None, help="a file per GPU index holding the job id (dcgm-exporter's format)"
    ),
) -> None:
    """Expose real GPUs under dcgm-exporter's names through NVML (exit 2 without a GPU)."""
    from exporters.nvml_exporter import NvmlUnavailable, serve

    try:
        serve(port, host, hpc_job_mapping_dir, _stop_event())
    except NvmlUnavailable as exc:
        typer.echo(f"goodput exporter nvml: {exc}", err=True)
        raise typer.Exit(2) from None

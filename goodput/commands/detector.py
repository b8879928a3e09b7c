"""`goodput detector serve`: the scoring service."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import typer

app = typer.Typer(
    help="The anomaly detector: per-job baselines, peer comparison, scores.", no_args_is_help=True
)


@app.command("serve")
def serve(
    interval: float = typer.Option(5.0, help="Seconds between cycles."),
    port: int = typer.Option(19420, help="Port for /metrics (binds --host)."),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    prometheus_url: str = typer.Option(
        None, help="Prometheus base URL (default $GOODPUT_PROMETHEUS_URL or :19090)."
    ),
    state_dir: Path = typer.Option(
        None, help="Baselines directory (default $GOODPUT_STACK_DIR/detector/baselines)."
    ),
    host_map: Path = typer.Option(None, help="JSON file {host label: Slurm node name}."),
    shard: str = typer.Option(
        None,
        help="K/N: score only the jobs whose goodput_shard label is K (Prometheus' hashmod "
        "of the job id, modulus N); one replica per K.",
    ),
) -> None:
    """Query Prometheus every INTERVAL, score every running job, expose goodput_* scores."""
    from detector.baselines import BaselineStore
    from detector.ingest import Shard
    from detector.service import Service, ServiceConfig

    if interval <= 0:
        raise typer.BadParameter("--interval must be positive")
    try:
        owned = Shard.parse(shard) if shard is not None else None
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    mapping = None
    if host_map is not None:
        mapping = json.loads(host_map.read_text())
        if not isinstance(mapping, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()
        ):
            raise typer.BadParameter("--host-map must be a JSON object of strings")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    url = prometheus_url or os.environ.get("GOODPUT_PROMETHEUS_URL", "http://127.0.0.1:19090")
    cfg = ServiceConfig(
        prometheus_url=url,
        host=host,
        port=port,
        interval_s=interval,
        host_map=mapping,
        shard=owned,
    )
    try:
        service = Service(cfg, store=BaselineStore(state_dir, background=True))
    except ValueError as exc:  # the Prometheus URL
        raise typer.BadParameter(str(exc)) from None
    service.serve()

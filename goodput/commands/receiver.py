"""`goodput receiver serve`: the recovery receiver (webhook, incidents API, /metrics)."""

from __future__ import annotations

import typer

app = typer.Typer(help="The recovery receiver (Alertmanager webhook).", no_args_is_help=True)


@app.command("serve")
def serve(
    host: str | None = typer.Option(None, help="bind address (default 127.0.0.1)"),
    port: int | None = typer.Option(None, help="port (default 19430)"),
    db_url: str | None = typer.Option(None, "--db-url", help="SQLAlchemy URL of the store"),
) -> None:
    """Serve until interrupted; settings from GOODPUT_RECEIVER_* variables."""
    import uvicorn

    from recovery.app import create_app
    from recovery.settings import Settings

    overrides: dict[str, object] = {}
    if host:
        overrides["host"] = host
    if port:
        overrides["port"] = port
    if db_url:
        overrides["db_url"] = db_url
    settings = Settings.from_env(None, **overrides)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="info",
        access_log=False,
    )

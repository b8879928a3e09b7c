"""`goodput receiver serve`: the recovery receiver (webhook, incidents API, /metrics);
`goodput receiver db upgrade|current`: its database schema."""

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


db = typer.Typer(help="The receiver's database schema (Alembic migrations).", no_args_is_help=True)
app.add_typer(db, name="db")
DB_URL = typer.Option(None, "--db-url", help="SQLAlchemy URL (default: $GOODPUT_RECEIVER_DB_URL)")


def _url(db_url: str | None) -> str:
    from recovery.settings import Settings

    return db_url or Settings.from_env().db_url


@db.command("upgrade")
def db_upgrade(db_url: str | None = DB_URL) -> None:
    """Migrate the database to the newest revision (the receiver also does this at start)."""
    from recovery import schema
    from recovery.store import make_engine

    typer.echo(f"at {schema.current(make_engine(_url(db_url)))}")


@db.command("current")
def db_current(db_url: str | None = DB_URL) -> None:
    """The database's revision and the newest; exit 1 when it is behind."""
    from recovery import schema
    from recovery.store import make_engine

    have, head = schema.current(make_engine(_url(db_url), create=False)), schema.head()
    typer.echo(f"{have or 'none (not migrated)'} (head {head})")
    raise typer.Exit(0 if have == head else 1)

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

    from recovery.action_config import config
    from recovery.app import create_app
    from recovery.settings import Settings

    overrides: dict[str, object] = {}
    if host:
        overrides["host"] = host
    if port:
        overrides["port"] = port
    if db_url:
        overrides["db_url"] = db_url
    try:  # a wrong setting, mode, policy file or scheduler stops it here, not its loops later
        settings = Settings.from_env(None, **overrides)
        config(settings)
    except ValueError as exc:  # PolicyError included
        typer.echo(f"goodput receiver: {exc}", err=True)
        raise typer.Exit(2) from None
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="info",
        access_log=False,
    )


db = typer.Typer(help="The receiver's database schema (Alembic migrations).", no_args_is_help=True)
app.add_typer(db, name="db")
DB_URL = typer.Option(
    None, "--db-url", "--db", help="SQLAlchemy URL (default: $GOODPUT_RECEIVER_DB_URL)"
)


def _revision(db_url: str | None, create: bool) -> str | None:
    """The revision of the database named (migrated first when `create`); a bad URL, a
    SQLite file that is not there (unless `create`) or a store that does not answer is one
    line on stderr and exit 2."""
    from pathlib import Path

    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    from recovery import schema
    from recovery.settings import Settings
    from recovery.store import make_engine, normalize_url

    url = db_url or Settings.from_env().db_url
    try:
        parsed = make_url(normalize_url(url))
    except ArgumentError:
        typer.echo(
            f"error: {url!r} is not a database URL (sqlite:///PATH, postgresql://...)", err=True
        )
        raise typer.Exit(2) from None
    where = parsed.render_as_string(hide_password=True)
    if parsed.get_backend_name() == "sqlite" and not create:
        if not Path(parsed.database or "").is_file():
            typer.echo(f"error: no database at {parsed.database or '(none)'}", err=True)
            raise typer.Exit(2)
    try:
        return schema.current(make_engine(url, create=create))
    except SQLAlchemyError as exc:
        typer.echo(f"error: cannot open {where}: {str(exc).splitlines()[0]}", err=True)
        raise typer.Exit(2) from None


@db.command("upgrade")
def db_upgrade(db_url: str | None = DB_URL) -> None:
    """Migrate the database to the newest revision (the receiver also does this at start)."""
    typer.echo(f"at {_revision(db_url, create=True)}")


@db.command("current")
def db_current(db_url: str | None = DB_URL) -> None:
    """The database's revision and the newest; exit 1 when it is behind."""
    from recovery import schema

    have, head = _revision(db_url, create=False), schema.head()
    typer.echo(f"{have or 'none (not migrated)'} (head {head})")
    raise typer.Exit(0 if have == head else 1)

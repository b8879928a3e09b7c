"""The receiver's database as the CLI opens it: the URL given (`--db`) or the receiver's own
(`$GOODPUT_RECEIVER_DB_URL`, else its default). It must already exist: a mistyped path or URL
is an error, not an empty database created and answered from (a `pause` written there would
not pause the receiver)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from recovery.settings import Settings

DB = typer.Option(
    None,
    "--db",
    help="the receiver's database URL (default: $GOODPUT_RECEIVER_DB_URL, else "
    "sqlite:///$GOODPUT_STACK_DIR/receiver/goodput.db)",
)


def _fail(msg: str) -> typer.Exit:
    typer.echo(f"error: {msg}", err=True)
    return typer.Exit(2)


def open_db(db: str | None) -> tuple[Engine, Settings]:
    """The engine of an existing receiver database (migrated to this version) and the
    settings it was named by; a clear error and exit 2 when there is none."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    from recovery.settings import Settings
    from recovery.store import make_engine, normalize_url

    settings = Settings.from_env()
    url = db or settings.db_url
    try:
        parsed = make_url(normalize_url(url))
    except ArgumentError:
        raise _fail(f"{url!r} is not a database URL (sqlite:///PATH or postgresql://...)") from None
    if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").is_file():
        raise _fail(
            f"no receiver database at {parsed.database or '(none)'}: give the receiver's with "
            "--db or $GOODPUT_RECEIVER_DB_URL"
        )
    try:
        return make_engine(url), settings
    except SQLAlchemyError as exc:
        where = parsed.render_as_string(hide_password=True)
        raise _fail(f"cannot open {where}: {str(exc).splitlines()[0]}") from None

"""The receiver's database as the CLI opens it: the URL given (`--db`) or the receiver's own
(`$GOODPUT_RECEIVER_DB_URL`, else its default). It must be one: an existing database a receiver
migrated to this version's schema. A mistyped path or URL, an empty or foreign database, or one
at another schema is an error, never created, migrated or answered from (a `pause` written
there would not pause the receiver)."""

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
    """The engine of an existing receiver database at this version's schema and the settings
    it was named by; a clear error and exit 2 otherwise."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    from recovery import schema
    from recovery.settings import Settings
    from recovery.store import make_engine, normalize_url

    settings = Settings.from_env()
    url = db or settings.db_url
    try:
        parsed = make_url(normalize_url(url))
    except ArgumentError:
        raise _fail(f"{url!r} is not a database URL (sqlite:///PATH or postgresql://...)") from None
    where = parsed.render_as_string(hide_password=True)
    if parsed.get_backend_name() == "sqlite":
        path = Path(parsed.database or "")
        if not path.is_file():
            raise _fail(
                f"no receiver database at {parsed.database or '(none)'}: give the receiver's "
                "with --db or $GOODPUT_RECEIVER_DB_URL"
            )
        with path.open("rb") as f:
            if f.read(16) != b"SQLite format 3\x00":  # opening it would write one there
                raise _fail(f"{where} holds no receiver database (not an SQLite file)")
    try:
        engine = make_engine(url, create=False)
        have, head = schema.current(engine), schema.head()
    except SQLAlchemyError as exc:
        raise _fail(f"cannot open {where}: {str(exc).splitlines()[0]}") from None
    if have is None:  # an empty file, another program's database, the wrong PostgreSQL one
        raise _fail(f"{where} holds no receiver database (never migrated by a receiver)")
    if have != head:
        raise _fail(
            f"{where} is at schema {have}, this goodput at {head}: run the receiver of this "
            "version, or `goodput receiver db upgrade`"
        )
    return engine, settings

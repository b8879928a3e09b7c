"""Strict checks for values that cross the wire (docs/contracts.md "Names").

Every label value that the receiver uses — in a query, a path, a Slurm argv — passes one of
these first. The functions return the value or raise `ValueError` with a clear message.
Every string the receiver's API takes must be Unicode scalar values (`scalar_values`: JSON's
`"\\ud800"` escapes decode to lone surrogates that no database or response can encode); a value
for a text column has no NUL (`column`); ids in
paths and queries must fit the database's integer (`DB_INT_MAX`, `db_int`). Stored data read back
goes through `scrub`, so a bad row stored before these checks never breaks a page.
"""

from __future__ import annotations

import json
import re
import unicodedata
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator

from catalogue import names

JOB_ID = names.JOB_ID
NODE = names.NODE
GPU = re.compile(r"[0-9]{1,3}")
LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
FINGERPRINT = re.compile(r"[0-9a-fA-F]{1,64}")
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})"
)

MAX_LABEL_VALUE = 1024
MAX_JOB_ID = 32
DB_INT_MAX = 2**31 - 1  # `Integer` columns are 32-bit on PostgreSQL (64 on SQLite)
MIN_YEAR, MAX_YEAR = 1970, 2200  # timestamps outside are refused (Go's zero time aside)
ZERO_TIME = re.compile(r"0001-01-01T00:00:00(\.0{1,9})?Z")  # Go's zero time: "unset"
_SURROGATE = re.compile("[\ud800-\udfff]")
_DIGITS = re.compile(r"[0-9]{1,10}")
MAX_DEPTH = 32


def text(value: object, kind: str = "value") -> str:
    """A string of Unicode scalar values (no lone surrogate)."""
    if not isinstance(value, str):
        raise ValueError(f"{kind} must be a string")
    m = _SURROGATE.search(value)
    if m:
        raise ValueError(f"{kind} is not valid Unicode: lone surrogate at character {m.start()}")
    return value


def column(value: str) -> str:
    """A value for a text column: NUL, which PostgreSQL's text cannot hold (a 500 at the
    insert), becomes U+FFFD; the JSON kept beside it has the value as sent."""
    return value.replace("\x00", "\ufffd")


def scalar_values(doc: Any, where: str = "body", depth: int = 0) -> Any:
    """`doc` (parsed JSON) when every key and string in it is Unicode scalar values."""
    if depth > MAX_DEPTH:
        raise ValueError(f"{where}: nested deeper than {MAX_DEPTH} levels")
    if isinstance(doc, str):
        text(doc, where)
    elif isinstance(doc, dict):
        for k, v in doc.items():
            text(k, f"{where}: a key")
            scalar_values(v, f"{where}.{k[:40]}", depth + 1)
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            scalar_values(v, f"{where}.{i}", depth + 1)
    return doc


def json_document(raw: bytes) -> Any:
    """A request body parsed as strict JSON: UTF-8, no NaN/Infinity, scalar values only.

    Raises `ValueError` with a message fit for the client.
    """
    try:
        doc = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise ValueError(f"body is not UTF-8: {exc.reason} at byte {exc.start}") from None
    except RecursionError:
        raise ValueError("body is nested too deeply") from None
    except ValueError as exc:
        raise ValueError(f"body is not valid JSON: {str(exc)[:200]}") from None
    return scalar_values(doc)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def scrub(doc: Any) -> Any:
    """Stored data made safe to show: lone surrogates become U+FFFD (read side of `text`)."""
    if isinstance(doc, str):
        return _SURROGATE.sub("\ufffd", doc) if _SURROGATE.search(doc) else doc
    if isinstance(doc, dict):
        return {scrub(k): scrub(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [scrub(v) for v in doc]
    return doc


def db_int(value: str) -> int | None:
    """An id typed into a path or form: ASCII digits within the database's integer, or None."""
    if not _DIGITS.fullmatch(value):
        return None
    number = int(value)
    return number if number <= DB_INT_MAX else None


Text = Annotated[str, AfterValidator(text)]
_NAME_PUNCT = set(" ._@-+'()")
_HIDDEN = ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")  # controls, format (RTL overrides), breaks


def _hidden(c: str) -> bool:
    return unicodedata.category(c) in _HIDDEN


def person(value: object) -> str:
    """A person's (or a bot's) name for the audit trail (who approved, paused, resumed):
    1..64 letters, digits, spaces or . _ @ - + ' ( ), trimmed; no control, format or
    direction character (a newline or a right-to-left override would make the trail lie)."""
    name = text(value, "name").strip()
    ok = all(c.isalnum() or c in _NAME_PUNCT for c in name) and not any(map(_hidden, name))
    if not 1 <= len(name) <= 64 or not ok:
        raise ValueError("name: 1 to 64 letters, digits, spaces or . _ @ - + ' ( )")
    return name


def note(value: object) -> str:
    """Free text a person wrote (a comment, a reason): no control, format or direction
    character but tab, newline and carriage return (a NUL no database stores)."""
    s = text(value, "comment")
    bad = next((i for i, c in enumerate(s) if c not in "\t\n\r" and _hidden(c)), None)
    if bad is not None:
        raise ValueError(f"comment: control or format character at position {bad}")
    return s


def reason(value: object, limit: int = 500) -> str:
    """A form's one-line reason: whitespace runs as one space, at most `limit` characters,
    then `note`'s rule."""
    return note(" ".join(text(value, "reason").split())[:limit])


Person = Annotated[str, AfterValidator(person)]
Note = Annotated[str, AfterValidator(note)]


def _check(pattern: re.Pattern[str], kind: str, value: object, limit: int = 64) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{kind} must be a string")
    if len(value) > limit or not pattern.fullmatch(value):
        shown = value[:40] + ("…" if len(value) > 40 else "")
        raise ValueError(f"{kind} {shown!r} does not match {pattern.pattern}")
    return value


def job_id(value: object) -> str:
    return _check(JOB_ID, "job_id", value, MAX_JOB_ID)


def node(value: object) -> str:
    # The node pattern excludes '.' and '-' as a first character, so '..' cannot appear alone.
    return _check(NODE, "node", value, 64)


def gpu(value: object) -> str:
    return _check(GPU, "gpu", value, 3)


def fingerprint(value: object) -> str:
    return _check(FINGERPRINT, "fingerprint", value, 64)


def label_name(value: object) -> str:
    return _check(LABEL_NAME, "label name", value, 128)


def label_value(name: str, value: object) -> str:
    """A generic label value: a bounded string; job_id / node / gpu get their strict pattern."""
    if name in STRICT:
        return STRICT[name](value)
    text(value, f"label {name}")
    assert isinstance(value, str)  # noqa: S101 - for the type checker
    if len(value) > MAX_LABEL_VALUE:
        raise ValueError(f"label {name} is longer than {MAX_LABEL_VALUE} characters")
    return value


STRICT = {"job_id": job_id, "node": node, "gpu": gpu}


def timestamp(value: object, unset_ok: bool = True) -> float:
    """RFC 3339 (Alertmanager's format, nanoseconds allowed) → unix seconds.

    Years must lie in MIN_YEAR..MAX_YEAR. Go's zero time (`0001-01-01T00:00:00Z`, Alertmanager's
    `endsAt` while firing) means "unset" and returns 0.0 when `unset_ok`.
    """
    if not isinstance(value, str) or len(value) > 40:
        raise ValueError("timestamp must be an RFC 3339 string")
    if ZERO_TIME.fullmatch(value):
        if unset_ok:
            return 0.0
        raise ValueError("timestamp must be set (not Go's zero time)")
    m = _RFC3339.fullmatch(value)
    if not m:
        raise ValueError(f"timestamp {value[:40]!r} is not RFC 3339")
    y, mo, d, h, mi, s, frac, tz = m.groups()
    if not MIN_YEAR <= int(y) <= MAX_YEAR:
        raise ValueError(f"timestamp {value!r}: year outside {MIN_YEAR}..{MAX_YEAR}")
    try:
        tzs = "+00:00" if tz in ("Z", "z") else tz
        dt = datetime.fromisoformat(f"{y}-{mo}-{d}T{h}:{mi}:{s}{tzs}")
    except ValueError as exc:
        raise ValueError(f"timestamp {value!r} is not a valid date: {exc}") from None
    return dt.astimezone(UTC).timestamp() + (float(frac) if frac else 0.0)

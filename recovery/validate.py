"""Strict checks for values that cross the wire (docs/contracts.md "Names").

Every label value that the receiver uses — in a query, a path, a Slurm argv — passes one of
these first. The functions return the value or raise `ValueError` with a clear message.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

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
    if not isinstance(value, str):
        raise ValueError(f"label {name} must be a string")
    if len(value) > MAX_LABEL_VALUE:
        raise ValueError(f"label {name} is longer than {MAX_LABEL_VALUE} characters")
    return value


STRICT = {"job_id": job_id, "node": node, "gpu": gpu}


def timestamp(value: object) -> float:
    """RFC 3339 (Alertmanager's format, nanoseconds allowed) → unix seconds.

    Go's zero time (`0001-01-01T00:00:00Z`) means "unset" and returns 0.0.
    """
    if not isinstance(value, str) or len(value) > 40:
        raise ValueError("timestamp must be an RFC 3339 string")
    m = _RFC3339.fullmatch(value)
    if not m:
        raise ValueError(f"timestamp {value[:40]!r} is not RFC 3339")
    y, mo, d, h, mi, s, frac, tz = m.groups()
    if y == "0001":
        return 0.0
    try:
        tzs = "+00:00" if tz in ("Z", "z") else tz
        dt = datetime.fromisoformat(f"{y}-{mo}-{d}T{h}:{mi}:{s}{tzs}")
    except ValueError as exc:
        raise ValueError(f"timestamp {value!r} is not a valid date: {exc}") from None
    return dt.astimezone(UTC).timestamp() + (float(frac) if frac else 0.0)

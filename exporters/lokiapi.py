"""What Loki's answers to a push mean to the shipper (the client is `clients/loki.py`).

`refused(body, entries)` reads a 400 the way Loki writes it and says which entries it
refused and why; Loki stores the rest of the request (the distributor drops only the invalid
entries and answers with the last error; the ingester pushes every other stream and answers
with the last stream's error), so the shipper sends the rest again once — Loki keeps one copy
of an entry with the same stream, time and line, so a resend stores nothing twice:

- `entry for stream '{..}' has timestamp too old: T, oldest acceptable timestamp is: X`:
  `too_old`, every entry before X (without X: every entry up to T);
- `entry with timestamp T ignored, reason: 'entry too far behind[, oldest acceptable timestamp
  is: X]' for stream: {..},` ... `total ignored: N out of M`: `too_far_behind`, in that stream
  the entries before X, else its N oldest (`'entry out of order'`: `out_of_order`, the same);
- `Max entry size 'S' bytes exceeded for stream '{..}' ...`: `line_too_long`, its lines over S;
- `entry for stream '{..}' has timestamp too new: T`: `too_new`, its entries from T on;
- anything else names no entry.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from email.utils import parsedate_to_datetime

from catalogue import logtime
from clients.loki import Entry, Labels

_STREAM = r"(\{(?:[^{}\"]|\"(?:[^\"\\]|\\.)*\")*\})"
_TOO_OLD = re.compile(
    rf"entry for stream '{_STREAM}' has timestamp too old: (\S+?)(?:,|$|\s)"
    r"(?: ?oldest acceptable timestamp is: (\S+?)(?:,|$|\s))?",
    re.M,
)
_TOO_NEW = re.compile(rf"entry for stream '{_STREAM}' has timestamp too new: (\S+)")
_IGNORED = re.compile(r"reason: '(entry too far behind|entry out of order)([^']*)'")
_OLDEST = re.compile(r"oldest acceptable timestamp is: (\S+?)'?(?:,|$|\s)")
_FOR_STREAM = re.compile(rf"for stream: {_STREAM}")
_TOTAL = re.compile(r"total ignored: (\d+) out of (\d+)")
_TOO_LONG = re.compile(rf"Max entry size '(\d+)' bytes exceeded for stream '{_STREAM}'")
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _stream(text: str) -> Labels:
    """Loki's label string `{a="1", b="2"}` as sorted pairs."""
    return tuple(sorted((k, _unquote(v)) for k, v in _PAIR.findall(text)))


def _unquote(value: str) -> str:
    """A Go-quoted label value; one JSON cannot read (Go's `\x07`, `\a`) is kept as quoted:
    it matches no entry, where an exception failed the batch at every try."""
    try:
        return str(json.loads(f'"{value}"'))
    except ValueError:
        return value


def _ns(text: str) -> int | None:
    s = logtime.parse(text.strip(), ref=time.time())
    return None if s is None or s.time is None else int(round(s.time * 1e9))


def refused(body: str, entries: Sequence[Entry]) -> dict[int, str]:
    """Index of each entry a 400 answer refused -> reason (see the module table)."""
    out: dict[int, str] = {}
    for m in _TOO_OLD.finditer(body):  # the limit is the tenant's: it holds for every stream
        cutoff = _ns(m.group(3)) if m.group(3) else None
        if cutoff is None and (at := _ns(m.group(2))) is not None:
            cutoff = at + 1  # an older Loki names only the entry: it and any older one
        if cutoff is not None:
            out.update({i: "too_old" for i, e in enumerate(entries) if e[1] < cutoff})
    for m in _TOO_NEW.finditer(body):
        at, key = _ns(m.group(2)), _stream(m.group(1))
        if at is not None:
            out.update({i: "too_new" for i, e in enumerate(entries) if e[0] == key and e[1] >= at})
    for m in _TOO_LONG.finditer(body):
        size, key = int(m.group(1)), _stream(m.group(2))
        out.update(
            {
                i: "line_too_long"
                for i, e in enumerate(entries)
                if e[0] == key and len(e[2].encode()) > size
            }
        )
    _behind(body, entries, out)
    return out


def _behind(body: str, entries: Sequence[Entry], out: dict[int, str]) -> None:
    """The ingester's answer: one line per ignored entry, then `total ignored: N out of M`."""
    reasons = _IGNORED.findall(body)
    if not reasons:
        return
    reason = "out_of_order" if reasons[-1][0].endswith("out of order") else "too_far_behind"
    key = _stream(m.group(1)) if (m := _FOR_STREAM.search(body)) else None
    mine = sorted((e[1], i) for i, e in enumerate(entries) if key is None or e[0] == key)
    oldest = _OLDEST.search(body)
    cutoff = _ns(oldest.group(1)) if oldest else None
    if cutoff is not None:
        out.update({i: reason for ts, i in mine if ts < cutoff})
    elif total := _TOTAL.search(body):
        out.update({i: reason for _ts, i in mine[: int(total.group(1))]})


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - now)
    except (TypeError, ValueError, IndexError):
        return None

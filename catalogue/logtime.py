"""The time a log line carries, in the forms kernels, journald and training jobs print.

Pure functions, shared by the Loki shipper and the receiver's log evidence. `parse(text, ref)`
reads the stamp at the start of a line (after a launcher's rank prefix: `[default0]:`,
`[rank3]:`, srun's `12: `, mpirun's `[1,0]<stdout>:`, NeMo's `[NeMo I `):

- `iso`: `2023-09-08T17:20:30.655028+0200 host kernel:` (journald short-iso[-precise]),
  `[2024-04-10 16:02:56,193] torch.distributed...` (Python logging),
  `2023-12-22T12:26:24,559615-08:00` (`dmesg --time-format iso`);
- `ctime`: `[Fri Aug 30 11:43:09 2024] NVRM: Xid ...` (`dmesg -T`);
- `monotonic`: `[ 1843.308145] NVRM: ...` (plain `dmesg`, journald short-monotonic), seconds
  since boot;
- `syslog`: `Feb 14 05:03:41 host kernel:` (journald short), `Mar 14 10:12:31.545053 host
  kernel:` (short-precise);
- `glog`: `[rank0]:[E1010 11:50:05.315197062 ProcessGroupNCCL.cpp:565]`,
  `W0227 17:39:41.936000 293814 ...` (PyTorch/c10, absl);
- `mmdd`: `INFO 02-22 08:52:08 __init__.py:190]` (vLLM, SGLang);
- `embedded`: an ISO time later in the first 200 characters (`CANCELLED AT 2024-05-01T12:00:00`).

A stamp without a zone (syslog, Python logging, glog and `dmesg -T` print local time) is in
`zone`, with the offset of the stamp's own date (DST); default UTC. The shipper and the
receiver pass the nodes' zone (`GOODPUT_LOG_TIMEZONE`): `named_zone(name)` for an IANA name,
`named_zone("")` for the host's local zone. A stamp with its own zone (`Z`, `+02:00`) keeps
it. A stamp without a year gets the year that puts it at most a day after `ref` (a December
line read in January).
A monotonic stamp becomes a time with the node's boot time when known (`boot_time`), else its
`time` is None and `BootClock.place` sets it from when the lines were read.

>>> parse("[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid=1", ref=0).time
1725018189.0
>>> s = parse("[ 1843.308145] NVRM: GPU 0000:b3:00.0", ref=0)
>>> s.form, s.monotonic, s.time
('monotonic', 1843.308145, None)
>>> message("[2026-11-29 19:01:37.728] > initialized distributed with backend nccl")
'> initialized distributed with backend nccl'
>>> message("  3: 2024-04-10T16:02:56Z exitcode  : -6 (pid: 2385923)")
'exitcode  : -6 (pid: 2385923)'
>>> message("[rank0]:[titan] 2026-05-18 16:04:46,338 - root - INFO - step: 14  loss:  3.24")
'step: 14  loss:  3.24'
>>> message("I0319 04:50:42.613272   364 learning.py:507] global step 162: loss = 0.2748")
'global step 162: loss = 0.2748'
"""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

MONTHS = {m: i for i, m in enumerate(calendar.month_abbr) if m}
_MON = "|".join(MONTHS)
_DAY = "Mon|Tue|Wed|Thu|Fri|Sat|Sun"
_FRAC = r"(?:[.,](\d{1,9}))?"
_HMS = r"(\d{2}):(\d{2}):(\d{2})"
_ZONE = r"(Z|[+-]\d{2}(?::?\d{2})?)?"

PREFIX = re.compile(
    r"\A(?:\[[A-Za-z_]*\d+\]:|\s{0,4}\d{1,6}: |\[\d+,\d+\]<std(?:out|err)>:|\[NeMo [A-Z] )"
)
_ISO = re.compile(rf"\[?(\d{{4}})-(\d{{2}})-(\d{{2}})[T ]{_HMS}{_FRAC}{_ZONE}")
_CTIME = re.compile(rf"\[(?:{_DAY}) ({_MON}) {{1,2}}(\d{{1,2}}) {_HMS} (\d{{4}})\]")
_MONO = re.compile(r"\[\s*(\d{1,10}\.\d{1,9})\]")
_SYSLOG = re.compile(rf"({_MON}) {{1,2}}(\d{{1,2}}) {_HMS}{_FRAC}(?![\d:])")
_GLOG = re.compile(rf"\[?[IWEF](\d{{3,4}}) {_HMS}{_FRAC}\b")
_MMDD = re.compile(rf"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d{{2}})-(\d{{2}}) {_HMS}\b")
DAY_S = 86400.0
EMBED_S = 3600.0


class HostZone(tzinfo):
    """The host's local zone as the C library has it (`TZ`, /etc/localtime), its offset
    looked up for each date (`time.mktime`), so a stamp on either side of a DST change gets
    its own."""

    def utcoffset(self, dt: datetime | None) -> timedelta:
        if dt is None:
            return timedelta(seconds=-time.timezone)
        fields = (dt.year, dt.month, dt.day, dt.hour, dt.minute, dt.second)
        try:
            return timedelta(seconds=calendar.timegm(fields) - time.mktime((*fields, 0, 0, -1)))
        except (OverflowError, ValueError):
            return timedelta(seconds=-time.timezone)

    def dst(self, dt: datetime | None) -> timedelta | None:
        return None

    def tzname(self, dt: datetime | None) -> str:
        return "host-local"

    def __repr__(self) -> str:
        return "HostZone()"


HOST_ZONE = HostZone()


def named_zone(name: str | None = "") -> tzinfo:
    """The zone a setting names: an IANA name (`America/New_York`, `UTC`), or empty for the
    host's local zone. An unknown name is a ValueError saying so."""
    name = (name or "").strip()
    if not name:
        return HOST_ZONE
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ValueError(
            f"unknown time zone {name!r}: want an IANA name such as 'UTC' or "
            "'America/New_York', or empty for the host's local zone"
        ) from exc


@dataclass(frozen=True)
class Stamp:
    time: float | None  # unix seconds (UTC); None: monotonic and no boot time known
    form: str  # iso | ctime | monotonic | syslog | glog | mmdd | embedded
    monotonic: float | None = None  # seconds since boot, for the monotonic form


def parse(
    text: str, ref: float, boot_time: float | None = None, zone: tzinfo | None = None
) -> Stamp | None:
    """The stamp `text` starts with (see the module table), or None. A stamp without a zone
    is in `zone` (None: UTC)."""
    head = text[:240]
    while m := PREFIX.match(head):  # a launcher may stack prefixes: `[default0]:[rank0]:`
        head = head[m.end() :]
    head = head.lstrip()
    if m := _ISO.match(head):
        return _iso(m, "iso", zone)
    if m := _CTIME.match(head):
        mon, d, h, mi, s, y = m.groups()
        t = _wall(int(y), MONTHS[mon], int(d), int(h), int(mi), int(s), None, zone)
        return None if t is None else Stamp(t, "ctime")
    if m := _MONO.match(head):
        mono = float(m.group(1))
        return Stamp(None if boot_time is None else boot_time + mono, "monotonic", mono)
    if m := _SYSLOG.match(head):
        mon, d, h, mi, s, frac = m.groups()
        return _yearless(ref, MONTHS[mon], d, h, mi, s, frac, "syslog", zone)
    if m := _GLOG.match(head):
        md, h, mi, s, frac = m.groups()  # month is not zero-padded by c10: `E321` is 03-21
        return _yearless(ref, int(md[:-2]), md[-2:], h, mi, s, frac, "glog", zone)
    if m := _MMDD.match(head):
        mo, d, h, mi, s = m.groups()
        return _yearless(ref, int(mo), d, h, mi, s, None, "mmdd", zone)
    if m := _ISO.search(text[:200]):
        return _iso(m, "embedded", zone)
    return None


# A logger's header before the message: an optional [tag] (torchtitan's `[titan]`), a stamp
# (iso, ctime, monotonic; glog/absl's with its thread id and `file:line]`), then up to three
# fields of Python logging's or fairseq's (` - root - INFO - `, ` | INFO | train_inner | `) or
# Hugging Face's ` >> `.
_LEAD = re.compile(
    rf"(?:\[[A-Za-z][\w.-]*\] )?"
    rf"(?:{_ISO.pattern}\]?|{_CTIME.pattern}|{_MONO.pattern}|{_GLOG.pattern}\s+\d+ [^\]\s]+\])"
    r"(?:(?:\s*[-|]\s*[\w.:]+){0,3}\s*(?:[-|]|>>)\s|[:,]?\s*)"
)


def message(text: str) -> str:
    """`text` after a launcher's rank prefixes and a logger's leading header (a stamp, and
    the level and name fields after it): `[2026-11-29 19:01:37.728] > initialized ...` ->
    `> initialized ...`. A pattern anchored at the message's start looks here when the line
    does not match as written."""
    head = text
    for _ in range(2):  # a stamp may come before or after the launcher's prefix
        while m := PREFIX.match(head):
            head = head[m.end() :]
        if m := _LEAD.match(head.lstrip()):
            head = head.lstrip()[m.end() :]
    return head


def line_time(
    text: str, ref: float, boot_time: float | None = None, zone: tzinfo | None = None
) -> float | None:
    """`parse(...).time`, or None."""
    s = parse(text, ref, boot_time, zone)
    return None if s is None else s.time


def trusted(stamp: Stamp | None, previous: float | None) -> float | None:
    """The stamp's time, except an `embedded` one an hour or more before the line before
    (a date in a checkpoint path, not when the line was written)."""
    if stamp is None or stamp.time is None:
        return None
    if stamp.form == "embedded" and previous is not None and stamp.time < previous - EMBED_S:
        return None
    return stamp.time


def _iso(m: re.Match[str], form: str, zone: tzinfo | None) -> Stamp | None:
    y, mo, d, h, mi, s, frac, own = m.groups()
    t = _wall(int(y), int(mo), int(d), int(h), int(mi), int(s), frac, None if own else zone)
    if t is None:
        return None
    if own and own != "Z":  # the stamp's own offset, whatever the node's zone
        digits = own[1:].replace(":", "")
        offset = int(digits[:2]) * 3600 + int(digits[2:4] or 0) * 60
        t -= offset if own[0] == "+" else -offset
    return Stamp(t, form)


def _yearless(
    ref: float,
    mo: int,
    d: str,
    h: str,
    mi: str,
    s: str,
    frac: str | None,
    form: str,
    zone: tzinfo | None,
) -> Stamp | None:
    year = time.gmtime(ref).tm_year
    t = _wall(year, mo, int(d), int(h), int(mi), int(s), frac, zone)
    if t is not None and t > ref + DAY_S:
        t = _wall(year - 1, mo, int(d), int(h), int(mi), int(s), frac, zone)
    return None if t is None else Stamp(t, form)


def _wall(
    y: int, mo: int, d: int, h: int, mi: int, s: int, frac: str | None, zone: tzinfo | None
) -> float | None:
    """Unix time of a wall-clock time in `zone` (None: UTC), its offset for that date."""
    if not (1 <= y <= 9999 and 1 <= mo <= 12 and 1 <= d <= calendar.monthrange(y, mo)[1]):
        return None
    if h > 23 or mi > 59 or s > 60:
        return None
    t = calendar.timegm((y, mo, d, h, mi, s)) + (float("0." + frac) if frac else 0.0)
    if zone is not None:
        # a leap second (:60) takes the offset of the second before it
        offset = datetime(y, mo, d, h, mi, min(s, 59), tzinfo=zone).utcoffset()
        t -= offset.total_seconds() if offset is not None else 0.0
    return t


@dataclass
class BootClock:
    """A node's boot time learned from when its monotonic lines were read.

    A line stamped `m` s after boot and read at wall time `a` was written at or before `a`, so
    boot <= a - m: the least such bound is the estimate, and no line is placed after it was
    read. A stamp lower than the one before it means the node rebooted: the older lines belong
    to an earlier boot, which ended before the later one began.
    """

    boot: float | None = None
    last: float = -1.0

    def place(self, monos: Sequence[float], arrival: float) -> list[float]:
        """Wall times for monotonic stamps read together at `arrival`, oldest first."""
        if not monos:
            return []
        cuts = [i for i in range(1, len(monos)) if monos[i] < monos[i - 1]]
        starts = [0, *cuts, len(monos)]
        known = self.boot if monos[0] >= self.last else None  # None: rebooted since
        out: list[float] = [0.0] * len(monos)
        bound = arrival
        for k in range(len(starts) - 2, -1, -1):
            lo, hi = starts[k], starts[k + 1]
            boot = bound - monos[hi - 1]
            if k == 0 and known is not None:
                boot = min(boot, known)
            if k == len(starts) - 2:
                self.boot = boot  # the boot the node is in now
            out[lo:hi] = [boot + m for m in monos[lo:hi]]
            bound = boot  # an earlier boot's lines were all written before this boot
        self.last = monos[-1]
        return out

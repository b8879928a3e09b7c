"""Slurm job ids and node names: the one definition of each, and a bounded hostlist expander.

`JOB_ID` and `NODE` are anchored with `\\A...\\Z`, so `.match`, `.search` and `.fullmatch` all
accept only the whole string (`^...$` with `.match` would also take "node1\\n"). Embed the raw
`JOB_ID_PATTERN` / `NODE_PATTERN` in larger regexes (file names, pydantic fields).

>>> expand_hostlist("node[1-3,5],gpu[08-09]")
['node1', 'node2', 'node3', 'node5', 'gpu08', 'gpu09']
>>> valid_job_id("123_4"), valid_node("-node1")
(True, False)
"""

from __future__ import annotations

import itertools
import math
import re
import time

JOB_ID_PATTERN = r"[0-9]+(?:_[0-9]+)?"  # `<job>` or `<array job>_<task>`, as in slurm-%A_%a.out
NODE_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"  # no leading '.'/'-': '..' cannot stand alone
JOB_ID = re.compile(rf"\A(?:{JOB_ID_PATTERN})\Z")
NODE = re.compile(rf"\A(?:{NODE_PATTERN})\Z")

MODEL_NAME_MAX = 128  # a GPU model label (dcgm's modelName, free text) is cut to this
MAX_HOSTS = 65536  # most names one hostlist may expand to
NO_NODES = frozenset({"", "(null)", "None", "None assigned"})  # Slurm's empty node lists
_GROUP = re.compile(r"(\[[^\[\]]*\])")
_RANGE = re.compile(r"([0-9]{1,18})(?:-([0-9]{1,18}))?")


def valid_job_id(value: object) -> bool:
    return isinstance(value, str) and JOB_ID.match(value) is not None


def valid_node(value: object) -> bool:
    return isinstance(value, str) and NODE.match(value) is not None


def expand_hostlist(
    text: str | None, *, limit: int = MAX_HOSTS, skip_invalid: bool = False
) -> list[str]:
    """Expand a Slurm hostlist: `rack[1-2]-n[01-02],login` -> rack1-n01 rack1-n02 ... login.

    Zero padding follows the low bound's width; several bracket groups in one name expand in
    order (leftmost slowest). Raises `ValueError` on malformed text, on more than `limit` names
    (counted before anything is built), and on a name that is not a valid node name unless
    `skip_invalid` (then such names are left out). `None` and Slurm's `(null)`, `None`,
    `None assigned` mean no nodes.
    """
    if text is None or text.strip() in NO_NODES:
        return []
    items, total = [], 0
    for part in _split(text):
        literals, groups = _item(part)
        total += math.prod(sum(hi - lo + 1 for lo, hi, _w in g) for g in groups)
        if total > limit:
            raise ValueError(f"hostlist expands to more than {limit} names: {text[:80]!r}")
        items.append((literals, groups))
    names: list[str] = []
    for literals, groups in items:
        choices = [[f"{i:0{w}d}" for lo, hi, w in g for i in range(lo, hi + 1)] for g in groups]
        for picks in itertools.product(*choices):
            tail = zip(picks, literals[1:], strict=True)
            name = literals[0] + "".join(pick + lit for pick, lit in tail)
            if NODE.match(name):
                names.append(name)
            elif not skip_invalid:
                raise ValueError(f"hostlist {text[:80]!r}: {name[:80]!r} is not a node name")
    return names


def _split(text: str) -> list[str]:
    """Split on the commas outside brackets; brackets must pair and not nest."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "[]":
            opening = ch == "["
            if opening == bool(depth):  # '[' inside brackets, or ']' outside them
                raise ValueError(f"hostlist {text[:80]!r}: unbalanced brackets")
            depth = int(opening)
        elif ch == "," and not depth:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"hostlist {text[:80]!r}: unbalanced brackets")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _item(part: str) -> tuple[list[str], list[list[tuple[int, int, int]]]]:
    """`a[1-2]b[3]c` -> (literals ['a', 'b', 'c'], groups [[(1, 2, 1)], [(3, 3, 1)]])."""
    pieces = _GROUP.split(part)
    literals, groups = pieces[0::2], []
    for body in pieces[1::2]:
        ranges = []
        for r in body[1:-1].split(","):
            m = _RANGE.fullmatch(r.strip())
            if not m:
                raise ValueError(f"hostlist item {part[:80]!r}: bad range {r[:40]!r}")
            lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
            if hi < lo:
                raise ValueError(f"hostlist item {part[:80]!r}: range {r!r} runs backwards")
            ranges.append((lo, hi, len(m.group(1))))
        groups.append(ranges)
    return literals, groups


__all__ = [
    "JOB_ID",
    "JOB_ID_PATTERN",
    "MAX_HOSTS",
    "NODE",
    "NODE_PATTERN",
    "NO_NODES",
    "expand_hostlist",
    "valid_job_id",
    "valid_node",
]


SLURM_NO_VAL = 4294967294  # Slurm's "no value" of a 32-bit field (a job that is no array task)


def slurm_int(raw: object) -> int | None:
    """An integer field of Slurm's JSON: plain (22.05) or `{"set": true, "number": N}`
    (23.02 and later); None when unset, infinite or not an integer."""
    if isinstance(raw, dict):
        if raw.get("set") is False or raw.get("infinite"):
            return None
        raw = raw.get("number")
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else None


def slurm_exit(raw: object) -> tuple[int | None, int]:
    """A job's end in any of Slurm's shapes -> (return code, signal; 0 when none): squeue's
    wait status (22.05: `93 << 8`, or `15` for SIGTERM), the same as `{"set", "number"}`
    (23.02), `{"return_code": ..., "signal": {"id": ...}}` (23.11 and later), or sacct's and
    scontrol's `93:0`. (None, 0) when unreadable."""
    if isinstance(raw, dict) and ("return_code" in raw or "signal" in raw):
        signal = raw.get("signal")
        sig = slurm_int(signal.get("id")) if isinstance(signal, dict) else None
        return slurm_int(raw.get("return_code")), sig or 0
    if isinstance(raw, str):
        code, _, sig_text = raw.strip().partition(":")
        if not code.isdigit() or not (sig_text or "0").isdigit():
            return None, 0
        return int(code), int(sig_text or 0)
    status = slurm_int(raw)
    if status is None or status < 0:
        return None, 0
    return (status >> 8) & 0xFF, status & 0x7F


def slurm_states(raw: object) -> list[str]:
    """A state field of Slurm's JSON, lower case: `"RUNNING"` (22.05, 23.02) or
    `["RUNNING", "COMPLETING"]` (23.11 and later: the base state, then its flags)."""
    items = raw if isinstance(raw, list) else [raw] if raw else []
    return [str(s).lower() for s in items if s]


def slurm_time(value: object) -> float | None:
    """Slurm's `2026-11-29T20:41:12` (the controller's local time, like this host's) → unix
    seconds; `Unknown`, `None` or junk → None."""
    try:
        return time.mktime(time.strptime(str(value or ""), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None

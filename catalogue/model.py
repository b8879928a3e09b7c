"""The catalogue's types (outcomes, actions, XIDs, log-line patterns) and `Catalogue`, which
matches a log line against the patterns. `catalogue.loader` builds one from the YAML."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from catalogue import logtime

SOURCES = ("job", "kernel")
MAX_LINE_CHARS = 8192  # longer lines are matched on their first MAX_LINE_CHARS characters
MAX_INT = 2**53  # a typed int group at or past this is junk (a float holds it exactly below)
_ANCHORS = ("^", "\\A", "(?i)^")  # a regex that must match at the start of the message


@dataclass(frozen=True)
class Outcome:
    id: str
    category: str
    meaning: str
    action: str = "hold_for_person"  # the policy's default action (one of the vocabulary)


@dataclass(frozen=True)
class Action:
    id: str
    meaning: str
    destructive: bool = False  # changes a job or a node (a confidence floor applies)
    restarts: bool = False  # the job runs again
    drains: bool = False  # a node is drained


@dataclass(frozen=True)
class XidInfo:
    code: int
    name: str
    severity: str  # critical | warning | info
    nvidia_action: str
    job_action: str  # one of the action vocabulary
    outcome: str
    consequence: bool  # follows an earlier error (e.g. 43, 45): look for that one
    note: str = ""
    mnemonic: str = ""  # NVIDIA's name for the code
    cls: str = ""  # a key of xid.yaml's `classes` (`class` in xid.yaml)
    source: str = ""  # where the entry comes from (a text of xid.yaml's `sources`)
    weight: float = 0.0  # the detector's score for it (its class's detector_weight)
    alert: str = ""  # the alert whose XID lists hold it (its class's alert)


@dataclass(frozen=True)
class Pattern:
    id: str
    source: str  # job | kernel | any
    symptom: str
    role: str  # initiating | cascade | info
    regexes: tuple[re.Pattern[str], ...]
    fields: tuple[tuple[str, re.Pattern[str]], ...] = ()
    keywords: tuple[str, ...] = ()  # lower-cased
    exclusive: str = ""
    outcome: str = ""
    description: str = ""
    gate: re.Pattern[str] | None = None  # all regexes as one alternation, for a cheap first pass
    ignore_case: bool = False  # regexes run on the lower-cased line (write them in lower case)
    alert: bool = False  # GoodputJobLogFault fires on it (alerts.yaml's list is filled from it)
    action: str = ""  # an action hint: overrides the outcome's default when the policy honours it
    fallback: bool = False  # reported only when no other initiating/cascade pattern matched
    sources: tuple[str, ...] = ()  # where the example lines come from
    examples: tuple[str, ...] = ()  # real lines it matches (checked at load)


@dataclass(frozen=True)
class Match:
    """One pattern that matched one line; `groups` holds typed values (rank, xid, loss, ...)."""

    pattern: str
    symptom: str
    role: str
    source: str
    outcome: str
    groups: dict[str, Any] = field(default_factory=dict)
    action: str = ""  # the pattern's action hint, if it has one


class Catalogue:
    """The loaded catalogue. Build with `load(directory)`; most callers use the module functions."""

    def __init__(
        self,
        outcomes: dict[str, Outcome],
        categories: dict[str, str],
        actions: dict[str, Action],
        xids: dict[int, XidInfo],
        patterns: tuple[Pattern, ...],
        group_types: dict[str, type],
        rank_hints: tuple[re.Pattern[str], ...],
        xid_unlisted: XidInfo | None = None,
    ) -> None:
        self.outcomes = outcomes
        self.categories = categories
        self.actions = actions
        self.xids = xids
        self.patterns = patterns
        self.group_types = group_types
        self.rank_hints = rank_hints
        self.xid_unlisted = xid_unlisted  # what an XID the table does not list means
        self._by_source = {s: tuple(p for p in patterns if p.source in (s, "any")) for s in SOURCES}
        self._fallback = {p.id: p.fallback for p in patterns}
        # Each distinct keyword is looked for once per line (a C substring search: cheaper
        # than any regex); a pattern runs its regexes only when one of its keywords is present.
        self._keywords = tuple(
            (w, frozenset(p.id for p in patterns if w in p.keywords))
            for w in sorted({k for p in patterns for k in p.keywords})
        )

        # patterns anchored at the message's start: tried on a stamped line's message too
        self._anchored = frozenset(
            p.id for p in patterns if any(rx.pattern.startswith(_ANCHORS) for rx in p.regexes)
        )

    def xid_info(self, code: int) -> XidInfo | None:
        return self.xids.get(int(code))

    def match_line(self, line: str, source: str) -> list[Match]:
        """All patterns of `source` ("job" or "kernel") that match `line`, in catalogue order."""
        try:
            candidates = self._by_source[source]
        except KeyError:
            raise ValueError(f"source must be one of {SOURCES}, not {source!r}") from None
        if len(line) > MAX_LINE_CHARS:
            line = line[:MAX_LINE_CHARS]
        low = line.lower()
        hits: set[str] = set()
        for word, ids in self._keywords:
            if word in low:
                hits |= ids
        taken: set[str] = set()
        out: list[Match] = []
        body: tuple[str, str] | None = None  # (message, its lower case): `message` on first use
        for p in candidates:
            if p.exclusive and p.exclusive in taken:
                continue
            if p.keywords and p.id not in hits:
                continue
            m = _search(p, low if p.ignore_case else line)
            if m is None and p.id in self._anchored:  # its message, after a stamp or a prefix
                if body is None:
                    msg = logtime.message(line)
                    body = (msg, msg.lower())
                if body[0] != line:
                    m = _search(p, body[1] if p.ignore_case else body[0])
            if m is None:
                continue
            groups = self._typed(m.groupdict())
            for name, rx in p.fields:
                fm = rx.search(line)
                if fm:
                    value = next((g for g in fm.groups() if g is not None), None)
                    groups.update(self._typed({name: value}))
            if source == "job" and "rank" not in groups:
                for hint in self.rank_hints:
                    hm = hint.search(line)
                    if hm:
                        groups.update(self._typed({"rank": hm.group("rank")}))
                        break
            if p.exclusive:
                taken.add(p.exclusive)
            out.append(Match(p.id, p.symptom, p.role, source, p.outcome, groups, p.action))
        if any(self._fallback.get(m.pattern) for m in out):  # a generic shape steps aside
            specific = any(m.role != "info" and not self._fallback[m.pattern] for m in out)
            out = [m for m in out if not (specific and self._fallback[m.pattern])]
        return out

    def _typed(self, raw: dict[str, str | None]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in raw.items():
            if value is None:
                continue
            try:
                typed = self.group_types[name](value.strip())
            except ValueError:  # also an int of more than 4,300 digits
                continue
            if isinstance(typed, int) and abs(typed) >= MAX_INT:
                continue  # no rank, iteration or XID is that large: junk, and float() overflows
            out[name] = typed
        return out


def _search(p: Pattern, text: str) -> re.Match[str] | None:
    """The first of `p`'s regexes that matches `text` (its gate, all of them at once, first)."""
    if p.gate is not None and p.gate.search(text) is None:
        return None
    return next((m for rx in p.regexes if (m := rx.search(text))), None)

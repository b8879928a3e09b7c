"""Alertmanager's inhibition, for the benchmarks that post alerts to the receiver themselves.

`Inhibition` reads `inhibit_rules` from alertmanager/alertmanager.yml and says which of a set of
firing alerts Alertmanager would mute: a target alert is muted while a firing alert matches a
rule's source matchers and has the same value of each `equal` label (absent on both counts as
the same); an alert that matches both sides is not muted by a source that matches the targets
too (itself included). The same answers as a real Alertmanager on the same alerts:
tests/integration/test_alerting_alertmanager.py compares them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CONFIG = Path(__file__).resolve().parents[1] / "alertmanager" / "alertmanager.yml"

_MATCHER = re.compile(
    r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(?:"((?:[^"\\]|\\.)*)"|([^"\s]*))\s*$'
)


@dataclass(frozen=True)
class Matcher:
    """One Alertmanager matcher (`name="v"`, `!=`, `=~` or `!~` a fully anchored regex); an
    absent label has the value ""."""

    name: str
    op: str
    value: str

    @classmethod
    def parse(cls, text: str) -> Matcher:
        m = _MATCHER.match(text)
        if not m:
            raise ValueError(f"not an Alertmanager matcher: {text!r}")
        quoted, bare = m.group(3), m.group(4)
        value = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
        return cls(m.group(1), m.group(2), value)

    def matches(self, labels: Mapping[str, str]) -> bool:
        got = labels.get(self.name, "")
        if self.op in ("=~", "!~"):
            return (re.fullmatch(self.value, got) is not None) == (self.op == "=~")
        return (got == self.value) == (self.op == "=")


def _all(matchers: Sequence[Matcher], labels: Mapping[str, str]) -> bool:
    return all(m.matches(labels) for m in matchers)


@dataclass(frozen=True)
class Rule:
    """One inhibit rule: targets muted by sources with the same `equal` labels."""

    sources: tuple[Matcher, ...]
    targets: tuple[Matcher, ...]
    equal: tuple[str, ...]

    @classmethod
    def from_config(cls, doc: dict[str, Any]) -> Rule:
        unsupported = set(doc) - {"source_matchers", "target_matchers", "equal"}
        if unsupported:  # the older source_match/_re forms: not used by our configuration
            raise ValueError(f"inhibit rule keys not supported: {sorted(unsupported)}")
        sources = tuple(Matcher.parse(t) for t in doc.get("source_matchers") or ())
        targets = tuple(Matcher.parse(t) for t in doc.get("target_matchers") or ())
        return cls(sources, targets, tuple(doc.get("equal") or ()))

    def mutes(self, target: Mapping[str, str], firing: Sequence[Mapping[str, str]]) -> bool:
        if not _all(self.targets, target):
            return False
        two_sided = _all(self.sources, target)
        return any(
            _all(self.sources, src)
            and all(src.get(n, "") == target.get(n, "") for n in self.equal)
            and not (two_sided and _all(self.targets, src))
            for src in firing
        )


@dataclass(frozen=True)
class Inhibition:
    rules: tuple[Rule, ...]

    @classmethod
    def load(cls, path: Path = CONFIG) -> Inhibition:
        doc = yaml.safe_load(path.read_text()) or {}
        return cls(tuple(Rule.from_config(r) for r in doc.get("inhibit_rules") or ()))

    def muted(self, firing: Sequence[Mapping[str, str]]) -> list[bool]:
        """For each firing alert (its labels), whether Alertmanager mutes it."""
        return [self.mutes(a, firing) for a in firing]

    def mutes(self, alert: Mapping[str, str], firing: Sequence[Mapping[str, str]]) -> bool:
        """Whether the `firing` alerts mute `alert` (firing or resolved: a muted alert's
        notifications, its resolve among them, are held back)."""
        return any(r.mutes(alert, firing) for r in self.rules)

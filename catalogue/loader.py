"""Load and validate the failure catalogue (outcomes.yaml, xid.yaml, patterns.yaml).

Every problem in the YAML raises `CatalogueError` naming the file and the entry: each entry's
shape by `catalogue.schema` (unknown keys rejected), then the cross-references (outcomes,
actions, classes, groups). Each pattern's `examples` must match it and its `counter_examples`
must not, checked at load.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from catalogue import schema
from catalogue.model import Action, Catalogue, Outcome, Pattern, XidInfo

HERE = Path(__file__).resolve().parent
GROUP_TYPES = {"int": int, "float": float, "str": str}
_ID = re.compile(r"^[a-z][a-z0-9_]{1,63}$")


class CatalogueError(ValueError):
    """The catalogue's YAML is missing, malformed or inconsistent."""


def _gate(regexes: tuple[re.Pattern[str], ...]) -> re.Pattern[str] | None:
    """One alternation of several regexes, named groups made plain (speed only)."""
    if len(regexes) < 2:
        return None
    parts = []
    for rx in regexes:
        text = re.sub(r"\(\?P<\w+>", "(?:", rx.pattern)
        if text.startswith("(?i)"):
            parts.append("(?i:" + text[4:] + ")")
        else:
            parts.append("(?:" + text + ")")
    try:
        return re.compile("|".join(parts))
    except re.error:  # e.g. a global flag inside one regex: go without the shortcut
        return None


def _read(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CatalogueError(f"{path}: file not found") from None
    except yaml.YAMLError as exc:
        raise CatalogueError(f"{path}: invalid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise CatalogueError(f"{path}: the top level must be a mapping")
    return data


def _str_map(data: dict[str, Any], key: str, where: str) -> dict[str, str]:
    value = data.get(key)
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise CatalogueError(f"{where}: {key} must map a name to a one-line text")
    return dict(value)


def _compile(rx: Any, where: str) -> re.Pattern[str]:
    if not isinstance(rx, str) or not rx:
        raise CatalogueError(f"{where}: a regex must be a non-empty string")
    try:
        return re.compile(rx)
    except re.error as exc:
        raise CatalogueError(f"{where}: bad regex {rx!r}: {exc}") from None


def _as_list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return value
    raise CatalogueError(f"{where}: expected a string or a list")


def _load_outcomes(
    path: Path,
) -> tuple[dict[str, Outcome], dict[str, str], dict[str, Action]]:
    doc = schema.check(schema.OutcomesFile, _read(path), path.name, CatalogueError)
    actions = {
        a: Action(a, e.meaning, e.destructive, e.restarts, e.drains) for a, e in doc.actions.items()
    }
    for aid, act in actions.items():
        if not _ID.match(aid) or ((act.restarts or act.drains) and not act.destructive):
            raise CatalogueError(
                f"{path.name}: action {aid!r}: lower_snake_case; a restart or drain is destructive"
            )
    outcomes: dict[str, Outcome] = {}
    for oid, entry in doc.outcomes.items():
        where = f"{path.name}: outcome {oid!r}"
        if not _ID.match(oid):
            raise CatalogueError(f"{where}: ids are lower_snake_case")
        if entry.category not in doc.categories:
            raise CatalogueError(f"{where}: unknown category {entry.category!r}")
        if entry.action not in actions:
            raise CatalogueError(f"{where}: unknown action {entry.action!r}")
        outcomes[oid] = Outcome(oid, entry.category, entry.meaning, entry.action)
    return outcomes, dict(doc.categories), actions


def _xid(
    entry: Any,
    where: str,
    sources: dict[str, str],
    classes: dict[str, schema.XidClass],
    outcomes: dict[str, Outcome],
    actions: dict[str, Action],
) -> XidInfo:
    e = schema.check(schema.XidEntry, entry, where, CatalogueError)
    if e.cls not in classes:
        raise CatalogueError(f"{where}: class must be one of {sorted(classes)}")
    if e.source not in sources:
        raise CatalogueError(f"{where}: source {e.source!r} is not under `sources`")
    if e.job_action not in actions:
        raise CatalogueError(f"{where}: unknown job_action {e.job_action!r}")
    if e.outcome not in outcomes:
        raise CatalogueError(f"{where}: unknown outcome {e.outcome!r}")
    cls = classes[e.cls]
    return XidInfo(
        code=e.code,
        name=e.name,
        severity=e.severity,
        nvidia_action=e.nvidia_action,
        job_action=e.job_action,
        outcome=e.outcome,
        consequence=e.consequence,
        note=e.note,
        mnemonic=e.mnemonic,
        cls=e.cls,
        source=sources[e.source],
        weight=cls.detector_weight,
        alert=cls.alert,
    )


def _load_xids(
    path: Path, outcomes: dict[str, Outcome], actions: dict[str, Action]
) -> tuple[dict[int, XidInfo], XidInfo]:
    """The XID table and the entry for a code the table does not list (`unlisted`)."""
    data = _read(path)
    unknown = set(data) - {"sources", "classes", "xids", "unlisted"}
    if unknown:
        raise CatalogueError(f"{path.name}: unknown top-level keys {sorted(unknown)}")
    sources = _str_map(data, "sources", path.name)
    raw_classes = data.get("classes")
    if not isinstance(raw_classes, dict):
        raise CatalogueError(f"{path.name}: `classes` must map a class to its meaning")
    classes = {
        str(k): schema.check(schema.XidClass, v, f"{path.name}: class {k!r}", CatalogueError)
        for k, v in raw_classes.items()
    }
    entries = data.get("xids")
    if not isinstance(entries, list):
        raise CatalogueError(f"{path.name}: `xids` must be a list")
    xids: dict[int, XidInfo] = {}
    for i, entry in enumerate(entries):
        code = entry.get("code") if isinstance(entry, dict) else None
        if not isinstance(code, int) or isinstance(code, bool) or code < 1:
            raise CatalogueError(f"{path.name}: xids[{i}]: code must be a positive integer")
        where = f"{path.name}: XID {code}"
        if code in xids:
            raise CatalogueError(f"{where}: listed twice")
        xids[code] = _xid(entry, where, sources, classes, outcomes, actions)
    where = f"{path.name}: unlisted"
    unlisted = _xid(data.get("unlisted"), where, sources, classes, outcomes, actions)
    if unlisted.outcome == "healthy":
        raise CatalogueError(f"{where}: an XID the table does not know is never healthy")
    return xids, unlisted


def _load_patterns(
    path: Path, outcomes: dict[str, Outcome], actions: dict[str, Action]
) -> tuple[tuple[Pattern, ...], dict[str, type], tuple[re.Pattern[str], ...]]:
    data = _read(path)
    unknown = set(data) - {"groups", "rank_hints", "patterns"}
    if unknown:
        raise CatalogueError(f"{path.name}: unknown top-level keys {sorted(unknown)}")
    group_types: dict[str, type] = {}
    groups = data.get("groups")
    if not isinstance(groups, dict):
        raise CatalogueError(f"{path.name}: `groups` must map a group name to its type")
    for name, tname in groups.items():
        if tname not in GROUP_TYPES:
            raise CatalogueError(f"{path.name}: group {name!r}: type must be int, float or str")
        group_types[name] = GROUP_TYPES[tname]
    hints = tuple(
        _compile(rx, f"{path.name}: rank_hints")
        for rx in _as_list(data.get("rank_hints"), "rank_hints")
    )
    for h in hints:
        if "rank" not in h.groupindex:
            raise CatalogueError(f"{path.name}: rank_hints regex {h.pattern!r} lacks (?P<rank>...)")
    entries = data.get("patterns")
    if not isinstance(entries, list):
        raise CatalogueError(f"{path.name}: `patterns` must be a list")
    patterns: list[Pattern] = []
    examples: list[tuple[str, str, list[Any], list[Any]]] = []
    for i, entry in enumerate(entries):
        pid = entry.get("id") if isinstance(entry, dict) else None
        where = (
            f"{path.name}: pattern {pid!r}"
            if isinstance(pid, str)
            else f"{path.name}: patterns[{i}]"
        )
        e = schema.check(schema.PatternEntry, entry, where, CatalogueError)
        if not _ID.match(e.id) or any(p.id == e.id for p in patterns):
            raise CatalogueError(f"{where}: ids are unique lower_snake_case")
        if e.outcome and e.outcome not in outcomes:
            raise CatalogueError(f"{where}: unknown outcome {e.outcome!r}")
        if e.action and e.action not in actions:
            raise CatalogueError(f"{where}: unknown action {e.action!r}")
        regexes = tuple(_compile(rx, where) for rx in _as_list(e.regex, where))
        if not regexes:
            raise CatalogueError(f"{where}: needs at least one regex")
        fields = []
        for name, rx in (e.fields or {}).items():
            compiled = _compile(rx, f"{where} field {name!r}")
            if compiled.groups < 1:
                raise CatalogueError(f"{where}: field {name!r} needs a capture group")
            fields.append((name, compiled))
        for name in {g for rx in regexes for g in rx.groupindex} | {n for n, _ in fields}:
            if name not in group_types:
                raise CatalogueError(f"{where}: group {name!r} is not declared under `groups`")
        keywords = _as_list(e.keywords, where)
        if not all(keywords):
            raise CatalogueError(f"{where}: keywords must be non-empty strings (quote 'a: b')")
        sources = _as_list(e.sources, where)
        if not all(sources):
            raise CatalogueError(f"{where}: sources must be non-empty strings")
        patterns.append(
            Pattern(
                id=e.id,
                source=e.source,
                symptom=e.symptom,
                role=e.role,
                regexes=regexes,
                fields=tuple(fields),
                keywords=tuple(k.lower() for k in keywords),
                exclusive=e.exclusive,
                outcome=e.outcome,
                description=e.description,
                gate=_gate(regexes),
                ignore_case=e.ignore_case,
                alert=e.alert,
                fallback=e.fallback,
                sources=tuple(sources),
                action=e.action,
                examples=tuple(str(x) for x in _as_list(e.examples, where)),
            )
        )
        examples.append(
            (
                e.id,
                "kernel" if e.source == "kernel" else "job",
                _as_list(e.examples, where),
                _as_list(e.counter_examples, where),
            )
        )
    cat_patterns = tuple(patterns)
    probe = Catalogue({}, {}, {}, {}, cat_patterns, group_types, hints)
    for pid, source, good, bad in examples:
        for line in good:
            if pid not in {m.pattern for m in probe.match_line(str(line), source)}:
                raise CatalogueError(
                    f"{path.name}: pattern {pid!r} does not match its example {line!r}"
                )
        for line in bad:
            if pid in {m.pattern for m in probe.match_line(str(line), source)}:
                raise CatalogueError(
                    f"{path.name}: pattern {pid!r} matches its counter-example {line!r}"
                )
    return cat_patterns, group_types, hints


def load(directory: str | os.PathLike[str] | None = None) -> Catalogue:
    """Load and validate the catalogue from `directory` (default: this package's YAML files)."""
    base = Path(directory) if directory else HERE
    outcomes, categories, actions = _load_outcomes(base / "outcomes.yaml")
    xids, unlisted = _load_xids(base / "xid.yaml", outcomes, actions)
    patterns, group_types, hints = _load_patterns(base / "patterns.yaml", outcomes, actions)
    return Catalogue(outcomes, categories, actions, xids, patterns, group_types, hints, unlisted)


@lru_cache(maxsize=1)
def default() -> Catalogue:
    """The catalogue in `$GOODPUT_CATALOGUE_DIR`, or the packaged one; loaded once."""
    return load(os.environ.get("GOODPUT_CATALOGUE_DIR") or None)

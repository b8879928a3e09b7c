"""The alert conditions (alertmanager/alerts.yaml): the schema, loading and validation.

One source, several consumers: `alertdsl.rules` renders the Prometheus rule file from a `Spec`,
`alertdsl.evaluation` applies the same structured conditions in-process to a recording-style
frame (so the benchmark measures what production alerts on), `alertdsl.promtool` writes the
promtool unit tests.

>>> spec = load()
>>> 0 < threshold("GoodputJobAnomaly", spec) < 10  # tuned by notebooks/tune_detector.ipynb
True
>>> "GoodputGPUFatalXid" in [a.name for a in spec.alerts]
True
"""

from __future__ import annotations

import operator
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from catalogue import loader

DEFAULT_PATH = Path(__file__).resolve().parent.parent / "alertmanager" / "alerts.yaml"
PATH_ENV = "GOODPUT_ALERTS_FILE"  # points every consumer (detector, benchmark, notebooks) at a copy
KINDS = ("threshold", "increase", "gone", "promql")
OPS: dict[str, Callable[[Any, Any], Any]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}
SEVERITIES = ("critical", "warning", "info")
SCOPES = ("gpu", "node", "job", "service")
_DURATION = re.compile(r"^([0-9]+)(ms|s|m|h|d)$")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_ALERT = re.compile(r"^Goodput[A-Za-z0-9]+$")


class AlertsError(ValueError):
    """alerts.yaml does not follow the schema; the message names the offending entry."""


def duration_seconds(text: str) -> float:
    """'5m' -> 300.0; raises AlertsError on anything Prometheus would not accept."""
    m = _DURATION.match(str(text))
    if not m:
        raise AlertsError(f"bad duration {text!r} (want e.g. 2s, 5m, 1h)")
    return int(m.group(1)) * _UNIT_S[m.group(2)]


@dataclass(frozen=True)
class Condition:
    """One structured condition; see the header of alerts.yaml for the kinds."""

    kind: str
    metric: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    op: str = ">"
    threshold: float | None = None
    values: tuple[float, ...] = ()
    window: str = ""
    by: tuple[str, ...] = ()
    while_present: tuple[str, ...] = ()
    while_any: bool = False
    source: str = ""
    new_series: bool = False
    join_job: bool = False
    expr: str = ""
    for_: str | None = None
    signal: str = ""

    @property
    def evaluable(self) -> bool:
        """True when evaluate() can apply it in-process (everything but raw PromQL)."""
        return self.kind != "promql"


@dataclass(frozen=True)
class Alert:
    name: str
    severity: str
    scope: str
    for_: str
    summary: str
    description: str
    conditions: tuple[Condition, ...]


@dataclass(frozen=True)
class Spec:
    alerts: tuple[Alert, ...]
    recording: tuple[dict[str, str], ...] = ()
    runbook_base: str = "alertmanager/runbooks.md"
    dcgm_scrape_job: str = "dcgm"
    extra: dict[str, Any] = field(default_factory=dict)

    def alert(self, name: str) -> Alert:
        for a in self.alerts:
            if a.name == name:
                return a
        raise KeyError(f"no alert named {name!r} in alerts.yaml")

    def runbook_url(self, name: str) -> str:
        return f"{self.runbook_base}#{name.lower()}"


# ---------------------------------------------------------------- loading and validation


def required(d: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in d or d[key] in (None, ""):
        raise AlertsError(f"{where}: missing {key!r}")
    return d[key]


FROM_CATALOGUE = "catalogue"  # a value list or label matcher the catalogue fills in


def catalogue_values(alert: str, label: str) -> tuple[str, ...]:
    """What `catalogue` stands for in an alert's condition: for `xid` (a label, or the `values`
    of the XID gauge) the codes whose class names `alert` in xid.yaml; for `pattern` the ids of
    the patterns flagged `alert: true` in patterns.yaml. One list, generated outward."""
    cat = loader.default()
    if label == "xid":
        return tuple(str(c) for c, x in sorted(cat.xids.items()) if x.alert == alert)
    if label == "pattern":
        return tuple(p.id for p in cat.patterns if p.alert)
    raise AlertsError(f"alert {alert}: the catalogue fills in xid or pattern, not {label!r}")


def _filled(raw: Mapping[str, Any], alert: str, where: str) -> dict[str, Any]:
    """`raw` with every `catalogue` placeholder replaced by the catalogue's list."""
    out = dict(raw)
    labels = dict(raw.get("labels") or {}) if isinstance(raw.get("labels"), Mapping) else None
    for k, v in (labels or {}).items():
        if v == FROM_CATALOGUE:
            values = catalogue_values(alert, str(k))
            if not values:
                raise AlertsError(f"{where}: the catalogue lists nothing for {k}")
            labels[k] = "=~" + "|".join(values)  # type: ignore[index]
    if labels is not None:
        out["labels"] = labels
    if raw.get("values") == FROM_CATALOGUE:
        out["values"] = [int(v) for v in catalogue_values(alert, "xid")]
        if not out["values"]:
            raise AlertsError(f"{where}: the catalogue lists no XID for this alert")
    return out


def _condition(raw: Any, where: str, alert: str = "") -> Condition:
    if not isinstance(raw, Mapping):
        raise AlertsError(f"{where}: a condition must be a mapping")
    raw = _filled(raw, alert, where)
    allowed = {
        "kind", "metric", "labels", "op", "threshold", "values", "window", "by",
        "while_present", "while_any", "source", "new_series", "join_job", "expr", "for", "signal",
    }  # fmt: skip
    unknown = set(raw) - allowed
    if unknown:
        raise AlertsError(f"{where}: unknown keys {sorted(unknown)}")
    kind = required(raw, "kind", where)
    if kind not in KINDS:
        raise AlertsError(f"{where}: kind {kind!r} is not one of {KINDS}")
    if "for" in raw:
        duration_seconds(raw["for"])
    if kind == "promql":
        expr = str(required(raw, "expr", where)).strip()
        signal = str(required(raw, "signal", where))
        return Condition(kind=kind, expr=expr, for_=raw.get("for"), signal=signal)
    metric = str(required(raw, "metric", where))
    if not _NAME.match(metric):
        raise AlertsError(f"{where}: bad metric name {metric!r}")
    labels = raw.get("labels") or {}
    if not isinstance(labels, Mapping):
        raise AlertsError(f"{where}: labels must be a mapping")
    for k, v in labels.items():
        if not _LABEL.match(str(k)) or any(c in str(v) for c in '"\n\\'):
            raise AlertsError(f"{where}: bad label matcher {k}={v!r}")
    source = raw.get("source", "")
    if source not in ("", "dcgm"):
        raise AlertsError(f"{where}: source must be 'dcgm' or absent, not {source!r}")
    by = tuple(raw.get("by") or ())
    window = str(raw.get("window", ""))
    if kind in ("increase", "gone"):
        duration_seconds(required(raw, "window", where))
    op = str(raw.get("op", ">"))
    threshold = raw.get("threshold")
    values: tuple[float, ...] = ()
    if kind in ("threshold", "increase"):
        if op == "in":
            if kind != "threshold" or not raw.get("values"):
                raise AlertsError(f"{where}: op 'in' needs kind threshold and a list of values")
            values = tuple(float(v) for v in raw["values"])
        elif op not in OPS:
            raise AlertsError(f"{where}: op {op!r} is not one of {sorted(OPS)} or 'in'")
        elif not isinstance(threshold, int | float):
            raise AlertsError(f"{where}: threshold must be a number")
    if kind == "gone" and not by:
        raise AlertsError(f"{where}: kind gone needs 'by'")
    return Condition(
        kind=kind,
        metric=metric,
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        op=op,
        threshold=None if threshold is None else float(threshold),
        values=values,
        window=window,
        by=by,
        while_present=tuple(raw.get("while_present") or ()),
        while_any=bool(raw.get("while_any", False)),
        source=source,
        new_series=bool(raw.get("new_series", False)),
        join_job=bool(raw.get("join_job", False)),
        for_=raw.get("for"),
        signal=str(raw.get("signal") or metric),
    )


def _alert(raw: Any, i: int) -> Alert:
    where = f"alerts[{i}]"
    if not isinstance(raw, Mapping):
        raise AlertsError(f"{where}: must be a mapping")
    name = str(required(raw, "name", where))
    where = f"alert {name}"
    if not _ALERT.match(name):
        raise AlertsError(f"{where}: names start with 'Goodput' and are CamelCase")
    severity = required(raw, "severity", where)
    if severity not in SEVERITIES:
        raise AlertsError(f"{where}: severity {severity!r} is not one of {SEVERITIES}")
    scope = required(raw, "scope", where)
    if scope not in SCOPES:
        raise AlertsError(f"{where}: scope {scope!r} is not one of {SCOPES}")
    for_ = str(raw.get("for", "0s"))
    duration_seconds(for_)
    conds = raw.get("conditions") or []
    if not conds:
        raise AlertsError(f"{where}: needs at least one condition")
    conditions = tuple(_condition(c, f"{where} condition {j}", name) for j, c in enumerate(conds))
    signals = [c.signal for c in conditions]
    if len(set(signals)) != len(signals):
        raise AlertsError(f"{where}: conditions need distinct 'signal' names, got {signals}")
    return Alert(
        name=name,
        severity=severity,
        scope=scope,
        for_=for_,
        summary=str(required(raw, "summary", where)).strip(),
        description=str(required(raw, "description", where)).strip(),
        conditions=conditions,
    )


def parse(doc: Any) -> Spec:
    """Validate a loaded alerts.yaml document and return the Spec."""
    if not isinstance(doc, Mapping) or doc.get("version") != 1:
        raise AlertsError("alerts.yaml: expected a mapping with version: 1")
    alerts = tuple(_alert(a, i) for i, a in enumerate(doc.get("alerts") or []))
    names = [a.name for a in alerts]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise AlertsError(f"alerts.yaml: duplicate alert names {dupes}")
    recording = []
    for i, r in enumerate(doc.get("recording") or []):
        rec = str(required(r, "record", f"recording[{i}]"))
        if not _NAME.match(rec):
            raise AlertsError(f"recording[{i}]: bad record name {rec!r}")
        unknown = set(r) - {"record", "expr", "source"}
        if unknown:
            raise AlertsError(f"recording {rec}: unknown keys {sorted(unknown)}")
        expr = str(required(r, "expr", f"recording {rec}")).strip()
        if r.get("source") == "dcgm" and not _NAME.match(expr):
            raise AlertsError(f"recording {rec}: with source dcgm, expr is a metric name")
        recording.append({k: str(v).strip() for k, v in r.items()})
    return Spec(
        alerts=alerts,
        recording=tuple(recording),
        runbook_base=str(doc.get("runbook_base", "alertmanager/runbooks.md")),
        dcgm_scrape_job=str(doc.get("dcgm_scrape_job", "dcgm")),
    )


def configured_path() -> Path:
    """The alert conditions in use: `$GOODPUT_ALERTS_FILE`, else the project's alerts.yaml."""
    return Path(os.environ.get(PATH_ENV) or DEFAULT_PATH)


def load(path: str | Path | None = None) -> Spec:
    """Load and validate an alerts file (default: `configured_path()`)."""
    p = Path(path) if path else configured_path()
    try:
        doc = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise AlertsError(f"cannot read {p}: {e}") from e
    return parse(doc)


def threshold(alert_name: str, spec: Spec | None = None) -> float:
    """The threshold of the alert's first numeric condition (1.0 for the score alerts)."""
    alert = (spec or load()).alert(alert_name)
    for c in alert.conditions:
        if c.threshold is not None:
            return c.threshold
    raise AlertsError(f"alert {alert_name} has no numeric threshold")

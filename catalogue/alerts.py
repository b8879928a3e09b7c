"""Goodput's alert conditions (alertmanager/alerts.yaml): load, validate, render, evaluate.

One source, two consumers: `render_rules()` writes the Prometheus rule file, and `evaluate()`
applies the same structured conditions in-process to a recording-style frame, so the benchmark
measures what production alerts on.

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

import numpy as np
import pandas as pd
import yaml

from catalogue import loader, promql

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
JOB_INFO = "goodput_slurm_job_node_info"


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


def _req(d: Mapping[str, Any], key: str, where: str) -> Any:
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
    kind = _req(raw, "kind", where)
    if kind not in KINDS:
        raise AlertsError(f"{where}: kind {kind!r} is not one of {KINDS}")
    if "for" in raw:
        duration_seconds(raw["for"])
    if kind == "promql":
        expr = str(_req(raw, "expr", where)).strip()
        signal = str(_req(raw, "signal", where))
        return Condition(kind=kind, expr=expr, for_=raw.get("for"), signal=signal)
    metric = str(_req(raw, "metric", where))
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
        duration_seconds(_req(raw, "window", where))
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
    name = str(_req(raw, "name", where))
    where = f"alert {name}"
    if not _ALERT.match(name):
        raise AlertsError(f"{where}: names start with 'Goodput' and are CamelCase")
    severity = _req(raw, "severity", where)
    if severity not in SEVERITIES:
        raise AlertsError(f"{where}: severity {severity!r} is not one of {SEVERITIES}")
    scope = _req(raw, "scope", where)
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
        summary=str(_req(raw, "summary", where)).strip(),
        description=str(_req(raw, "description", where)).strip(),
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
        rec = str(_req(r, "record", f"recording[{i}]"))
        if not _NAME.match(rec):
            raise AlertsError(f"recording[{i}]: bad record name {rec!r}")
        unknown = set(r) - {"record", "expr", "source"}
        if unknown:
            raise AlertsError(f"recording {rec}: unknown keys {sorted(unknown)}")
        expr = str(_req(r, "expr", f"recording {rec}")).strip()
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


# ---------------------------------------------------------------- PromQL rendering


def _selector(metric: str, labels: tuple[tuple[str, str], ...], extra: str = "") -> str:
    parts = []
    for k, v in labels:
        for prefix in ("=~", "!~", "!="):
            if v.startswith(prefix):
                parts.append(f"{k}{prefix}{promql.quote(v[len(prefix) :])}")
                break
        else:
            parts.append(f"{k}={promql.quote(v)}")
    if extra:
        parts.append(extra)
    return f"{metric}{{{', '.join(parts)}}}" if parts else metric


def dcgm_map(expr: str) -> str:
    """dcgm-exporter labels -> Goodput's: Hostname/hostname -> node, hpc_job -> job_id."""
    e = f'label_replace({expr}, "node", "$1", "Hostname", "(.+)")'
    e = f'label_replace({e}, "node", "$1", "hostname", "(.+)")'
    e = f'label_replace({e}, "job_id", "$1", "hpc_job", "(.+)")'
    return f"max without (Hostname, hostname, hpc_job) ({e})"


def job_join(expr_with: str, expr_without: str | None = None) -> str:
    """Add job_id from Slurm's job->node info to series that lack it (one job per node)."""
    without = expr_without if expr_without is not None else expr_with
    joined = f"({without}) * on (node) group_left (job_id) topk by (node) (1, {JOB_INFO})"
    alone = f"({without}) unless on (node) {JOB_INFO}"
    if expr_without is None:
        return f"{joined}\nor\n{alone}"
    return f"({expr_with})\nor\n{joined}\nor\n{alone}"


def _fmt(x: float) -> str:
    return f"{x:g}"


def _compare(lhs: str, c: Condition) -> str:
    if c.op == "in":
        return " or ".join(f"{lhs} == {_fmt(v)}" for v in c.values)
    assert c.threshold is not None  # noqa: S101 - validated in _condition
    return f"{lhs} {c.op} {_fmt(c.threshold)}"


def _core(c: Condition, hpc: str) -> str:
    """The condition for one selector variant; `hpc` is an extra dcgm matcher or ''."""
    mapped = dcgm_map if c.source == "dcgm" else (lambda e: e)
    sel = _selector(c.metric, c.labels, hpc)
    if c.kind == "threshold":
        return mapped(_compare(sel, c))
    if c.kind == "increase" and c.source == "dcgm":
        # A job ending drops hpc_job and starts a new series, often at the very moment of the
        # fault, so increase() per series misses it. Instead: the GPU's value now minus its
        # lowest value within the window, whatever the job (a counter reset gives 0, not a rise).
        every = _selector(c.metric, c.labels)
        low = f"min without (hpc_job) (min_over_time({every}[{c.window}]))"
        return mapped(_compare(f"({sel} - ignoring (hpc_job) group_left {low})", c))
    if c.kind == "increase":
        core = _compare(f"increase({sel}[{c.window}])", c)
        if c.new_series:
            core = f"{core} or ({_compare(sel, c)} unless {sel} offset {c.window})"
        return mapped(core)
    # gone: seen within the window, not now (per `by`), optionally while the coarser group reports
    by = ", ".join(c.by)
    every = mapped(_selector(c.metric, c.labels))
    e = f"max by ({by}) ({mapped(f'last_over_time({sel}[{c.window}])')}) unless on ({by}) {every}"
    if c.while_present:
        e = f"({e}) and on ({', '.join(c.while_present)}) {every}"
    if c.while_any:  # all gone at once is the exporter or Prometheus, not every node
        e = f"({e}) and on () count({every}) > 0"
    return e


def condition_expr(c: Condition) -> str:
    """The PromQL of one condition, with dcgm label mapping and the Slurm job join."""
    if c.kind == "promql":
        return c.expr
    if c.kind == "gone":  # the job now allocated on the node, from Slurm (hpc_job has gone too)
        return job_join(_core(c, "")) if "node" in c.by else _core(c, "")
    if c.source == "dcgm":
        return job_join(_core(c, 'hpc_job!=""'), _core(c, 'hpc_job=""'))
    if c.join_job:
        return job_join(_core(c, ""))
    return _core(c, "")


def render_rules(spec: Spec) -> dict[str, Any]:
    """The Prometheus rule file (as a dict) for every recording rule and alert condition."""
    recording = []
    for r in spec.recording:
        expr = r["expr"]
        if r.get("source") == "dcgm":
            m = _selector(expr, ())
            expr = job_join(dcgm_map(f'{m}{{hpc_job!=""}}'), dcgm_map(f'{m}{{hpc_job=""}}'))
        recording.append({"record": r["record"], "expr": expr})
    alerting = []
    for a in spec.alerts:
        for c in a.conditions:
            alerting.append(
                {
                    "alert": a.name,
                    "expr": condition_expr(c),
                    "for": c.for_ or a.for_,
                    "labels": {"severity": a.severity, "scope": a.scope, "signal": c.signal},
                    "annotations": {
                        "summary": a.summary,
                        "description": a.description,
                        "runbook_url": spec.runbook_url(a.name),
                    },
                }
            )
    return {
        "groups": [
            {"name": "goodput-recording", "rules": recording},
            {"name": "goodput-alerts", "rules": alerting},
        ]
    }


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, s: str) -> yaml.Node:
    style = "|" if "\n" in s else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style=style)


_Dumper.add_representer(str, _str)

HEADER = (
    "# GENERATED by `goodput rules generate` from alertmanager/alerts.yaml. Do not edit:\n"
    "# change alerts.yaml and regenerate (a test fails when this file is stale).\n"
)


def dump_rules(spec: Spec) -> str:
    """The rule file as text, stable across runs."""
    body = yaml.dump(render_rules(spec), Dumper=_Dumper, sort_keys=False, width=100)
    return HEADER + body


# ---------------------------------------------------------------- in-process evaluation


def _is_metric(col: str) -> bool:
    return col.startswith(("DCGM_", "goodput_"))


def _match(frame: pd.DataFrame, labels: tuple[tuple[str, str], ...]) -> pd.Series:
    keep = pd.Series(True, index=frame.index)
    for k, v in labels:
        col = frame[k].fillna("").astype(str) if k in frame else pd.Series("", index=frame.index)
        if v.startswith(("=~", "!~")):
            hit = col.str.fullmatch(v[2:])
            keep &= hit if v.startswith("=~") else ~hit
        elif v.startswith("!="):
            keep &= col != v[2:]
        else:
            keep &= col == v
    return keep


def _increase(values: np.ndarray, times: np.ndarray, window: float, new: bool) -> np.ndarray:
    d = np.diff(values, prepend=np.nan)
    d = np.where(d < 0, values, d)  # counter reset: count from zero
    d[0] = values[0] if new else 0.0
    s = pd.Series(d, index=pd.to_datetime(times, unit="s"))
    return s.rolling(pd.Timedelta(seconds=window)).sum().to_numpy()


def _gone(frame: pd.DataFrame, c: Condition) -> pd.DataFrame:
    grid = np.sort(frame["timestamp"].unique())
    window = duration_seconds(c.window)
    rows = frame.loc[frame[c.metric].notna() & _match(frame, c.labels)]
    out = []
    coarse: dict[tuple, set] = {}
    if c.while_present:
        for key, g in rows.groupby(list(c.while_present), dropna=False):
            coarse[key if isinstance(key, tuple) else (key,)] = set(g["timestamp"])
    for key, g in rows.groupby(list(c.by), dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        seen = np.sort(g["timestamp"].unique())
        idx = np.searchsorted(seen, grid, side="right") - 1
        last = np.where(idx >= 0, seen[np.clip(idx, 0, None)], -np.inf)
        fire = (last < grid) & (grid - last < window)
        if c.while_present:
            ckey = tuple(key[c.by.index(k)] for k in c.while_present)
            present = coarse.get(ckey, set())
            fire &= np.array([t in present for t in grid])
        if c.while_any:
            fire &= np.isin(grid, rows["timestamp"].unique())
        labels = dict(zip(c.by, key, strict=True))
        if "job_id" in g and "job_id" not in labels:
            labels["job_id"] = g["job_id"].iloc[-1]
        out.append(pd.DataFrame({"timestamp": grid, "active": fire, **labels}))
    cols = ["timestamp", "active", *c.by]
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=cols)


def _dcgm_rise(rows: pd.DataFrame, c: Condition, keys: list[str]) -> pd.DataFrame:
    """Per GPU (job_id ignored): value now minus the lowest value within the window."""
    window = pd.Timedelta(seconds=duration_seconds(c.window))
    parts = []
    for _, g in rows.groupby(keys, dropna=False, sort=False) if keys else [((), rows)]:
        per_t = g.groupby("timestamp", sort=True)[c.metric].max()
        low = pd.Series(per_t.to_numpy(), index=pd.to_datetime(per_t.index, unit="s"))
        low = low.rolling(window).min().to_numpy()
        rise = pd.Series(per_t.to_numpy() - low, index=per_t.index)
        active = OPS[c.op](g["timestamp"].map(rise).to_numpy(dtype=float), c.threshold)
        cols = ["timestamp", *keys, *(["job_id"] if "job_id" in g else [])]
        parts.append(g[cols].assign(active=active))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _active(frame: pd.DataFrame, c: Condition) -> pd.DataFrame:
    """Rows (timestamp, labels..., active) for one condition, before `for`."""
    if c.kind == "gone":
        return _gone(frame, c)
    labels = [k for k in frame.columns if k != "timestamp" and not _is_metric(k)]
    rows = frame.loc[frame[c.metric].notna() & _match(frame, c.labels)]
    rows = rows[["timestamp", *labels, c.metric]].sort_values("timestamp")
    if c.kind == "increase" and c.source == "dcgm":
        return _dcgm_rise(rows, c, [k for k in labels if k != "job_id"])
    parts = []
    for _, g in rows.groupby(labels, dropna=False, sort=False) if labels else [((), rows)]:
        v = g[c.metric].to_numpy(dtype=float)
        if c.kind == "increase":
            t = g["timestamp"].to_numpy(dtype=float)
            v = _increase(v, t, duration_seconds(c.window), c.new_series)
        active = np.isin(v, c.values) if c.op == "in" else OPS[c.op](v, c.threshold)
        parts.append(g[["timestamp", *labels]].assign(active=active))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _persist(active: pd.DataFrame, for_s: float) -> pd.DataFrame:
    """Keep rows whose condition has held for at least `for_s` seconds (per series)."""
    if active.empty:
        return active
    keys = [k for k in active.columns if k not in ("timestamp", "active")]
    out = []
    for _, g in active.groupby(keys, dropna=False, sort=False) if keys else [((), active)]:
        g = g.sort_values("timestamp")
        act = g["active"].to_numpy(dtype=bool)
        ts = g["timestamp"].to_numpy(dtype=float)
        run = np.cumsum(~act)[act]  # consecutive true samples share a run id
        start = pd.Series(ts[act]).groupby(run).transform("min").to_numpy()
        out.append(g.loc[act].loc[ts[act] - start >= for_s])
    if not out:
        return pd.DataFrame()
    return pd.concat(out, ignore_index=True).drop(columns="active")


def evaluate(alert: Alert | str, frame: pd.DataFrame, spec: Spec | None = None) -> pd.DataFrame:
    """Where the alert fires over a recording-style frame.

    `frame` is wide: a `timestamp` column (unix seconds), label columns (`node`, `gpu`,
    `job_id`, `detector`, ...; dcgm labels already mapped), and one column per metric
    (`DCGM_*`, `goodput_*`). Returns rows (timestamp, alertname, severity, labels...) where
    some evaluable condition has held for its `for`. Conditions on metrics the frame lacks,
    and raw `promql` ones, are skipped.
    """
    if isinstance(alert, str):
        alert = (spec or load()).alert(alert)
    if "timestamp" not in frame:
        raise ValueError("frame needs a 'timestamp' column (unix seconds)")
    parts = []
    for c in alert.conditions:
        if not c.evaluable or c.metric not in frame:
            continue
        fired = _persist(_active(frame, c), duration_seconds(c.for_ or alert.for_))
        if not fired.empty:
            parts.append(fired)
    if not parts:
        return pd.DataFrame(columns=["timestamp", "alertname", "severity"])
    out = pd.concat(parts, ignore_index=True)
    out.insert(1, "alertname", alert.name)
    out.insert(2, "severity", alert.severity)
    return out.sort_values("timestamp", kind="stable").reset_index(drop=True)


def evaluate_all(frame: pd.DataFrame, spec: Spec | None = None) -> pd.DataFrame:
    """evaluate() for every alert in alerts.yaml; one frame, sorted by time."""
    spec = spec or load()
    parts = [r for a in spec.alerts if not (r := evaluate(a, frame, spec)).empty]
    if not parts:
        return pd.DataFrame(columns=["timestamp", "alertname", "severity"])
    return pd.concat(parts, ignore_index=True).sort_values("timestamp", kind="stable")


# ---------------------------------------------------------------- promtool unit tests


_TEMPLATE = re.compile(r"\{\{\s*\$(labels\.([a-zA-Z_][a-zA-Z0-9_]*)|value)\s*\}\}")


def expand(template: str, labels: Mapping[str, str], value: float) -> str:
    """Prometheus' annotation templating, for the two forms alerts.yaml uses."""

    def sub(m: re.Match[str]) -> str:
        return _fmt(value) if m.group(1) == "value" else str(labels.get(m.group(2), ""))

    return _TEMPLATE.sub(sub, template)


def promtool_tests(spec: Spec, cases: Any, rule_file: str) -> dict[str, Any]:
    """A `promtool test rules` document from hand-written cases (see tests/cases.yaml).

    Each case names an alert, its input series, an eval time and the alerts expected then
    (labels without severity/scope, plus `value` for the annotations; empty = stays quiet).
    """
    if not isinstance(cases, list):
        raise AlertsError("cases: expected a list")
    tests = []
    records = {r["record"] for r in spec.recording}
    for i, case in enumerate(cases):
        where = f"case {i} ({case.get('name', '?')})"
        if "record" in case:  # a recording rule: the samples it must produce
            if case["record"] not in records:
                raise AlertsError(f"{where}: no recording rule {case['record']!r}")
            tests.append(
                {
                    "name": f"{case['record']}: {_req(case, 'name', where)}",
                    "interval": case.get("interval", "1s"),
                    "input_series": _req(case, "series", where),
                    "promql_expr_test": [
                        {
                            "expr": case["record"],
                            "eval_time": _req(case, "eval_time", where),
                            "exp_samples": _req(case, "expect", where),
                        }
                    ],
                }
            )
            continue
        alert = spec.alert(_req(case, "alert", where))
        expected = []
        for exp in case.get("expect") or []:
            value = float(exp.get("value", 1))
            labels = {str(k): str(v) for k, v in exp.items() if k != "value"}
            if "signal" not in labels:
                if len(alert.conditions) != 1:
                    raise AlertsError(f"{where}: say which condition fires ('signal')")
                labels["signal"] = alert.conditions[0].signal
            labels |= {"severity": alert.severity, "scope": alert.scope}
            ann_labels = labels | {"alertname": alert.name}
            expected.append(
                {
                    "exp_labels": labels,
                    "exp_annotations": {
                        "summary": expand(alert.summary, ann_labels, value),
                        "description": expand(alert.description, ann_labels, value),
                        "runbook_url": spec.runbook_url(alert.name),
                    },
                }
            )
        tests.append(
            {
                "name": f"{alert.name}: {_req(case, 'name', where)}",
                "interval": case.get("interval", "1s"),
                "input_series": _req(case, "series", where),
                "alert_rule_test": [
                    {
                        "eval_time": _req(case, "eval_time", where),
                        "alertname": alert.name,
                        "exp_alerts": expected,
                    }
                ],
            }
        )
    return {"rule_files": [rule_file], "evaluation_interval": "1s", "tests": tests}


def dump_promtool_tests(spec: Spec, cases_path: str | Path, rule_file: str) -> str:
    try:
        cases = yaml.safe_load(Path(cases_path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise AlertsError(f"cannot read {cases_path}: {e}") from e
    body = yaml.dump(
        promtool_tests(spec, cases, rule_file), Dumper=_Dumper, sort_keys=False, width=100
    )
    return HEADER.replace("alertmanager/alerts.yaml", "alerts.yaml and tests/cases.yaml") + body

"""The alert conditions evaluated in-process over a recording-style frame (the benchmark and
the tuning notebooks): where each alert would fire, with Prometheus' `for` semantics."""

from __future__ import annotations

import numpy as np
import pandas as pd

from alertdsl.spec import OPS, Alert, Condition, Spec, duration_seconds, load


def _is_metric(col: str) -> bool:
    return col.startswith(("DCGM_", "goodput_"))


def label_mask(frame: pd.DataFrame, labels: tuple[tuple[str, str], ...]) -> pd.Series:
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
    rows = frame.loc[frame[c.metric].notna() & label_mask(frame, c.labels)]
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
    rows = frame.loc[frame[c.metric].notna() & label_mask(frame, c.labels)]
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
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if c.kind == "threshold" and c.by and not out.empty:
        # `max by`: one series per group (the job join adds job_id after it)
        keys = [*c.by, *(["job_id"] if c.join_job and "job_id" in labels else [])]
        out = out.groupby(["timestamp", *keys], dropna=False, as_index=False)["active"].any()
    return out


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

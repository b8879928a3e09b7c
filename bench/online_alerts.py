"""Goodput's alert conditions (alertmanager/alerts.yaml), evaluated online, one sample at a time.

The conditions are evaluated by `alertdsl.evaluation.evaluate` itself, over the recent history of
each metric source. Evaluating every alert over its whole window at every step would cost
seconds per simulated hour, so a cheap, conservative pre-check skips an alert at a step only
when none of its conditions can be active then (threshold: no current row passes; increase: no
matching series changed or appeared within window + for; gone: no series vanished within the
window). A skipped alert would not have fired: the result is the same as a full evaluation.

Sources (one wide frame per step each): `dcgm` (DCGM_* with node, gpu, job_id), `gpu_score`,
`job_score`, `node_score` (the detector's outputs), `log` (`goodput_log_pattern_matches_total`),
`xid` (`goodput_node_xid_errors_total`), `slurm_job`, `slurm_node`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from alertdsl import evaluation as E
from alertdsl import spec as A

SOURCE_OF = {
    "goodput_gpu_anomaly_score": "gpu_score",
    "goodput_job_anomaly_score": "job_score",
    "goodput_node_suspect_score": "node_score",
    "goodput_log_pattern_matches_total": "log",
    "goodput_node_xid_errors_total": "xid",
    "goodput_slurm_job_state": "slurm_job",
    "goodput_slurm_node_state": "slurm_node",
}


def source_of(metric: str) -> str | None:
    """Which source frame carries `metric` (None: not produced in-process)."""
    return "dcgm" if metric.startswith("DCGM_") else SOURCE_OF.get(metric)


@dataclass
class _Cond:
    alert: A.Alert
    cond: A.Condition
    source: str
    window_s: float
    for_s: float
    prev: dict[tuple, float] = field(default_factory=dict)  # increase: last value per series
    changed: dict[tuple, float] = field(default_factory=dict)  # increase: last change per series
    present: set[tuple] = field(default_factory=set)  # gone: keys reporting at the last step
    lost: dict[tuple, float] = field(default_factory=dict)  # gone: key -> last time seen
    last_t: float = -np.inf
    # the previous step's key columns and values, to skip unchanged steps cheaply
    arrays: tuple[np.ndarray, ...] = ()
    values: np.ndarray = field(default_factory=lambda: np.zeros(0))
    cols: list[str] = field(default_factory=list)  # the label columns of `keys`
    keys: set[tuple] = field(default_factory=set)  # series that may fire now


def _labels(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns if c != "timestamp" and not c.startswith(("DCGM_", "goodput_"))]


class OnlineAlerts:
    """Feed one frame per source per step with `add`; `firing(now)` lists alerts firing now."""

    def __init__(self, spec: A.Spec | None = None, interval_s: float = 5.0) -> None:
        self.spec = spec or A.load()
        self.interval_s = interval_s
        self.conds: list[_Cond] = []
        for alert in self.spec.alerts:
            for c in alert.conditions:
                src = source_of(c.metric) if c.evaluable else None
                if src is None:
                    continue  # raw PromQL on scrape health: not simulated in-process
                self.conds.append(
                    _Cond(
                        alert,
                        c,
                        src,
                        A.duration_seconds(c.window) if c.window else 0.0,
                        A.duration_seconds(c.for_ or alert.for_),
                    )
                )
        self.keep_s = max((c.window_s + c.for_s for c in self.conds), default=0.0)
        self.keep_s += 4 * interval_s
        self.hist: dict[str, deque[tuple[float, pd.DataFrame]]] = {}
        self.evaluations = 0
        self._cols: dict[str, list[str]] = {}
        self.skipped = 0

    def skipped_alerts(self) -> list[str]:
        """Alerts (or conditions) left out in-process: raw PromQL on scrape/service health."""
        done = {(c.alert.name, c.cond.signal) for c in self.conds}
        return [
            f"{a.name}/{c.signal}"
            for a in self.spec.alerts
            for c in a.conditions
            if (a.name, c.signal) not in done
        ]

    def add(self, now: float, frames: dict[str, pd.DataFrame]) -> None:
        for src, df in frames.items():
            h = self.hist.setdefault(src, deque())
            h.append((now, df))
            while h and h[0][0] < now - self.keep_s:
                h.popleft()

    # ---------------------------------------------------------------- the pre-check
    def _may_fire(self, c: _Cond, now: float) -> bool:
        """Whether `c` can be active now; sets `c.cols`/`c.keys` to the series that can."""
        h = self.hist.get(c.source)
        cur = h[-1][1] if h and h[-1][0] == now else None
        cond = c.cond
        c.keys = set()
        # a DCGM series is its GPU: rises are measured per GPU across hpc_job changes
        c.cols = self._cols_of(c)
        if c.source == "dcgm":
            c.cols = [k for k in c.cols if k != "job_id"]
        if cond.kind == "threshold" and cond.by:  # one series per group: its rows whatever else
            c.cols = [k for k in c.cols if k in cond.by]
        if cur is None or cond.metric not in cur or cur.empty:
            vals, mask = np.zeros(0), np.zeros(0, dtype=bool)
        else:
            vals = cur[cond.metric].to_numpy(dtype=float)
            mask = ~np.isnan(vals)
            if cond.labels:
                mask &= E.label_mask(cur, cond.labels).to_numpy()
            vals = vals[mask]
        n = len(vals)

        def col(name: str) -> np.ndarray:
            assert cur is not None  # noqa: S101 - only called when n > 0
            return cur[name].to_numpy()[mask]

        if cond.kind == "threshold":
            if not n:
                return False
            hit = (
                np.isin(vals, cond.values)
                if cond.op == "in"
                else A.OPS[cond.op](vals, cond.threshold)
            )
            if hit.any():
                c.keys = set(zip(*(col(k)[hit] for k in c.cols), strict=True))
            return bool(c.keys)
        if cond.kind == "increase":
            arrays = tuple(col(k) for k in c.cols) if n else ()
            if _same(arrays, c.arrays):  # same series in the same order: compare values
                idx = np.flatnonzero(vals != c.values)
            else:
                idx = np.arange(n)
            for i in idx:
                k = tuple(a[i] for a in arrays)
                old = c.prev.get(k)
                if (old is None and cond.new_series) or (old is not None and old != vals[i]):
                    c.changed[k] = now
                c.prev[k] = vals[i]
            c.arrays, c.values = arrays, vals
            horizon = now - (c.window_s + c.for_s + 2 * self.interval_s)
            for k in [k for k, t in c.changed.items() if t < horizon]:
                del c.changed[k]
            c.keys = set(c.changed)
            return bool(c.keys)
        # gone: a series (per `by`) seen within the window that does not report now
        by = list(cond.by)
        arrays = tuple(col(k) for k in by) if n else ()
        if not _same(arrays, c.arrays):
            present = set(zip(*arrays, strict=True)) if n else set()
            for k in c.present - present:
                c.lost[k] = c.last_t
            for k in present:
                c.lost.pop(k, None)
            c.present, c.arrays = present, arrays
        c.last_t = now
        for k in [k for k, t in c.lost.items() if now - t >= c.window_s]:
            del c.lost[k]
        if not c.lost:
            return False
        # the rows evaluate needs: the gone series' coarse group (while_present) or the series
        # themselves, plus one present series as the clock (while_any)
        cols = list(cond.while_present) or by
        c.cols = cols
        c.keys = {tuple(k[by.index(col)] for col in cols) for k in c.lost}
        if cond.while_any and c.present:
            k = min(c.present)
            c.keys.add(tuple(k[by.index(col)] for col in cols))
        return True

    def _cols_of(self, c: _Cond) -> list[str]:
        """The label columns of the source (from its latest non-empty frame; cached)."""
        cached = self._cols.get(c.source)
        if cached:
            return cached
        for _, df in reversed(self.hist.get(c.source, ())):
            if len(df):
                self._cols[c.source] = _labels(df)
                return self._cols[c.source]
        return []

    # ---------------------------------------------------------------- evaluation
    def firing(self, now: float) -> list[dict[str, Any]]:
        """Alerts firing at `now`: dicts of labels (alertname, severity, job_id, node, ...)."""
        todo: dict[tuple[str, str], list[_Cond]] = {}
        for c in self.conds:
            if self._may_fire(c, now):
                todo.setdefault((c.alert.name, c.source), []).append(c)
            else:
                self.skipped += 1
        out: list[dict[str, Any]] = []
        cat: dict[str, pd.DataFrame] = {}
        for (_, src), conds in todo.items():
            back = max(c.window_s + c.for_s for c in conds) + 3 * self.interval_s
            if src not in cat:
                deep = max(
                    c.window_s + c.for_s for cs in todo.values() for c in cs if c.source == src
                )
                parts = [
                    df
                    for t, df in self.hist.get(src, ())
                    if t >= now - deep - 3 * self.interval_s and len(df)
                ]
                cat[src] = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
            frame = cat[src]
            if frame.empty:
                continue
            keep = np.zeros(len(frame), dtype=bool)
            for c in conds:  # a superset of the candidate series: per-column membership
                part = np.ones(len(frame), dtype=bool)
                for i, col in enumerate(c.cols):
                    if col in frame:
                        vals = {k[i] for k in c.keys}
                        part &= frame[col].isin(vals).to_numpy()
                keep |= part
            keep &= (frame["timestamp"] >= now - back).to_numpy()
            metrics = {c.metric for a in [conds[0].alert] for c in a.conditions} & set(frame)
            cols = ["timestamp", *_labels(frame), *sorted(metrics)]
            sub = frame.loc[keep, cols]
            if sub.empty:
                continue
            self.evaluations += 1
            fired = E.evaluate(conds[0].alert, sub)
            if fired.empty:
                continue
            fired = fired[fired["timestamp"] == now]
            for row in fired.to_dict("records"):
                labels = {
                    k: _clean(v)
                    for k, v in row.items()
                    if k not in ("timestamp",) and _clean(v) not in (None, "")
                }
                out.append(labels)
        return out


def _same(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> bool:
    return len(a) == len(b) and all(
        len(x) == len(y) and bool((x == y).all()) for x, y in zip(a, b, strict=True)
    )


def _clean(v: Any) -> Any:
    if v is None:
        return None
    if isinstance(v, float):
        if np.isnan(v):
            return None
        return str(int(v)) if v.is_integer() else str(v)
    return str(v)

"""Threshold sweeps over scored recordings, the choice of the candidate to ship, and the
prediction of what the fault benchmark will show with it.

Figures per candidate: recall (faults whose job got an incident after onset), detection latency
(onset -> first firing, seconds), and false incidents per 1,000 GPU-hours (incidents on a job
outside its fault windows, over the GPU-hours the recordings' jobs ran).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from alertdsl import spec as A
from detector.tuning import Run, alerts_path, evaluate_runs, score_alerts, with_threshold


def by_kind(det: pd.DataFrame) -> pd.DataFrame:
    """Per fault kind: faults, detected, recall and median detection latency (s)."""
    g = det.groupby("kind", sort=True)
    return pd.DataFrame(
        {
            "faults": g.size(),
            "detected": g.detected.sum().astype(int),
            "recall": g.detected.mean(),
            "latency_median_s": g.latency_s.median(),
        }
    )


def summarise(det: pd.DataFrame, false: int, hours: float) -> dict[str, float]:
    lat = det.loc[det.detected, "latency_s"] if len(det) else pd.Series(dtype=float)
    return {
        "faults": len(det),
        "detected": int(det.detected.sum()) if len(det) else 0,
        "recall": float(det.detected.mean()) if len(det) else float("nan"),
        "latency_median_s": float(lat.median()) if len(lat) else float("nan"),
        "latency_max_s": float(lat.max()) if len(lat) else float("nan"),
        "false_incidents": false,
        "gpu_hours": hours,
        "false_per_1000_gpu_h": 1000.0 * false / hours if hours else float("nan"),
    }


def sweep(
    runs: Sequence[Run],
    alert_name: str,
    thresholds: Iterable[float],
    fors: Iterable[str] | None = None,
    spec: A.Spec | None = None,
    gap_s: float = 30.0,
) -> pd.DataFrame:
    """Recall, latency and false incidents per 1,000 GPU-hours for each (threshold, for)."""
    spec = spec or A.load(alerts_path())
    base = spec.alert(alert_name)
    rows = []
    for for_ in list(fors) if fors is not None else [base.for_]:
        A.duration_seconds(for_)
        for thr in thresholds:
            det, false, hours = evaluate_runs(runs, with_threshold(base, thr, for_), gap_s)
            rows.append({"alert": alert_name, "threshold": float(thr), "for": for_})
            rows[-1].update(summarise(det, false, hours))
    return pd.DataFrame(rows)


def choose(
    table: pd.DataFrame, max_false_per_1000_gpu_h: float = 0.0, guard: bool = True
) -> dict[str, Any]:
    """The candidate to ship. It must stay within the false-incident budget and, with `guard`,
    so must the next lower threshold swept with the same alert and `for` (a threshold just
    clear of a false alarm on this data is likely to meet one on the next; the lowest threshold
    swept has no guard and does not qualify). Among those: the highest recall, then the lowest
    median latency, then the lowest worst latency, then the highest threshold (most margin)."""
    table = table.reset_index(drop=True)
    fits = table.false_per_1000_gpu_h <= max_false_per_1000_gpu_h
    ok = table[fits & _guarded(table, fits)] if guard else table[fits]
    if ok.empty:
        raise ValueError(
            f"no candidate stays within {max_false_per_1000_gpu_h} false incidents per "
            f"1,000 GPU-hours{' with a guard band' if guard else ''} "
            f"(best: {table.false_per_1000_gpu_h.min():.1f})"
        )
    keys = {"_med": ok.latency_median_s, "_max": ok.get("latency_max_s", ok.latency_median_s)}
    ranked = ok.assign(**{k: v.fillna(np.inf) for k, v in keys.items()}).sort_values(
        ["recall", "_med", "_max", "threshold"],
        ascending=[False, True, True, False],
        kind="stable",
    )
    return dict(ranked.drop(columns=list(keys)).iloc[0])


def _guarded(table: pd.DataFrame, fits: pd.Series) -> pd.Series:
    """Per row: whether every row at the next lower distinct threshold of the same alert and
    `for` fits the budget too (False for the lowest threshold of each group)."""
    keys = [c for c in ("alert", "for") if c in table]
    group = table[keys].astype(str).agg("|".join, axis=1) if keys else pd.Series("", table.index)
    level = pd.DataFrame({"g": group, "t": table.threshold, "fits": fits})
    per = level.groupby(["g", "t"], sort=True).fits.all().reset_index()
    per["guard"] = per.groupby("g").fits.shift(1, fill_value=False).astype(bool)
    guard = level.merge(per[["g", "t", "guard"]], on=["g", "t"], how="left").guard
    return pd.Series(guard.to_numpy(dtype=bool), index=table.index)


def predict(
    runs: Sequence[Run], before: A.Spec, after: A.Spec, gap_s: float = 30.0
) -> dict[str, Any]:
    """What the fault benchmark should show when `after` replaces `before`: per fault kind the
    recall and median latency of the score alerts together (the earliest of them fires the
    incident), and false incidents per 1,000 GPU-hours, each before and after, with the
    direction of change ("down", "up" or "same")."""
    figures = {}
    for name, spec in (("before", before), ("after", after)):
        det, false, hours = evaluate_runs(runs, score_alerts(spec), gap_s)
        figures[name] = (by_kind(det), 1000.0 * false / hours if hours else None)
    (b, fb), (a, fa) = figures["before"], figures["after"]
    kinds = {
        str(k): {
            "faults": int(b.loc[k, "faults"]),
            **{
                f"{col}_{side}": _num(t.loc[k, col])
                for col in ("recall", "latency_median_s")
                for side, t in (("before", b), ("after", a))
            },
            "latency": direction(b.loc[k, "latency_median_s"], a.loc[k, "latency_median_s"]),
            "recall": direction(b.loc[k, "recall"], a.loc[k, "recall"]),
        }
        for k in b.index
    }
    return {
        "by_kind": kinds,
        "false_per_1000_gpu_h": {"before": fb, "after": fa, "direction": direction(fb, fa)},
        "gpu_hours": sum(r.gpu_hours for r in runs),
        "recordings": [r.name for r in runs],
    }


def _num(x: Any) -> float | None:
    return None if pd.isna(x) else float(x)


def direction(before: Any, after: Any) -> str:
    """The change from `before` to `after`: "down", "up" or "same" (a missing figure, None or
    NaN, counts as infinitely late)."""
    b = np.inf if before is None or pd.isna(before) else float(before)
    a = np.inf if after is None or pd.isna(after) else float(after)
    return "same" if a == b else ("down" if a < b else "up")

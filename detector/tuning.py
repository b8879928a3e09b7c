"""Threshold tuning over recordings: score, fire the alert conditions, sweep, write back.

The alert conditions come from the one source (`alertmanager/alerts.yaml`, through
`alertdsl`), so a sweep measures what production would alert on: the detector's scores
become the `goodput_*_score` series the rules read, `alertdsl.evaluation.evaluate` fires them with
a candidate threshold and `for`, firings become incidents (one per job while it keeps firing),
and incidents are matched against the recording's ground truth.

Figures per candidate: recall (faults whose job got an incident after onset), detection latency
(onset -> first firing, seconds), and false incidents per 1,000 GPU-hours (incidents on a job
outside its fault windows, over the GPU-hours the recordings' jobs ran).

>>> import pandas as pd
>>> fired = pd.DataFrame({"timestamp": [0, 5, 10, 100], "job_id": ["1"] * 4})
>>> incidents(fired, gap_s=30).start.tolist()
[0.0, 100.0]
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from alertdsl import evaluation as E
from alertdsl import spec as A
from alertdsl.rules import dump_rules
from detector.frame import Frame
from detector.pipeline import Config, Engine
from detector.replay import load, steps

JOB_SCORE = "goodput_job_anomaly_score"
NODE_SCORE = "goodput_node_suspect_score"
GPU_SCORE = "goodput_gpu_anomaly_score"
SCORE_METRICS = (JOB_SCORE, NODE_SCORE, GPU_SCORE)
ALERTS_ENV = A.PATH_ENV
alerts_path = A.configured_path  # `$GOODPUT_ALERTS_FILE`, else the project's alerts.yaml


# ------------------------------------------------------------------------------ scoring


@dataclass
class Run:
    """One recording scored by the engine: score series as Prometheus would hold them."""

    name: str
    path: Path
    meta: dict[str, Any]
    truth: dict[str, Any]
    frame: Frame
    jobs: pd.DataFrame  # timestamp, job_id, detector, goodput_job_anomaly_score
    nodes: pd.DataFrame  # timestamp, job_id, node, goodput_node_suspect_score
    gpus: pd.DataFrame  # timestamp, job_id, node, gpu, detector, goodput_gpu_anomaly_score
    interval_s: float

    @property
    def gpu_hours(self) -> float:
        """GPU-hours of running jobs in the recording (rows with a job x interval)."""
        return float((self.frame.job != "").sum() * self.interval_s / 3600.0)

    @cached_property
    def gpu_combined(self) -> pd.DataFrame:
        """The GPU score as the service exposes it: one series per GPU, the max over
        detectors (detector/exposition.py); `gpus` keeps each detector for the plots."""
        keys = ["timestamp", "job_id", "node", "gpu"]
        if "detector" not in self.gpus.columns:
            return self.gpus
        return self.gpus.groupby(keys, sort=False)[GPU_SCORE].max().reset_index()

    def series(self, metric: str) -> pd.DataFrame:
        return {JOB_SCORE: self.jobs, NODE_SCORE: self.nodes, GPU_SCORE: self.gpu_combined}[metric]

    def windows(self) -> pd.DataFrame:
        return fault_windows(self.meta, self.truth)


def score_recording(path: str | Path, cfg: Config | None = None) -> Run:
    """Replay the detector engine over a recording directory and keep every score."""
    p = Path(path)
    frame, names, interval = load(p)
    meta = _read_json(p / "meta.json")
    truth = _read_json(p / "truth.json")
    if cfg is None:
        cfg = Config(interval_s=interval or Config().interval_s)
    engine = Engine(cfg)
    jobs, nodes, gpus = [], [], []
    for sub, now, res in steps(frame, names, engine):
        jobs.append(res.jobs.assign(timestamp=now))
        nodes.append(res.nodes.assign(timestamp=now))
        on = sub.job != ""
        if on.any():
            g = pd.DataFrame(res.gpu[on], columns=list(res.detectors))
            g["job_id"], g["node"], g["gpu"] = sub.job[on], sub.node[on], sub.gpu[on].astype(str)
            gpus.append(g.assign(timestamp=now))
    job_df = _concat(jobs, ["timestamp", "job_id", "detector", "score"])
    node_df = _concat(nodes, ["timestamp", "job_id", "node", "score"])
    gpu_df = _concat(gpus, ["timestamp", "job_id", "node", "gpu"])
    gpu_long = gpu_df.melt(
        id_vars=["timestamp", "job_id", "node", "gpu"], var_name="detector", value_name="score"
    )
    return Run(
        name=str(meta.get("scenario") or p.name),
        path=p,
        meta=meta,
        truth=truth,
        frame=frame,
        jobs=job_df[["timestamp", "job_id", "detector", "score"]].rename(
            columns={"score": JOB_SCORE}
        ),
        nodes=node_df[["timestamp", "job_id", "node", "score"]].rename(
            columns={"score": NODE_SCORE}
        ),
        gpus=gpu_long.rename(columns={"score": GPU_SCORE}),
        interval_s=float(cfg.interval_s),
    )


def _concat(parts: list[pd.DataFrame], cols: list[str]) -> pd.DataFrame:
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)


def _read_json(p: Path) -> dict[str, Any]:
    if not p.exists():
        return {}
    doc = json.loads(p.read_text())
    if not isinstance(doc, dict):
        raise ValueError(f"{p}: expected a JSON object")
    return doc


def fault_windows(meta: dict[str, Any], truth: dict[str, Any]) -> pd.DataFrame:
    """One row per (fault, job): onset, end (the job's end, else the recording's), kind,
    culprit nodes. A fault lasts until its job ends: what follows onset is not a false alarm."""
    ends = {str(j["job_id"]): j.get("end") for j in meta.get("jobs", [])}
    rec_end = float(meta.get("end") or np.inf)
    rows = []
    for f in truth.get("faults", []):
        for job in f.get("job_ids") or ([f["job_id"]] if f.get("job_id") else []):
            end = ends.get(str(job))
            rows.append(
                {
                    "fault_id": f.get("fault_id", ""),
                    "kind": f["kind"],
                    "job_id": str(job),
                    "onset": float(f["onset"]),
                    "end": float(end) if end else rec_end,
                    "nodes": tuple(f.get("nodes") or ()),
                    "outcome": f.get("outcome", ""),
                }
            )
    cols = ["fault_id", "kind", "job_id", "onset", "end", "nodes", "outcome"]
    return pd.DataFrame(rows, columns=cols)


# ------------------------------------------------------------------------------ alerts


def score_condition(alert: A.Alert) -> A.Condition:
    """The alert's condition on a detector score (the one a threshold sweep moves)."""
    for c in alert.conditions:
        if c.kind == "threshold" and c.metric in SCORE_METRICS and c.threshold is not None:
            return c
    raise A.AlertsError(f"alert {alert.name} has no threshold condition on a detector score")


def with_threshold(alert: A.Alert, threshold: float, for_: str | None = None) -> A.Alert:
    """A copy of `alert` whose score condition uses `threshold` (and the alert `for_`)."""
    cond = score_condition(alert)
    new = dataclasses.replace(cond, threshold=float(threshold))
    conds = tuple(new if c is cond else c for c in alert.conditions)
    return dataclasses.replace(alert, conditions=conds, for_=for_ or alert.for_)


def fire(run: Run, alert: A.Alert) -> pd.DataFrame:
    """Where `alert` fires over the run's score series (alertdsl.evaluation.evaluate)."""
    cond = score_condition(alert)
    series = run.series(cond.metric)
    if cond.op in (">", ">=") and len(series):  # a series that never crosses cannot fire
        labels = [c for c in series.columns if c not in ("timestamp", cond.metric)]
        peak = series.groupby(labels, sort=False)[cond.metric].transform("max")
        series = series[A.OPS[cond.op](peak, cond.threshold)]
    return E.evaluate(alert, series)


def incidents(fired: pd.DataFrame, gap_s: float = 30.0) -> pd.DataFrame:
    """Firing rows -> incidents per job: a new incident after `gap_s` without firing."""
    cols = ["job_id", "start", "end"]
    if fired.empty:
        return pd.DataFrame(columns=cols)
    out = []
    for job, g in fired.groupby("job_id", sort=True):
        t = np.unique(g["timestamp"].to_numpy(dtype=float))
        cut = np.flatnonzero(np.diff(t) > gap_s) + 1
        for seg in np.split(t, cut):
            out.append({"job_id": str(job), "start": float(seg[0]), "end": float(seg[-1])})
    return pd.DataFrame(out, columns=cols)


def match(inc: pd.DataFrame, windows: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """(per-fault detection with latency_s, number of false incidents).

    A fault is detected by the first incident of its job that starts in [onset, end]; an
    incident is false when no fault window of its job contains its start."""
    det = windows.copy()
    det["latency_s"] = np.nan
    false = 0
    for row in inc.itertuples():
        w = windows[(windows.job_id == row.job_id)]
        inside = (w.onset <= row.start) & (row.start <= w.end)
        if not inside.any():
            false += 1
    for i, w in windows.iterrows():
        hit = inc[(inc.job_id == w.job_id) & (inc.start >= w.onset) & (inc.start <= w.end)]
        if len(hit):
            det.loc[i, "latency_s"] = float(hit.start.min() - w.onset)
    det["detected"] = det["latency_s"].notna()
    return det, false


# ------------------------------------------------------------------------------ sweep


def evaluate_runs(
    runs: Sequence[Run], alerts: A.Alert | Sequence[A.Alert], gap_s: float = 30.0
) -> tuple[pd.DataFrame, int, float]:
    """(per-fault detections over all runs, false incidents, GPU-hours) for one alert, or for
    several together: their firings merge into one incident per job, as the receiver groups
    them, so a fault's latency is that of the first of them to fire."""
    group = [alerts] if isinstance(alerts, A.Alert) else list(alerts)
    dets, false, hours = [], 0, 0.0
    for run in runs:
        fired = [f for f in (fire(run, a) for a in group) if len(f)]
        inc = incidents(pd.concat(fired, ignore_index=True) if fired else pd.DataFrame(), gap_s)
        d, f = match(inc, run.windows())
        dets.append(d.assign(run=run.name))
        false += f
        hours += run.gpu_hours
    det = pd.concat(dets, ignore_index=True) if dets else pd.DataFrame()
    return det, false, hours


def score_alerts(spec: A.Spec) -> list[A.Alert]:
    """The alerts of `spec` that read a detector score (the ones a sweep can tune)."""
    out = []
    for a in spec.alerts:
        try:
            score_condition(a)
        except A.AlertsError:
            continue
        out.append(a)
    return out


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


# ------------------------------------------------------------------------------ write back

_NAME_LINE = re.compile(r"^(\s*)- name:\s*(\S+)\s*$")


def _set_key(lines: list[str], lo: int, hi: int, indent: int, key: str, value: str) -> bool:
    """Replace `key: ...` at exactly `indent` spaces within lines[lo:hi]; False if absent."""
    pat = re.compile(rf"^ {{{indent}}}{re.escape(key)}:\s*(\S.*?)?(\s+#.*)?$")
    for i in range(lo, hi):
        m = pat.match(lines[i])
        if m:
            lines[i] = f"{' ' * indent}{key}: {value}{m.group(2) or ''}"
            return True
    return False


def _block(lines: list[str], name: str) -> tuple[int, int, int]:
    """(first line, end, indent) of the `- name: NAME` entry."""
    found = [
        (i, len(m.group(1)))
        for i, ln in enumerate(lines)
        if (m := _NAME_LINE.match(ln)) and m.group(2) == name
    ]
    if len(found) != 1:
        raise ValueError(f"alert {name} is not a single `- name:` entry in the file")
    lo, ind = found[0]
    for i in range(lo + 1, len(lines)):
        ln = lines[i]
        if not ln.strip() or ln.lstrip().startswith("#"):
            continue
        if len(ln) - len(ln.lstrip()) <= ind:
            return lo, i, ind
    return lo, len(lines), ind


def _decimal(x: float) -> str:
    """Fixed-point text YAML reads back as the same float: 1.0, 1.25, 0.000001."""
    text = f"{x:.6f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def set_thresholds(text: str, changes: dict[str, dict[str, Any]]) -> str:
    """alerts.yaml text with new `threshold` (score condition) and `for` (alert) values.

    `changes` = {alert name: {"threshold": float, "for": "30s"}} (either key optional). The
    edit is textual so comments and layout survive; the result is validated and checked to
    differ from the input only in the requested values.
    """
    lines = text.splitlines()
    before = A.parse(yaml.safe_load(text))
    for name, change in changes.items():
        unknown = set(change) - {"threshold", "for"}
        if unknown:
            raise ValueError(f"{name}: only 'threshold' and 'for' can be tuned, not {unknown}")
        cond = score_condition(before.alert(name))
        lo, hi, ind = _block(lines, name)
        if "for" in change:
            A.duration_seconds(str(change["for"]))
            if not _set_key(lines, lo + 1, hi, ind + 2, "for", str(change["for"])):
                raise ValueError(f"alert {name}: no `for:` line to change")
        if "threshold" in change:
            thr = float(change["threshold"])
            if not 1e-6 <= thr <= 1e6:
                raise ValueError(f"alert {name}: threshold must be within 1e-6..1e6, not {thr}")
            sig = next(
                (
                    i
                    for i in range(lo, hi)
                    if re.match(rf"^\s*signal:\s*{re.escape(cond.signal)}\s*$", lines[i])
                ),
                None,
            )
            if sig is None:
                raise ValueError(f"alert {name}: cannot find condition signal {cond.signal}")
            c_lo = max(i for i in range(lo + 1, sig + 1) if lines[i].lstrip().startswith("- "))
            c_ind = len(lines[c_lo]) - len(lines[c_lo].lstrip()) + 2
            c_hi = next((i for i in range(sig + 1, hi) if lines[i].lstrip().startswith("- ")), hi)
            if not _set_key(lines, c_lo, c_hi, c_ind, "threshold", _decimal(thr)):
                raise ValueError(f"alert {name}: no `threshold:` line in its score condition")
    out = "\n".join(lines) + ("\n" if text.endswith("\n") else "")
    after = A.parse(yaml.safe_load(out))
    if after.recording != before.recording or len(after.alerts) != len(before.alerts):
        raise ValueError("the edit changed more than asked (refusing)")
    for a in before.alerts:
        want = a
        if a.name in changes:
            ch = changes[a.name]
            new_thr = ch.get("threshold", score_condition(a).threshold)
            want = with_threshold(a, float(new_thr or 0.0), ch.get("for"))
        if after.alert(a.name) != want:
            raise ValueError(f"alert {a.name}: the edit changed more than asked (refusing)")
    return out


def write_thresholds(
    changes: dict[str, dict[str, Any]],
    path: str | Path | None = None,
    rules_path: str | Path | None = None,
) -> dict[str, Path]:
    """Write tuned values into the alert conditions file and regenerate its rule file.

    `path` defaults to `alerts_path()`; `rules_path` to `rules/goodput.yml` next to it (what
    `goodput rules generate` writes for the project's file). Returns the paths written.
    """
    src = Path(path) if path else alerts_path()
    new = set_thresholds(src.read_text(), changes)
    tmp = src.with_suffix(".tmp")
    tmp.write_text(new)
    tmp.replace(src)
    rules = Path(rules_path) if rules_path else src.parent / "rules" / "goodput.yml"
    rules.parent.mkdir(parents=True, exist_ok=True)
    rules.write_text(dump_rules(A.load(src)))
    return {"alerts": src, "rules": rules}


# ------------------------------------------------------------------------------ prediction


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

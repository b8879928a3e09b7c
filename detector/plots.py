"""Plots for the tuning notebooks (matplotlib, the optional `notebooks` extra).

Every function takes plain data (a `tuning.Run`, a sweep table, a diagnosis dict, a recording
frame), draws on a new figure and returns it. Times are minutes since the recording's start.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from detector.frame import Frame

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from detector.tuning import Run


def _plt() -> Any:
    try:
        import matplotlib

        matplotlib.use(matplotlib.get_backend())  # keep the notebook's inline backend
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the extra
        raise ImportError("plots need matplotlib: pip install 'goodput[notebooks]'") from exc
    return plt


def _minutes(t: np.ndarray | pd.Series | float, t0: float) -> Any:
    return (t - t0) / 60.0


def score_timelines(
    run: Run, threshold: float = 1.0, detector: str | None = None, title: str = ""
) -> Figure:
    """Each GPU's score over time, one panel per job, fault windows shaded.

    The GPU score is the max over detectors (or one `detector`); culprit GPUs from the ground
    truth are drawn thick and red, the others thin and grey.
    """
    plt = _plt()
    g = run.gpus if detector is None else run.gpus[run.gpus.detector == detector]
    g = g.groupby(["timestamp", "job_id", "node", "gpu"], sort=True).max(numeric_only=True)
    g = g.reset_index()
    jobs = sorted(g.job_id.unique())
    t0 = float(run.meta.get("start", g.timestamp.min() if len(g) else 0.0))
    windows = run.windows()
    culprits = {
        (c["node"], str(c["gpu"])) for f in run.truth.get("faults", []) for c in f.get("gpus", [])
    }
    fig, axes = plt.subplots(len(jobs) or 1, 1, figsize=(9, 2.6 * max(len(jobs), 1)), sharex=True)
    axes = np.atleast_1d(axes)
    names = {str(j["job_id"]): j.get("name", "") for j in run.meta.get("jobs", [])}
    for ax, job in zip(axes, jobs, strict=False):
        for (node, gpu), s in g[g.job_id == job].groupby(["node", "gpu"]):
            bad = (node, gpu) in culprits
            ax.plot(
                _minutes(s.timestamp, t0),
                s[s.columns[-1]],
                color="tab:red" if bad else "0.6",
                lw=2.0 if bad else 0.7,
                label=f"{node} GPU {gpu} (culprit)" if bad else None,
                zorder=3 if bad else 2,
            )
        for w in windows[windows.job_id == job].itertuples():
            ax.axvspan(_minutes(w.onset, t0), _minutes(w.end, t0), color="tab:orange", alpha=0.15)
            ax.text(_minutes(w.onset, t0), threshold * 1.05, f" {w.kind}", fontsize=8)
        ax.axhline(threshold, color="k", ls="--", lw=0.8, label=f"threshold {threshold:g}")
        ax.set_ylabel("score (1 = alert)")
        ax.set_title(f"job {job} {names.get(job, '')}", fontsize=10, loc="left")
        ax.legend(loc="upper left", fontsize=8)
    axes[-1].set_xlabel("time since recording start (min)")
    fig.suptitle(title or f"{run.name}: GPU scores ({detector or 'max over detectors'})")
    fig.tight_layout()
    return fig


def tradeoff(
    table: pd.DataFrame, current: float | None = None, chosen: float | None = None
) -> Figure:
    """Recall, detection latency and false incidents per 1,000 GPU-hours against threshold."""
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2), sharex=True)
    t = table.sort_values("threshold")
    panels = [
        ("recall", "recall (fraction of faults)", (0, 1.05)),
        ("latency_median_s", "median detection latency (s)", None),
        ("false_per_1000_gpu_h", "false incidents / 1,000 GPU-h", None),
    ]
    for ax, (col, label, ylim) in zip(axes, panels, strict=True):
        for for_, s in t.groupby("for", sort=False):
            ax.plot(s.threshold, s[col], marker="o", ms=3, label=f"for {for_}")
        if ylim:
            ax.set_ylim(*ylim)
        ax.set_ylabel(label)
        ax.set_xlabel("score threshold")
        for x, style, name in ((current, ":", "current"), (chosen, "-", "chosen")):
            if x is not None:
                ax.axvline(x, color="k", ls=style, lw=1, label=f"{name} {x:g}")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{t.alert.iloc[0] if 'alert' in t and len(t) else ''}: threshold trade-off")
    fig.tight_layout()
    return fig


def culprit_vs_peers(
    frame: Frame,
    job_id: str,
    culprits: Sequence[tuple[str, str]],
    fields: Sequence[tuple[str, str]],
    t0: float,
    onset: float | None = None,
) -> Figure:
    """For each (field, unit): the culprit GPUs' series against the job's other GPUs
    (median and 10-90 % band)."""
    plt = _plt()
    on = frame.job == job_id
    sub = frame.take(np.flatnonzero(on))
    bad = {(n, str(g)) for n, g in culprits}
    is_bad = np.array([(n, str(g)) in bad for n, g in zip(sub.node, sub.gpu, strict=True)])
    fig, axes = plt.subplots(len(fields), 1, figsize=(9, 2.3 * len(fields)), sharex=True)
    axes = np.atleast_1d(axes)
    for ax, (field, unit) in zip(axes, fields, strict=True):
        v = sub.col(field)
        peers = pd.DataFrame({"t": sub.time[~is_bad], "v": v[~is_bad]}).groupby("t")["v"]
        q = peers.quantile([0.1, 0.5, 0.9]).unstack()
        if len(q):
            m = _minutes(q.index.to_numpy(), t0)
            ax.fill_between(m, q[0.1], q[0.9], color="0.8", label="peers 10-90 %")
            ax.plot(m, q[0.5], color="0.4", lw=1, label="peers median")
        for node, gpu in sorted(bad):
            k = (sub.node == node) & (sub.gpu.astype(str) == gpu)
            ax.plot(
                _minutes(sub.time[k], t0), v[k], color="tab:red", lw=1.6, label=f"{node} GPU {gpu}"
            )
        if onset is not None:
            ax.axvline(_minutes(onset, t0), color="tab:orange", ls="--", lw=1, label="onset")
        ax.set_ylabel(f"{field.replace('DCGM_FI_', '')}\n({unit})", fontsize=8)
        ax.legend(loc="upper left", fontsize=7)
    axes[-1].set_xlabel("time since recording start (min)")
    fig.suptitle(f"job {job_id}: culprit against its peers")
    fig.tight_layout()
    return fig


def symptom_timeline(diagnosis: dict[str, Any], t0: float) -> Figure:
    """The diagnosis' symptoms (initiating vs cascade) and evidence items on one time axis."""
    plt = _plt()
    sym = [s for s in diagnosis.get("symptoms", []) if s.get("first_seen") is not None]
    ev = [e for e in diagnosis.get("evidence", []) if e.get("time") is not None]
    rows = [(s["id"], s["first_seen"], s["role"], s["source"]) for s in sym]
    fig, ax = plt.subplots(figsize=(9, 0.45 * max(len(rows), 2) + 1.6))
    colors = {"initiating": "tab:red", "cascade": "tab:blue"}
    for i, (sid, t, role, src) in enumerate(sorted(rows, key=lambda r: r[1])):
        ax.scatter(_minutes(t, t0), i, color=colors.get(role, "k"), s=40, zorder=3)
        ax.annotate(f" {sid} ({src}, {role})", (_minutes(t, t0), i), fontsize=8, va="center")
    for e in ev:
        ax.axvline(_minutes(e["time"], t0), color="0.85", lw=0.8, zorder=1)
    if diagnosis.get("onset"):
        ax.axvline(_minutes(diagnosis["onset"], t0), color="tab:orange", ls="--", label="onset")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_yticks([])
    ax.set_xlabel("time since recording start (min); grey lines: evidence items")
    ax.set_title(f"{diagnosis.get('outcome')}: symptoms in order of first sight", fontsize=10)
    fig.tight_layout()
    return fig


def baseline_profiles(table: pd.DataFrame, fields: Sequence[str]) -> Figure:
    """Baseline median +- scale per session (one panel per field); `table` from
    `detector.baseline_history.baseline_table` over several sessions (column `session`)."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(fields), figsize=(3.0 * len(fields), 3.0))
    axes = np.atleast_1d(axes)
    for ax, field in zip(axes, fields, strict=True):
        s = table[table.field == field]
        for mode, color, dx in (("busy", "tab:blue", -0.1), ("idle", "tab:green", 0.1)):
            x = np.arange(len(s)) + dx
            ax.errorbar(
                x,
                s[f"{mode}_median"],
                yerr=s[f"{mode}_scale"],
                fmt="o",
                color=color,
                capsize=3,
                label=mode,
            )
        ax.set_xticks(np.arange(len(s)), [str(v) for v in s.session], fontsize=8)
        ax.set_title(field.replace("DCGM_FI_", ""), fontsize=9)
        ax.set_xlabel("session (requeue)")
        ax.set_ylabel(s.unit.iloc[0] if len(s) else "")
    axes[0].legend(fontsize=8)
    fig.suptitle("learned baseline per session: median +- one robust sigma")
    fig.tight_layout()
    return fig

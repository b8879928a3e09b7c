"""Aggregating scored fault-benchmark runs: per kind, overall, false incidents, targets."""

from __future__ import annotations

from typing import Any

import numpy as np

TARGETS = {
    "latency_p50_s": 15.0,
    "latency_p95_s": 45.0,
    "culprit_precision": 0.95,
    "culprit_recall": 0.95,
    "outcome_accuracy": 0.95,
    "action_accuracy": 0.95,
    "destructive_false_actions": 0,
    "false_incidents_per_1000_gpu_hours": 0.02,
}


def _pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 1) if xs else None


def _poisson_upper(k: int, n_hours: float) -> float | None:
    """One-sided 95 % upper bound of a rate, per 1,000 GPU-hours (k = 0: 3/N)."""
    if n_hours <= 0:
        return None
    from scipy.stats import chi2

    upper = float(chi2.ppf(0.95, 2 * (k + 1)) / 2.0)
    return round(1000.0 * upper / n_hours, 3)


def culprit_ok(f: dict[str, Any]) -> bool:
    """The nodes the diagnosis named are exactly the truth's: none where it names none."""
    return set(f.get("nodes") or []) == set(f["truth"]["nodes"])


def _group(faults: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(faults)
    det = [f for f in faults if f["detected"]]
    lat = [f["latency_s"] for f in det]
    culprit = [f for f in faults if f["truth"]["nodes"]]
    tp = fp = fn = 0
    for f in faults:  # a node named where the truth names none is a false positive too
        truth, got = set(f["truth"]["nodes"]), set(f.get("nodes") or [])
        tp += len(truth & got)
        fp += len(got - truth)
        fn += len(truth - got)
    ttr = [f["time_to_recover_s"] for f in faults if f.get("time_to_recover_s") is not None]
    lost = [f["gpu_hours_lost"] for f in faults if f.get("gpu_hours_lost") is not None]
    return {
        "faults": n,
        "detected": len(det),
        "latency_p50_s": _pct(lat, 50),
        "latency_p95_s": _pct(lat, 95),
        "outcome_accuracy": round(sum(bool(f.get("outcome_ok")) for f in faults) / n, 3)
        if n
        else None,
        "action_accuracy": round(sum(bool(f.get("action_ok")) for f in faults) / n, 3)
        if n
        else None,
        "culprit_faults": len(culprit),
        "culprit_precision": round(tp / (tp + fp), 3) if tp + fp else None,
        "culprit_recall": round(tp / (tp + fn), 3) if tp + fn else None,
        "time_to_recover_p50_s": _pct(ttr, 50),
        "time_to_recover_n": len(ttr),
        "gpu_hours_lost_mean": round(float(np.mean(lost)), 3) if lost else None,
        "gpu_hours_lost_total": round(float(np.sum(lost)), 3) if lost else None,
    }


def summarize(runs: list[dict[str, Any]], by: str = "kind") -> dict[str, Any]:
    """Per `by` (the fault kind, or the scenario for the cold-start rows) and overall."""
    faults = [
        f | {"scenario": r["run"]["scenario"], "run": r["run"]} for r in runs for f in r["faults"]
    ]
    kinds = sorted({f[by] for f in faults})
    per_kind = {k: _group([f for f in faults if f[by] == k]) for k in kinds}
    incidents = [i | {"scenario": r["scenario"]} for r in runs for i in r["incidents"]]
    false = [i for i in incidents if i["class"] == "false"]
    repeat = [i for i in incidents if i["class"] == "repeat"]
    hours = sum(r["healthy_gpu_hours"] for r in runs)
    for k in kinds:
        per_kind[k]["repeat_incidents"] = sum(
            1
            for r in runs
            for i in r["incidents"]
            if i["class"] == "repeat"
            and any(
                (r["run"]["scenario"] if by == "scenario" else f["kind"]) == k for f in r["faults"]
            )
        )
    overall = _group(faults)
    overall["repeat_incidents"] = len(repeat)
    overall["repeat_destructive_actions"] = sum(i["destructive"] for i in repeat)
    fi = {
        "false_incidents": len(false),
        "healthy_gpu_hours": round(hours, 1),
        "per_1000_gpu_hours": round(1000.0 * len(false) / hours, 3) if hours else None,
        "upper95_per_1000_gpu_hours": _poisson_upper(len(false), hours),
        "destructive_false_actions": sum(i["destructive"] for i in false),
        "by_alert": _count([a for i in false for a in i["alerts"]]),
        "by_action": _count([str(i["action"]) for i in false]),
    }
    checks = {
        "latency_p50_s": (overall["latency_p50_s"], "<="),
        "latency_p95_s": (overall["latency_p95_s"], "<="),
        "culprit_precision": (overall["culprit_precision"], ">="),
        "culprit_recall": (overall["culprit_recall"], ">="),
        "outcome_accuracy": (overall["outcome_accuracy"], ">="),
        "action_accuracy": (overall["action_accuracy"], ">="),
        "destructive_false_actions": (fi["destructive_false_actions"], "<="),
        "false_incidents_per_1000_gpu_hours": (fi["upper95_per_1000_gpu_hours"], "<="),
    }
    targets = {}
    for name, (value, op) in checks.items():
        target = TARGETS[name]
        met = None if value is None else (value <= target if op == "<=" else value >= target)
        targets[name] = {"target": f"{op} {target}", "measured": value, "met": met}
    misses = [
        {
            "scenario": f["scenario"],
            "seed": f["run"]["seed"],
            "job_nodes": f["run"]["job_nodes"],
            "kind": f["kind"],
            "detected": f["detected"],
            "latency_s": f.get("latency_s"),
            "expected": f"{f['truth']['outcome']} / {f['truth']['action']} / {f['truth']['nodes']}",
            "got": f"{f.get('outcome')} / {f.get('effective_action')} / {f.get('nodes')}",
            "first_alerts": f.get("first_alerts"),
            "reasons": f.get("reasons"),
        }
        for f in faults
        if not (f.get("outcome_ok") and f.get("action_ok")) or not culprit_ok(f)
    ]
    return {
        "per_kind": per_kind,
        "overall": overall,
        "false_incidents": fi,
        "targets": targets,
        "misses": misses,
        "false_incident_list": [
            {
                k: i[k]
                for k in (
                    "scenario",
                    "job_id",
                    "opened_at",
                    "alerts",
                    "outcome",
                    "action",
                    "result",
                )
            }
            for i in false
        ][:50],
    }


def _count(xs: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in xs:
        out[x] = out.get(x, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))

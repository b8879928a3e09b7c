"""Scoring one fault-benchmark run against the simulator's ground truth (`cluster.faults`)."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from bench.faults_plan import RunSpec

DESTRUCTIVE = ("drain", "drain_and_requeue", "stop", "requeue")


def first_incident(h: Any, f: dict[str, Any]) -> Any:
    jobs = set(f.get("job_ids") or [f.get("job_id")]) - {None}
    job_nodes = _fault_nodes(h, f)
    for inc in h.incidents:
        if inc.opened_at < f["onset"]:
            continue
        if inc.job_id in jobs or (inc.job_id is None and inc.node in job_nodes):
            return inc
    return None


def _fault_nodes(h: Any, f: dict[str, Any]) -> set[str]:
    """Nodes a fault shows on: its jobs' nodes; every node for a shared-filesystem stall."""
    c = h.sim.cluster
    if f.get("job_ids") is not None:
        return set(c.nodes)
    job = c.jobs.get(f.get("job_id") or "")
    return set(job.ever_nodes) if job else set(f.get("nodes") or [])


def _drained_at(h: Any, f: dict[str, Any]) -> float | None:
    """When the simulator's scheduler first drained a culprit node of `f` after its onset
    (the drain verb as it ran, whoever asked for it); None if it never did."""
    times = [
        t for t, verb, node in h.sim.cluster.verbs
        if verb == "drain" and node in f["nodes"] and t >= f["onset"]
    ]  # fmt: skip
    return min(times, default=None)


def _gpus_at(h: Any, job_id: str, t: float) -> int:
    return next((g for s, g in reversed(h.running.get(job_id, [])) if s <= t), 0)


def _iteration_at(points: list[tuple[float, float]], t: float) -> float | None:
    before = [i for s, i in points if s <= t]
    return before[-1] if before else None


def _lost_gpu_hours(h: Any, f: dict[str, Any], inc: Any, end: float) -> float | None:
    """GPU-hours the fault cost the job: the work it did not do since onset (restart kinds),
    or the GPU time burnt until Goodput stopped it / it ended (stop, hold_for_person)."""
    job_id = f.get("job_id")
    if not job_id:
        return None
    job = h.sim.cluster.jobs[job_id]
    gpus = _gpus_at(h, job_id, f["onset"])
    onset = f["onset"]
    if f["action"] in ("stop", "hold_for_person"):
        # what the simulator saw the job hold after onset: until it ended, or until the
        # action that stopped it ran (not when its incident opened), and every later run a
        # wrong restart gave it (a cause that persists fails it again)
        held = sum(
            g * max(0.0, min(e if e is not None else end, end) - max(s, onset))
            for s, e, g in h.runs.get(job_id, [])
        )
        return held / 3600.0
    pts = h.iters.get(job_id, [])
    pre = [(t, i) for t, i in pts if onset - 300.0 <= t <= onset]
    if len(pre) < 2 or pre[-1][0] <= pre[0][0]:
        return None
    rate = (pre[-1][1] - pre[0][1]) / (pre[-1][0] - pre[0][0])
    at_onset = _iteration_at(pts, onset)
    now_iter = job.iteration if job.state == "RUNNING" else float(job.ckpt_iter)
    if rate <= 0 or at_onset is None:
        return None
    lost_s = (end - onset) - (now_iter - at_onset) / rate
    return gpus * min(max(lost_s, 0.0), end - onset) / 3600.0


def effective_action(action: Any) -> str | None:
    """The action's effect: a drain of a node already down counts as a drain, and Slurm's own
    requeue (reason already_requeued_by_slurm) completes a requeue Goodput rightly skipped."""
    if action is None:
        return None
    kind = action.kind
    reasons = set(action.reasons)
    if (
        kind == "none"
        and "nodes_already_unavailable" in reasons
        and action.default_kind
        in (
            "drain",
            "drain_and_requeue",
        )
    ):
        kind = "drain"
    if "already_requeued_by_slurm" in reasons:
        kind = {"drain": "drain_and_requeue", "none": "requeue"}.get(kind, kind)
    return kind


def score(h: Any, spec: RunSpec, sc: Any) -> dict[str, Any]:
    """Per fault: detection, latency, outcome, culprit, action, recovery, GPU-hours lost; per
    incident: fault / repeat / false; healthy GPU-hours."""
    c = h.sim.cluster
    end = c.now
    faults = []
    first_ids: set[int] = set()
    for f in c.faults.values():
        inc = first_incident(h, f)
        rec: dict[str, Any] = {
            "fault_id": f["fault_id"],
            "kind": f["kind"],
            "onset": f["onset"],
            "job_id": f.get("job_id"),
            "job_gpus": _gpus_at(h, f["job_id"], f["onset"]) if f.get("job_id") else None,
            "truth": {"outcome": f["outcome"], "action": f["action"], "nodes": f["nodes"]},
            "detected": inc is not None,
        }
        if inc is not None:
            first_ids.add(inc.id)
            d = inc.diagnosis or {}
            eff = effective_action(inc.action)
            rec.update(
                latency_s=round(inc.opened_at - f["onset"], 1),
                first_alerts=sorted(inc.alert_names),
                outcome=d.get("outcome"),
                confidence=d.get("confidence"),
                nodes=list(d.get("affected_nodes") or []),
                action=inc.action.kind if inc.action else None,
                effective_action=eff,
                reasons=list(inc.action.reasons) if inc.action else [],
                result=inc.result,
                outcome_ok=d.get("outcome") == f["outcome"],
                action_ok=eff == f["action"],
            )
        rec_t = h.recovered.get(f["fault_id"])
        if f["action"] == "drain":  # node isolated: when the simulator drained it
            drained = _drained_at(h, f)
            rec["time_to_recover_s"] = None if drained is None else round(drained - f["onset"], 1)
        elif rec_t is not None:
            rec["time_to_recover_s"] = round(rec_t - f["onset"], 1)
        else:
            rec["time_to_recover_s"] = None
        lost = _lost_gpu_hours(h, f, inc, end)
        rec["gpu_hours_lost"] = None if lost is None else round(lost, 3)
        faults.append(rec)
    fault_jobs: dict[str, float] = {}
    for f in c.faults.values():
        for j in f.get("job_ids") or [f.get("job_id")]:
            if j:
                fault_jobs[j] = min(fault_jobs.get(j, math.inf), f["onset"])
    incidents = []
    for inc in h.incidents:
        s = inc.summary()
        onset = fault_jobs.get(inc.job_id or "", math.inf)
        on_fault_nodes = inc.job_id is None and any(
            inc.node in _fault_nodes(h, f) and inc.opened_at >= f["onset"]
            for f in c.faults.values()
        )
        if inc.id in first_ids:
            s["class"] = "fault"
        elif inc.opened_at >= onset or on_fault_nodes:
            s["class"] = "repeat"
        else:
            s["class"] = "false"
        s["destructive"] = bool(
            inc.action and inc.action.kind in DESTRUCTIVE and inc.result == "executed"
        )
        incidents.append(s)
    healthy_s = 0.0
    for job_id, pts in h.running.items():
        onset = fault_jobs.get(job_id, math.inf)
        healthy_s += sum(g * h.interval_s for t, g in pts if t < onset)
    return {
        "run": asdict(spec),
        "scenario": sc.name,
        "nodes": sc.nodes,
        "simulated_s": round(end - c.start, 1),
        "steps": int(round((end - c.start) / h.interval_s)),
        "faults": faults,
        "fault_errors": h.sim.errors,
        "incidents": incidents,
        "healthy_gpu_hours": round(healthy_s / 3600.0, 3),
        "diagnose_s_max": round(max((i.diagnose_s for i in h.incidents), default=0.0), 3),
    }

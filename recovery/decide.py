"""`decide(diagnosis, history, policy) -> Action`: the pure heart of recovery.

Inputs and output are frozen values; no clock, no I/O. Every adjustment of the policy's
default action adds a reason code (`Reason`), so the audit log says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from recovery.policy import ACTIONS, DESTRUCTIVE, DRAINS, OUTCOMES, RESTARTS, Policy

UNAVAILABLE = ("DRAIN", "DOWN", "FAIL", "MAINT", "REBOOT", "POWER", "NOT_RESPONDING")
ENDED = (
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "NODE_FAIL",
    "TIMEOUT",
    "PREEMPTED",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
)


class Reason(StrEnum):
    POLICY_DEFAULT = "policy_default"
    CATALOGUE_HINT = "catalogue_hint"  # the signature's catalogue action replaced the default
    NO_CULPRIT_NODE = "no_culprit_node"
    NO_JOB = "no_job"
    LOW_CONFIDENCE = "low_confidence"
    EXIT_CODE_93 = "exit_code_93_do_not_requeue"
    ALREADY_REQUEUED = "already_requeued_by_slurm"
    RETRY_BUDGET_SPENT = "retry_budget_spent"
    STICKY_ROOT_CAUSE = "sticky_root_cause"
    BACKOFF = "backoff"
    JOB_ENDED = "job_ended"
    ENDED_LONG_AGO = "job_ended_before_requeue_window"  # a late alert: no restart now
    CULPRIT_ALREADY_EXCLUDED = "culprit_already_excluded_from_job"  # an earlier restart did it
    NODES_ALREADY_UNAVAILABLE = "nodes_already_unavailable"
    BLAST_DRAINS_PER_HOUR = "blast_radius_drains_per_hour"
    BLAST_PARTITION_FRACTION = "blast_radius_partition_fraction"
    BLAST_LAST_HEALTHY = "blast_radius_last_healthy_nodes"
    BLAST_UNKNOWN = "blast_radius_node_states_unknown"
    EXCLUSIONS_CAPPED = "exclusions_capped_to_keep_job_runnable"
    SUSPECTS_KEPT = "suspects_not_excluded_no_idle_node"  # avoiding them would leave it pending
    PAUSED = "paused"
    WATCHDOG = "watchdog_not_acting"  # the receiver's own health failed (recovery/watchdog.py)
    MODE_MONITOR = "mode_monitor"
    OUTSIDE_CANARY = "outside_canary_partitions"  # policy canary_partitions: monitor elsewhere
    MODE_APPROVE = "mode_approve"
    MODE_ACT = "mode_act"


@dataclass(frozen=True)
class Diagnosis:
    """The fields of a diagnosis that decide reads."""

    incident_id: str
    job_id: str | None
    outcome: str
    root_cause: str = ""
    affected_nodes: tuple[str, ...] = ()
    confidence: float = 0.0
    onset: float | None = None
    key: str = ""  # the diagnosis' cause_key (attribution's stable key), when it has one
    hint: str = ""  # the diagnosis' action_hint (the catalogue's action for its signatures)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Diagnosis:
        """Validate a diagnosis dict from the receiver; raises ValueError with the field."""
        outcome = d.get("outcome")
        if outcome not in OUTCOMES:
            raise ValueError(f"diagnosis outcome {outcome!r} is not a known outcome")
        try:
            conf = float(d.get("confidence") or 0.0)
        except (TypeError, ValueError):
            raise ValueError("diagnosis confidence must be a number") from None
        if not 0.0 <= conf <= 1.0:
            raise ValueError("diagnosis confidence must be within 0..1")
        nodes = d.get("affected_nodes") or []
        if not isinstance(nodes, list | tuple) or not all(isinstance(n, str) for n in nodes):
            raise ValueError("affected_nodes must be a list of node names")
        onset = d.get("onset")
        rc = d.get("root_cause") or ""
        if isinstance(rc, dict):  # tolerate a structured root cause
            rc = str(rc.get("id") or rc.get("symptom") or sorted(rc.items()))
        roots = sorted(
            {
                str(x.get("id"))
                for x in d.get("symptoms") or []
                if isinstance(x, dict) and x.get("role") == "root" and x.get("id")
            }
        )
        if roots:  # the root symptom ids are a steadier key than the sentence
            rc = ",".join(roots)
        job = d.get("job_id")
        hint = d.get("action_hint") or ""
        if hint not in ("", *ACTIONS):
            raise ValueError(f"diagnosis action_hint {hint!r} is not a known action")
        return cls(
            incident_id=str(d.get("incident_id", "")),
            job_id=str(job) if job not in (None, "") else None,
            outcome=str(outcome),
            root_cause=str(rc)[:500],
            affected_nodes=tuple(dict.fromkeys(nodes)),
            confidence=conf,
            onset=float(onset) if isinstance(onset, int | float) else None,
            key=str(d.get("cause_key") or "")[:500],
            hint=str(hint),
        )

    @property
    def cause_key(self) -> str:
        """What repeats when the same fault comes back: attribution's `cause_key` (outcome,
        initiating symptoms, culprit), else the outcome and root cause."""
        return self.key or f"{self.outcome}:{self.root_cause}"


@dataclass(frozen=True)
class JobView:
    state: str
    restarts: int = 0
    exit_code: int | None = None
    partition: str | None = None
    start_time: float | None = None
    node_count: int = 0  # nodes the job asks for (0: unknown; its allocation's size is used)
    end_time: float | None = None
    nodes: tuple[str, ...] = ()  # its latest allocation's nodes (() while pending or unknown)

    @property
    def need(self) -> int:
        return max(self.node_count, 1)

    @property
    def ended(self) -> bool:
        return self.state.upper() in ENDED


@dataclass(frozen=True)
class NodeView:
    node: str
    state: str
    partitions: tuple[str, ...] = ()

    @property
    def unavailable(self) -> bool:
        s = self.state.upper()
        return any(u in s for u in UNAVAILABLE)


@dataclass(frozen=True)
class History:
    """What happened before, as seen at decision time."""

    now: float
    job: JobView | None = None
    restarts_done: int = 0  # restarts Goodput made for this job
    same_cause_restarts: int = 0  # of those, for this diagnosis' cause_key
    drain_times: tuple[float, ...] = ()  # one entry per node Goodput drained
    nodes: tuple[NodeView, ...] = ()
    paused: bool = False
    reserved: tuple[str, ...] = ()  # nodes other open plans will drain (the budget they hold)
    excluded_before: tuple[str, ...] = ()  # this job's earlier Goodput exclusions, oldest first
    not_acting: str = ""  # why the watchdog stopped acting ("" while it acts)


@dataclass(frozen=True)
class Action:
    kind: str
    disposition: str  # execute | await_approval | plan_only | notify | none
    mode: str
    job_id: str | None
    incident_id: str
    nodes: tuple[str, ...] = ()  # nodes to drain
    exclude: tuple[str, ...] = ()  # nodes to exclude when requeueing
    dropped: tuple[str, ...] = ()  # earlier exclusions left out so the job can still run
    delay_s: float = 0.0
    default_kind: str = "none"
    reasons: tuple[str, ...] = field(default_factory=tuple)
    partitions: tuple[str, ...] = ()  # those whose mode it was decided in (the job's, drains')

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "disposition": self.disposition,
            "mode": self.mode,
            "job_id": self.job_id,
            "incident_id": self.incident_id,
            "nodes": list(self.nodes),
            "exclude": list(self.exclude),
            "exclusions_dropped": list(self.dropped),
            "delay_s": self.delay_s,
            "default_kind": self.default_kind,
            "reasons": list(self.reasons),
            "partitions": list(self.partitions),
        }


def blast_radius_violation(
    nodes: tuple[str, ...], history: History, policy: Policy
) -> tuple[Reason | None, tuple[str, ...]]:
    """(reason, new_nodes): why draining `nodes` now would break a limit, or None."""
    if not history.nodes:
        return Reason.BLAST_UNKNOWN, nodes
    views = {n.node: n for n in history.nodes}
    new = tuple(n for n in nodes if not (n in views and views[n].unavailable))
    if not new:
        return None, new
    b = policy.blast_radius
    recent = sum(1 for t in history.drain_times if t > history.now - 3600.0)
    if recent + sum(1 for n in new if n not in history.reserved) > b.max_drains_per_hour:
        return Reason.BLAST_DRAINS_PER_HOUR, new
    partitions = {p for n in new for p in (views[n].partitions if n in views else ())}
    if any(n not in views for n in new):
        return Reason.BLAST_UNKNOWN, new
    out = set(new) | set(history.reserved)  # drained by this plan or reserved by another one
    for part in sorted(partitions) or [""]:
        members = (
            [v for v in history.nodes if part in v.partitions] if part else list(views.values())
        )
        total = len(members)
        down = sum(1 for v in members if v.unavailable or v.node in out)
        if total == 0 or down / total > b.max_partition_unavailable_fraction + 1e-9:
            return Reason.BLAST_PARTITION_FRACTION, new
        if total - down < b.min_healthy_nodes:
            return Reason.BLAST_LAST_HEALTHY, new
    return None, new


def cap_exclusions(
    culprits: tuple[str, ...],
    earlier: tuple[str, ...],
    need: int,
    history: History,
    partition: str | None,
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(exclude, dropped) for a restart: this fault's `culprits` plus the job's `earlier`
    exclusions (oldest first), less the oldest earlier ones that would leave fewer than `need`
    up, non-drained nodes of the job's partition (not culprits, not reserved by other plans) to
    run on. Culprits are always kept: they are being drained. Node states unknown: no earlier
    exclusion is kept (one the scheduler cannot honour strands the job)."""
    culprit_set = set(culprits)
    older = [n for n in dict.fromkeys(earlier) if n not in culprit_set]
    parts = set(partition.split(",")) if partition else set()
    members = [v for v in history.nodes if not parts or parts & set(v.partitions)]
    if not members:
        return culprits, tuple(older)
    healthy = {v.node for v in members if not v.unavailable} - culprit_set - set(history.reserved)
    kept, dropped = list(older), []
    free = len(healthy - set(kept))
    for n in older:  # oldest first; dropping an unavailable node frees nothing
        if free >= need:
            break
        if n in healthy:
            kept.remove(n)
            dropped.append(n)
            free += 1
    return (*kept, *culprits), tuple(dropped)


def idle_elsewhere(history: History, taken: tuple[str, ...], partition: str | None) -> int:
    """Nodes of the job's partition that could start it now: idle, not in `taken`, not
    reserved by another plan (states unknown: none)."""
    parts = set(partition.split(",")) if partition else set()
    return sum(
        1
        for v in history.nodes
        if (not parts or parts & set(v.partitions))
        and v.state.upper().startswith("IDLE")
        and not v.unavailable
        and v.node not in taken
        and v.node not in history.reserved
    )


def decide(diagnosis: Diagnosis, history: History, policy: Policy) -> Action:
    """The action for `diagnosis`, given what happened before and the (job's) policy."""
    default = policy.action_for(diagnosis.outcome, diagnosis.hint)
    kind = default
    reasons: list[str] = [Reason.POLICY_DEFAULT]
    if default != policy.action_for(diagnosis.outcome):
        reasons = [Reason.CATALOGUE_HINT]
    nodes = tuple(dict.fromkeys(diagnosis.affected_nodes))
    job = history.job
    delay = 0.0

    if kind in DRAINS and not nodes:
        kind = "hold_for_person" if kind == "drain" else "requeue"
        reasons.append(Reason.NO_CULPRIT_NODE)
    if kind in (*RESTARTS, "stop") and diagnosis.job_id is None:
        kind = "drain" if kind == "drain_and_requeue" else "none"
        reasons.append(Reason.NO_JOB)
    if kind in DESTRUCTIVE and diagnosis.confidence < policy.min_confidence.get(kind, 0.0):
        kind = "hold_for_person"
        reasons.append(Reason.LOW_CONFIDENCE)

    moved_off = job is not None and job.nodes and not set(nodes) & set(job.nodes)
    if (
        kind in (*RESTARTS, "stop")
        and nodes
        and moved_off
        and set(nodes) <= set(history.excluded_before)
    ):
        # an earlier restart moved the job off every culprit: the fault is the ended run's
        kind = "drain" if kind == "drain_and_requeue" else "none"
        reasons.append(Reason.CULPRIT_ALREADY_EXCLUDED)
    if kind in RESTARTS and job is not None:
        if job.ended and job.exit_code == 93:
            kind = "drain" if kind == "drain_and_requeue" else "stop"
            reasons.append(Reason.EXIT_CODE_93)
        elif _restarted_since_onset(job, diagnosis):
            kind = "drain" if kind == "drain_and_requeue" else "none"
            reasons.append(Reason.ALREADY_REQUEUED)
        elif (
            job.ended
            and job.end_time is not None
            and history.now - job.end_time > policy.retry.requeue_within_s
        ):  # e.g. an exporter restart re-reports an hour of failed jobs: their users moved on
            kind = "drain" if kind == "drain_and_requeue" else "none"
            reasons.append(Reason.ENDED_LONG_AGO)
    if kind in RESTARTS:
        if history.same_cause_restarts >= policy.retry.sticky_after:
            kind = "stop"
            reasons.append(Reason.STICKY_ROOT_CAUSE)
        elif history.restarts_done >= policy.retry.max_requeues_per_job:
            kind = "stop"
            reasons.append(Reason.RETRY_BUDGET_SPENT)
        else:
            delay = policy.retry.backoff_for(history.restarts_done)
            if delay > 0:
                reasons.append(Reason.BACKOFF)
        if kind == "stop" and diagnosis.confidence < policy.min_confidence.get("stop", 0.0):
            kind = "hold_for_person"  # a stop needs its own confidence, however it was reached
            reasons.append(Reason.LOW_CONFIDENCE)
    if kind == "stop" and job is not None and job.ended:
        reasons.append(Reason.JOB_ENDED)

    drain_nodes: tuple[str, ...] = ()
    if kind in DRAINS or (kind == "stop" and default in DRAINS and nodes):
        why, new = blast_radius_violation(nodes, history, policy)
        if why is not None:
            reasons.append(why)
            kind = "stop" if kind == "stop" else "hold_for_person"
        else:
            drain_nodes = new
            if len(new) < len(nodes):
                reasons.append(Reason.NODES_ALREADY_UNAVAILABLE)
            if not new and kind == "drain":
                kind = "none"
    # a node that failed this job once stays excluded from its later restarts (one bad,
    # "black-hole", node cannot burn the retry budget), capped so the job can still run. A
    # plain requeue's named nodes (the rank a hang waits on, the node of a one-node spin) are
    # suspects, not drained: avoided too (kept over older exclusions), where idle nodes can
    # start the job now (a workload verdict does not blame them: not worth a wait in the
    # queue while they sit idle)
    exclude: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    if kind in RESTARTS:
        culprits = nodes if kind == "drain_and_requeue" else ()
        suspects = () if culprits else nodes
        need = job.need if job else 1
        part = job.partition if job else None
        earlier = tuple(n for n in history.excluded_before if n not in suspects)
        exclude, dropped = cap_exclusions((*culprits, *suspects), earlier, need, history, part)
        if suspects and idle_elsewhere(history, exclude, part) < need:
            reasons.append(Reason.SUSPECTS_KEPT)
            exclude, dropped = cap_exclusions(culprits, earlier, need, history, part)
            dropped += tuple(n for n in suspects if n in history.excluded_before)
        if dropped:
            reasons.append(Reason.EXCLUSIONS_CAPPED)

    # the narrowest mode of every partition the action touches: the job's and its drains'
    views = {v.node: v for v in history.nodes}
    touched = [job.partition] if job and job.partition else []
    touched += [p for n in drain_nodes if n in views for p in views[n].partitions]
    mode = policy.mode_for(",".join(touched))
    if kind == "none" or (kind == "hold_for_person"):
        disposition = "notify" if kind == "hold_for_person" else "none"
    elif history.paused:
        disposition = "plan_only"
        reasons.append(Reason.PAUSED)
    elif history.not_acting:
        disposition = "plan_only"
        reasons.append(Reason.WATCHDOG)
    elif mode == "monitor":
        disposition = "plan_only"
        reasons.append(Reason.MODE_MONITOR)
        if policy.outside_canary(",".join(touched)):
            reasons.append(Reason.OUTSIDE_CANARY)
    elif mode == "approve":
        disposition = "await_approval"
        reasons.append(Reason.MODE_APPROVE)
    else:
        disposition = "execute"
        reasons.append(Reason.MODE_ACT)
    return Action(
        kind=kind,
        disposition=disposition,
        mode=mode,
        job_id=diagnosis.job_id,
        incident_id=diagnosis.incident_id,
        nodes=drain_nodes if kind in (*DRAINS, "stop") else (),
        exclude=exclude,
        dropped=dropped,
        delay_s=delay if kind in RESTARTS else 0.0,
        default_kind=default,
        reasons=tuple(str(r) for r in reasons),
        partitions=tuple(dict.fromkeys(p for t in touched for p in t.split(",") if p)),
    )


def _restarted_since_onset(job: JobView, diagnosis: Diagnosis) -> bool:
    """Slurm (or someone) already restarted the job after the fault began."""
    state = job.state.upper()
    if state == "PENDING" and job.restarts > 0:
        return True
    if state in ("RUNNING", "CONFIGURING", "COMPLETING") and diagnosis.onset is not None:
        return job.start_time is not None and job.start_time > diagnosis.onset
    return False

"""The diagnosis document: `attribute` runs the three stages and assembles the schema-valid
diagnosis dict (root cause, stable cause key, culprit nodes and GPUs, evidence, confidence,
action hint); with no rule, `healthy` only on evidence of a running, progressing job,
otherwise `unknown` with the reason."""

from __future__ import annotations

from typing import Any

from recovery.attribution.model import RUNNING, Rules, Sym, _key, clip, load_rules
from recovery.attribution.ranking import _confidence, _culprit, choose, refine
from recovery.attribution.symptoms import Extracted, extract
from recovery.diagnosis import CATEGORY, Diagnosis
from recovery.evidence import Bundle, Context


def attribute(
    bundle: Bundle,
    ctx: Context,
    incident_id: int | None = None,
    rules: Rules | None = None,
    gpus_per_node: int = 8,
) -> dict[str, Any]:
    """Run the three stages over `bundle`; returns a schema-valid diagnosis dict."""
    rules = rules or load_rules()
    found = extract(bundle, ctx, rules, gpus_per_node)
    syms = refine(found.symptoms, rules)
    rule, trig, cands = choose(syms, rules)
    common = dict(
        incident_id=incident_id,
        job_id=ctx.job_id,
        job_name=ctx.job_name,
        job_user=bundle.slurm.job.get("user"),
        job_nodes=list(bundle.slurm.job.get("nodes") or [])[:1000],
        connector_reports=[r.as_dict() for r in bundle.reports],
        symptoms=[_sym_doc(s) for s in syms[:200]],
    )
    if rule is None:
        return _diagnosis(common, **_no_rule_verdict(bundle, ctx, syms, found))
    outcome = rule["outcome"]
    culprit = _culprit(rule, trig, syms)
    trig_nodes = set(culprit)
    gpus = sorted({(s.node, s.gpu) for s in trig if s.node in trig_nodes and s.gpu})
    competing = sum(
        1 for o, t in cands if o != outcome and t <= min(_key(s) for s in trig) + rules.tolerance_s
    )
    conf, basis = _confidence(rule, trig, bundle, competing)
    # the earliest trigger heads the root cause, or the rule's `headline` symptom where it
    # names one that triggered (a stall past a pause's allowance, not the stall seen first);
    # the onset stays the earliest trigger's
    first = min([s for s in trig if s.id == rule.get("headline")] or trig, key=_key)
    onset_times = [s.time for s in trig if s.time is not None]
    where = f" on {', '.join(culprit)}" if culprit else ""
    root = f"{outcome.replace('_', ' ')}{where}: {clip(first.detail, 240)}"
    evidence = [s.evidence for s in sorted(trig, key=_key)[:20]]
    evidence += [s.evidence for s in syms if s not in trig][:30]
    initiating = sorted({s.id for s in trig if s.role == "initiating"} or {s.id for s in trig})
    return _diagnosis(
        common,
        outcome,
        action_hint=action_hint(trig),
        root_cause=root.replace("\n", " "),
        cause_key=cause_key(outcome, initiating, culprit),
        affected_nodes=culprit,
        affected_gpus=[{"node": n, "gpu": g} for n, g in gpus],
        evidence=evidence,
        confidence=conf,
        confidence_basis=basis,
        onset=min(onset_times) if onset_times else None,
    )


def action_hint(trig: list[Sym]) -> str:
    """The catalogue's action for the signatures behind the verdict, when they all carry the
    same one (an XID's job_action, a pattern's action); "" when one carries none or they
    differ, so the outcome's default stands."""
    hints = {s.action for s in trig}
    return hints.pop() if len(hints) == 1 else ""


def cause_key(outcome: str, symptom_ids: list[str], nodes: list[str]) -> str:
    """A key that names the cause, not the occurrence: the outcome, the initiating symptom ids
    and the culprit nodes (no times, no line text), so the same fault seen again matches. A
    workload outcome's has no nodes: the job's own fault follows it to the nodes its restart
    moved it to (away from the ones it named), and seen there it is the same cause again."""
    key = f"{outcome}:{'+'.join(sorted(set(symptom_ids))) or '-'}"
    if not nodes or CATEGORY.get(outcome) == "workload":
        return key
    return f"{key}@{','.join(sorted(set(nodes)))}"


def _no_rule_verdict(
    bundle: Bundle, ctx: Context, syms: list[Sym], found: Extracted
) -> dict[str, Any]:
    """No rule matched: `healthy` only on evidence of a running, progressing job."""
    job = f"job {ctx.job_id}" if ctx.job_id else "the job"
    answered = {r.connector: r.status for r in bundle.reports}
    summary = ", ".join(f"{c} {st}" for c, st in sorted(answered.items())) or "no source"
    state = str(bundle.slurm.job.get("state") or "").upper()
    exit_code = bundle.slurm.job.get("exit_code")

    def unknown(why: str, key: str) -> dict[str, Any]:
        return dict(
            outcome="unknown",
            root_cause=why,
            cause_key=f"unknown:{key}",
            confidence=0.3,
            confidence_basis=f"no initiating symptom matched any rule; sources: {summary}",
        )

    if not (bundle.lines or bundle.series or bundle.slurm.job or syms):
        return unknown(f"no evidence: {job} is in none of the sources ({summary}).", "no_evidence")
    seen = ", ".join(sorted({s.id for s in syms}))
    if seen:
        why = f"Only consequences seen ({seen}); nothing says what caused them."
        return unknown(why, "cascades")
    if ctx.alerts:
        return unknown("No failure signature found in the evidence.", "no_signature")
    if state == "COMPLETED" and exit_code in (0, None):
        return dict(
            outcome="healthy",
            root_cause=f"No fault: Slurm reports {job} COMPLETED with exit code 0.",
            cause_key="healthy",
            confidence=0.6,
            confidence_basis=f"Slurm state COMPLETED, no symptom; sources: {summary}",
        )
    if state and not any(state.startswith(w) for w in RUNNING):
        return unknown(f"No fault signature, but Slurm reports {job} {state}.", "not_running")
    if not found.progress:
        return unknown(
            f"No fault signature, and nothing shows {job} making progress ({summary}).",
            "no_progress",
        )
    shown = "; ".join(found.progress[-2:])
    return dict(
        outcome="healthy",
        root_cause=f"No fault: {job} is {'running and ' if state else ''}progressing.",
        cause_key="healthy",
        confidence=0.6,
        confidence_basis=f"no symptom; progress: {shown}"[:500],
    )


def _diagnosis(common: dict[str, Any], outcome: str, **fields: Any) -> dict[str, Any]:
    """The schema-validated diagnosis dict: the fields every verdict has, plus its own."""
    doc = {**common, "outcome": outcome, "category": CATEGORY[outcome], **fields}
    return Diagnosis.model_validate(doc).model_dump(mode="json")


def _sym_doc(s: Sym) -> dict[str, Any]:
    return {
        "id": s.id,
        "role": s.role,
        "first_seen": s.time,
        "source": s.source,
        "node": s.node,
        "gpu": s.gpu,
        "detail": s.detail[:300],
    }

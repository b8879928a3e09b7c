"""Stages 2 and 3: order the symptoms by time and mark what each present outcome explains as
cascade (`refine`); pick the outcome whose earliest initiating symptom comes first
(`choose`), its culprit nodes, and a confidence with the basis it was computed on."""

from __future__ import annotations

from typing import Any

from recovery.attribution.model import Rules, Sym, _key
from recovery.evidence import Bundle


def _triggers(rule: dict[str, Any], syms: list[Sym]) -> list[Sym]:
    ids = set(rule.get("symptoms", []))
    if any(s.id in rule.get("unless", ()) for s in syms):
        return []
    any_role = bool(rule.get("any_role"))  # the fallback rule: cascades count too
    return [
        s
        for s in syms
        if (any_role or s.role == "initiating")
        and (
            s.id in ids
            or (s.outcome and s.outcome == rule["outcome"] and rule["outcome"] != "unknown")
        )
    ]


def refine(syms: list[Sym], rules: Rules) -> list[Sym]:
    """Order by time and mark what each present outcome explains as cascade."""
    syms.sort(key=_key)
    tol = rules.tolerance_s
    for rule in rules.outcomes:
        trig = _triggers(rule, syms)
        if not trig:
            continue
        first = min(_key(s) for s in trig)
        explains = set(rule.get("explains", []))
        for s in syms:
            if s in trig or s.id not in explains:
                continue
            if s.time is None or first == float("inf") or s.time + tol >= first:
                s.role = "cascade"
    return syms


def choose(
    syms: list[Sym], rules: Rules
) -> tuple[dict[str, Any] | None, list[Sym], list[tuple[str, float]]]:
    """The winning outcome rule, its trigger symptoms, and every candidate (outcome, time)."""
    tol = rules.tolerance_s
    candidates = []
    for order, rule in enumerate(rules.outcomes):
        trig = _triggers(rule, syms)
        if trig:
            candidates.append((min(_key(s) for s in trig), order, rule, trig))
    if not candidates:
        return None, [], []
    real = [c for c in candidates if not c[2].get("any_role")]
    candidates = real or candidates  # the fallback rule only when nothing else matched
    earliest = min(c[0] for c in candidates)
    close = [c for c in candidates if c[0] <= earliest + tol or c[0] == float("inf")]
    if earliest != float("inf"):
        close = [c for c in close if c[0] != float("inf")] or close
    best = min(close, key=lambda c: c[1])
    return best[2], best[3], [(c[2]["outcome"], c[0]) for c in candidates]


def _culprit(rule: dict[str, Any], trig: list[Sym], syms: list[Sym]) -> list[str]:
    how = rule.get("culprit", "none")
    if how == "symptom":
        return sorted({s.node for s in trig if s.node is not None})
    if how == "suspect":  # the node whose peer-comparison score crossed 1.0 first
        sus = sorted((s for s in syms if s.id == "suspect_score" and s.node), key=_key)
        return [sus[0].node] if sus and sus[0].node else []
    return []


def _confidence(
    rule: dict[str, Any], trig: list[Sym], bundle: Bundle, competing: int
) -> tuple[float, str]:
    base = float(rule.get("confidence", 0.5))
    sources = {s.source for s in trig}
    reports = {r.connector: r.status for r in bundle.reports}
    src_ok = {
        "prometheus": reports.get("prometheus") == "ok",
        "log": reports.get("logs") == "ok" or reports.get("loki") == "ok",
        "slurm": reports.get("slurm") == "ok",
    }
    missing = [s for s, ok in src_ok.items() if not ok]
    conf = base + 0.05 * (len(sources) - 1)
    conf *= 0.85 ** len(missing)
    if competing:
        conf *= 0.85
    # only other nodes' reports about their peer say where, and they do not name it (no
    # address to map, `logs._witnessed`): a suspect by its silence, or no node at all
    guessed = any(s.placed in ("silent", "unplaced") for s in trig) and not any(
        s.node is not None and s.placed in ("", "address") for s in trig
    )
    if guessed:
        conf *= 0.85
    conf = max(0.05, min(0.99, conf))
    basis = (
        f"rule {rule['outcome']} base {base:.2f}; +0.05 per extra corroborating source "
        f"({', '.join(sorted(sources))}); x0.85 per unavailable source "
        f"({', '.join(missing) or 'none'}); x0.85 if another outcome was within tolerance "
        f"({competing})"
    )
    if guessed:
        basis += "; x0.85: only peers' reports place it, and they name no node"
    return round(conf, 3), basis

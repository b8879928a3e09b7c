"""Stage 1 for scheduler facts: the Slurm rules over the job's state, exit code and signal
and the nodes' states, and the catalogue's signatures in the reasons a health check wrote on
a node, as symptoms."""

from __future__ import annotations

from typing import Any

from recovery.attribution.logs import _hits
from recovery.attribution.model import Rules, Sym, clip
from recovery.evidence import Bundle, Context


def _slurm_sym(
    rule: dict[str, Any],
    role: str,
    t: float | None,
    node: str | None,
    detail: str,
    query: str,
    excerpt: str,
) -> Sym:
    """A symptom from a scheduler fact (its evidence carries no time of its own)."""
    return Sym(
        rule["id"],
        rule.get("role", role),
        t,
        "slurm",
        node,
        None,
        detail,
        rule.get("outcome", ""),
        {
            "source": "slurm",
            "query_or_path": query,
            "line": None,
            "time": None,
            "node": node,
            "gpu": None,
            "excerpt": excerpt,
        },
    )


def _slurm_symptoms(bundle: Bundle, ctx: Context, rules: Rules) -> list[Sym]:
    job, nodes = bundle.slurm.job, bundle.slurm.nodes
    out = []
    t = ctx.end
    for rule in rules.slurm:
        if job and "job_state" in rule:
            state = str(job.get("state", "")).upper()
            if any(state.startswith(w.upper()) for w in rule["job_state"]):
                out.append(
                    _slurm_sym(
                        rule,
                        "initiating",
                        None,
                        None,
                        f"job state {state}",
                        job.get("argv", ""),
                        f"JobState={state} ExitCode={_exit_text(job)}",
                    )
                )
        for key, word in (("exit_code", "exit code"), ("signal", "signal")):
            if job and key in rule and job.get(key) in rule[key]:
                out.append(
                    _slurm_sym(
                        rule,
                        "cascade",
                        None,
                        None,
                        f"{word} {job.get(key)}",
                        job.get("argv", ""),
                        f"ExitCode={_exit_text(job)}",
                    )
                )
        if "node_state" in rule:
            for node, facts in nodes.items():
                state = facts.get("state", "").lower()
                if any(w in state for w in rule["node_state"]):
                    out.append(
                        _slurm_sym(
                            rule,
                            "initiating",
                            t,
                            node,
                            f"node {node} {state}: {facts.get('reason', '')}",
                            bundle.slurm.query or "sinfo",
                            f"State={state} Reason={facts.get('reason', '')}",
                        )
                    )
    for node, facts in nodes.items():  # a reason a health check wrote (NHC: check_hw_ib: ...)
        reason = str(facts.get("reason") or "")
        hits = _hits(reason, "kernel", rules)[0] if reason else []
        for symptom, role, outcome, _, pattern, action in hits:
            sym = _slurm_sym(
                {"id": symptom, "role": role, "outcome": outcome},
                role,
                t,
                node,
                f"{pattern}: node {node} reason {clip(reason, 160)}",
                bundle.slurm.query or "sinfo",
                f"Reason={reason[:280]}",
            )
            sym.action = action
            out.append(sym)
    return out


def _exit_text(job: dict[str, Any]) -> str:
    """Slurm's `code:signal` (a job a signal ended has no return code: `0:9`, as Slurm says)."""
    code, sig = job.get("exit_code"), job.get("signal") or 0
    return f"{('?' if not sig else 0) if code is None else code}:{sig}"

"""Stage 1, extract: the symptoms of the logs, metrics and Slurm together, without what
comes from before the job's current run or after its end, one per (id, node, GPU, source),
and what shows the job progressing."""

from __future__ import annotations

from dataclasses import dataclass

from catalogue import names
from recovery.attribution.logs import _log_symptoms
from recovery.attribution.metrics import _metric_symptoms
from recovery.attribution.model import PROGRESS_METRICS, Rules, Sym, _key
from recovery.attribution.slurm import _slurm_symptoms
from recovery.evidence import Bundle, Context


@dataclass
class Extracted:
    symptoms: list[Sym]
    progress: list[str]  # what shows the job working (progress lines, an advancing metric)
    dropped: int  # symptoms from before the job's current run or after its end


END_SLACK_S = 60.0  # lines and samples may trail an ended job's EndTime (whole seconds, flush)


def run_start(bundle: Bundle) -> float | None:
    """When the job's current run started (Slurm's StartTime), if a source said."""
    t = bundle.slurm.job.get("start_time")
    return float(t) if isinstance(t, int | float) and t > 0 else None


def run_end(bundle: Bundle) -> float | None:
    """When an ended job ended (None while it runs or when no source said)."""
    t = bundle.slurm.job.get("end_time")
    return float(t) if isinstance(t, int | float) and t > 0 else None


def extract(bundle: Bundle, ctx: Context, rules: Rules, gpn: int = 8) -> Extracted:
    # ranks map to the job's own node list from Slurm; without it a rank-only line stays
    # unplaced (the context's nodes are alert nodes too, and would blame the wrong node)
    job_nodes = [n for n in bundle.slurm.job.get("nodes") or [] if names.valid_node(n)]
    since, until = run_start(bundle), run_end(bundle)
    syms, lines, pause, saving = _log_symptoms(bundle.lines, rules, gpn, job_nodes, since)
    syms += _metric_symptoms(bundle.series, rules, pause, saving, job_nodes, since)
    syms += _slurm_symptoms(bundle, ctx, rules)
    # a line or sample from before the current run (an earlier run's XID, a requeue ago), or
    # from after an ended job's end (a later fault on a node it once used), is neither the
    # onset nor the culprit of this run
    until = None if until is None else until + END_SLACK_S
    kept = [
        s
        for s in syms
        if s.time is None
        or ((since is None or s.time >= since) and (until is None or s.time <= until))
    ]
    first: dict[tuple[str, str | None, str | None, str], Sym] = {}
    for sym in sorted(kept, key=_key):  # one symptom per (id, node, gpu, source): the earliest
        first.setdefault((sym.id, sym.node, sym.gpu, sym.source), sym)
    lines = [ln for ln in lines if since is None or ln.time is None or ln.time >= since]
    progress = [f"{ln.path}:{ln.line or ''} {ln.text.strip()[:120]}" for ln in lines[-3:]]
    progress += [
        f"{s.name} advanced to {s.points[-1][1]:g}"
        for s in bundle.series
        if s.name in PROGRESS_METRICS and len(s.points) > 1 and s.points[-1][1] > s.points[0][1]
    ]
    return Extracted(list(first.values()), progress, len(syms) - len(kept))

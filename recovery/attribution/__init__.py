"""The attribution engine: evidence → symptoms → refined symptoms → outcome, rules as data.

Stages (rules in `recovery/rules/*.yaml`, log patterns from `catalogue`):
1. extract — log lines and Slurm node reasons through the catalogue (its patterns are the
   one home of every signature), metric conditions over series, scheduler facts → `Sym`s with
   a time, node, role and outcome hint; nothing from before the job's current run counts;
2. refine — order by time; an outcome rule whose symptoms are present marks the symptoms it
   `explains` (seen at or after its first one) as cascade; cascades never become the root
   while an initiating symptom remains;
3. choose — the outcome whose earliest initiating symptom comes first (rule order breaks
   ties), its culprit nodes, and a confidence with the basis it was computed on. With no rule,
   `healthy` only when the sources that answered show a running, progressing job; otherwise
   `unknown` with the reason.

One module per concern: `model` (the symptom, the loaded rules, shared constants), `logs`,
`metrics` and `slurm` (stage 1 per source), `symptoms` (stage 1 together), `ranking` (stages 2
and 3) and `verdict` (the diagnosis document). A leading underscore marks a name private to
this package. Callers import from `recovery.attribution`, which re-exports what they use.
"""

from __future__ import annotations

from recovery.attribution.logs import _XID_KIND as _XID_KIND  # the tests read the XID classes
from recovery.attribution.logs import _xid_symptom as _xid_symptom
from recovery.attribution.model import (
    FB_USED,
    PRIOR_KEYS,
    PROGRESS,
    PROGRESS_METRICS,
    RULES_DIR,
    RUNNING,
    SOURCES,
    RuleError,
    Rules,
    Sym,
    load_rules,
)
from recovery.attribution.ranking import choose, refine
from recovery.attribution.symptoms import END_SLACK_S, Extracted, extract, run_end, run_start
from recovery.attribution.verdict import action_hint, attribute, cause_key

__all__ = [
    "END_SLACK_S",
    "FB_USED",
    "PRIOR_KEYS",
    "PROGRESS",
    "PROGRESS_METRICS",
    "RULES_DIR",
    "RUNNING",
    "SOURCES",
    "Extracted",
    "RuleError",
    "Rules",
    "Sym",
    "action_hint",
    "attribute",
    "cause_key",
    "choose",
    "extract",
    "load_rules",
    "refine",
    "run_end",
    "run_start",
]

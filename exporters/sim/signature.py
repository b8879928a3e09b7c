"""Fault kind `log_signature`: any catalogue log pattern as a fault, its truth the catalogue's.

`params.pattern` names a pattern of catalogue/patterns.yaml (initiating, with an outcome). Its
first `examples` line (a real one, with its source in the catalogue) goes to the job's log, or
to the node's kernel log for a kernel pattern, and the job fails. The ground truth is read from
the catalogue too: the pattern's outcome, its action hint or else the outcome's default action,
and the node as the culprit when the outcome is the infrastructure's. So a new failure
signature is one catalogue entry plus one scenario.
"""

from __future__ import annotations

from typing import Any

import catalogue
from exporters.sim.model import SchedulerError

KIND = "log_signature"


def pattern(params: dict[str, Any]) -> catalogue.Pattern:
    """The catalogue pattern `params.pattern` names; 422 when it cannot be a fault."""
    pid = params.get("pattern")
    found = next((p for p in catalogue.load_patterns() if p.id == pid), None)
    if found is None:
        raise SchedulerError(f"params.pattern: {pid!r} is not a catalogue pattern", 422)
    if found.role != "initiating" or not found.outcome or not found.examples:
        raise SchedulerError(
            f"params.pattern: {pid!r} needs role initiating, an outcome and an example", 422
        )
    return found


def truth(params: dict[str, Any]) -> dict[str, Any]:
    """The ground truth of a `log_signature` fault: the catalogue's answer for the pattern."""
    p = pattern(params)
    outcome = catalogue.outcomes()[p.outcome]
    return {
        "kind": f"{KIND}:{p.id}",
        "outcome": p.outcome,
        "action": p.action or outcome.action,
        "culprit": "node" if outcome.category == "infrastructure" else "none",
        "root_cause": p.description or p.id.replace("_", " "),
    }

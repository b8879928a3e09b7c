"""Fault kind `log_signature`: any catalogue log pattern as a fault, its truth the scenario's.

`params.pattern` names a pattern of catalogue/patterns.yaml (initiating, with an outcome). Its
first `examples` line (a real one, with its source in the catalogue) goes to the job's log, or
to the node's kernel log for a kernel pattern, and the job fails. The catalogue supplies the
line only: the ground truth (outcome, action, culprit) is written in the scenario apart from
it (`FaultSpec.truth`), so a catalogue entry that gives the wrong answer is scored as a miss
instead of moving the truth with it. A fault injected at run time without a stated truth has
none (outcome, action and culprit null: nothing to score it against).

`params.persists: 1` is a cause that a restart does not remove (a missing file, a bad
config): each later run of the job meets it again once its start-up is over and fails the
same way (exporters/sim/inject.py `relapse`).
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
    if params.get("persists") and found.source != "job":
        raise SchedulerError(
            f"params.persists: {pid!r} is a {found.source} pattern; only a job's own cause "
            "follows it to its next run",
            422,
        )
    return found


def truth(params: dict[str, Any], stated: Any = None) -> dict[str, Any]:
    """The ground truth of a `log_signature` fault: the one the scenario states (`stated`, a
    `FaultTruth`), never the catalogue's answer for the pattern."""
    p = pattern(params)
    kind = f"{KIND}:{p.id}"
    if stated is None:
        return {
            "kind": kind,
            "outcome": None,
            "action": None,
            "culprit": None,
            "root_cause": p.description or p.id.replace("_", " "),
            "truth_source": None,
        }
    return {
        "kind": kind,
        "outcome": stated.outcome,
        "action": stated.action,
        "culprit": stated.culprit,
        "root_cause": stated.root_cause or p.description or p.id.replace("_", " "),
        "truth_source": "scenario",
    }

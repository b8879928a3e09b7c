"""The shapes of the catalogue's YAML entries (pydantic, unknown keys rejected).

`catalogue.loader` checks each entry against these models before it builds its values and runs
the cross-file checks (an XID's outcome exists, a pattern's examples match it, ...), so a typo
in a key (`alret: true`) is an error naming the file and the entry, never silently ignored.
`recovery.ruleset` uses `check` for the attribution rules the same way.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

M = TypeVar("M", bound=BaseModel)
Text = str | list[str] | None  # one string or a list of them


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)


def check(model: type[M], entry: Any, where: str, error: type[ValueError]) -> M:
    """`entry` validated as `model`; `error("<where>: <key>: <problem>; ...")` if it is not."""
    try:
        return model.model_validate(entry)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'entry'}: {e['msg']}" for e in exc.errors()[:5]
        )
        raise error(f"{where}: {problems}") from None


class OutcomeEntry(Strict):
    category: str
    action: str  # the policy's default action for the outcome
    meaning: str


class ActionEntry(Strict):
    meaning: str
    destructive: bool = False  # changes a job or a node (a confidence floor applies)
    restarts: bool = False  # the job runs again
    drains: bool = False  # a node is drained


class OutcomesFile(Strict):
    categories: dict[str, str]
    outcomes: dict[str, OutcomeEntry]
    actions: dict[str, ActionEntry]


class XidClass(Strict):
    """What an XID class means outward: the detector's score and the alert that fires on it."""

    meaning: str
    detector_weight: float = Field(default=0.0, ge=0.0, le=10.0)
    alert: str = ""  # an alert of alertmanager/alerts.yaml whose XID lists are this class's


class XidEntry(Strict):
    code: int = 0
    mnemonic: str
    name: str
    cls: str = Field(alias="class")
    severity: Literal["critical", "warning", "info"]
    nvidia_action: str
    job_action: str
    outcome: str
    consequence: bool
    source: str
    note: str = ""


class PatternEntry(Strict):
    id: str
    source: Literal["job", "kernel", "any"]
    symptom: str
    role: Literal["initiating", "cascade", "info"]
    regex: Text
    fields: dict[str, str] | None = None
    keywords: Text = None
    exclusive: str = ""
    outcome: str = ""
    action: str = ""  # an action hint that overrides the outcome's default (policy permitting)
    description: str = ""
    ignore_case: bool = False
    alert: bool = False
    fallback: bool = False
    sources: Text = None
    examples: Text = None
    counter_examples: Text = None

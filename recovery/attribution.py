"""Attribution engine (stub, being written)."""

from __future__ import annotations

from typing import Any

from recovery.diagnosis import Diagnosis
from recovery.evidence import Bundle, Context


def attribute(bundle: Bundle, ctx: Context, incident_id: int | None = None) -> dict[str, Any]:
    return Diagnosis(
        incident_id=incident_id,
        job_id=ctx.job_id,
        outcome="unknown",
        category="unknown",
        root_cause="Not yet attributed.",
        confidence=0.0,
        connector_reports=[r.as_dict() for r in bundle.reports],  # type: ignore[misc]
    ).model_dump(mode="json")

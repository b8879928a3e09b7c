"""The diagnosis: what happened, where, how sure — a versioned JSON document (schema "1").

The pydantic models below are the schema; `docs/diagnosis.schema.json` is generated from them
(`python -m recovery.diagnosis > docs/diagnosis.schema.json`) and a test keeps the two equal.
Consumers (policy, console, benchmark) read the plain dict `Diagnosis.model_dump(mode="json")`.
"""

from __future__ import annotations

import json
import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

import catalogue

SCHEMA_VERSION: Literal["1"] = "1"

Outcome = Literal[
    "gpu_hardware_fault",
    "gpu_degradation",
    "network_fault",
    "node_lost",
    "filesystem",
    "workload_crash",
    "workload_oom",
    "workload_divergence",
    "workload_hang",
    "straggler",
    "scheduler_event",
    "unknown",
    "healthy",
]
Category = Literal["infrastructure", "workload", "unknown"]
Source = Literal["prometheus", "log", "slurm"]

OUTCOMES: tuple[str, ...] = Outcome.__args__  # type: ignore[attr-defined]

#: The category each outcome belongs to: the catalogue's (catalogue/outcomes.yaml), one list;
#: a test fails when `Outcome` above and the catalogue drift apart.
CATEGORY: dict[str, str] = {o.id: o.category for o in catalogue.outcomes().values()}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GpuRef(_Model):
    node: str
    gpu: str


class Symptom(_Model):
    """One thing seen, extracted from evidence by a rule."""

    id: str = Field(description="rule id of the symptom, e.g. xid_fatal, nccl_timeout")
    role: Literal["initiating", "cascade"]
    first_seen: float | None = Field(description="unix seconds of the earliest observation")
    source: Source
    node: str | None = None
    gpu: str | None = None
    detail: str = ""


class EvidenceItem(_Model):
    """One observation in the evidence trail."""

    source: Source
    query_or_path: str = Field(description="PromQL, file path (or Loki query), or argv")
    line: int | None = Field(default=None, description="1-based line number for files")
    time: float | None = None
    node: str | None = None
    gpu: str | None = None
    excerpt: str = ""


class ConnectorReport(_Model):
    connector: str
    status: Literal["ok", "empty", "error"]
    reason: str = ""
    latency_s: float = 0.0


class Diagnosis(_Model):
    """Schema version 1 of a diagnosis."""

    schema_version: Literal["1"] = SCHEMA_VERSION
    incident_id: int | None = None
    job_id: str | None = None
    job_name: str | None = None
    job_user: str | None = Field(default=None, description="the job's owner (Slurm)")
    job_nodes: list[str] = Field(
        default=[], description="the nodes the job ran on (Slurm), whoever is to blame"
    )
    outcome: Outcome
    category: Category
    root_cause: str = Field(description="one sentence")
    cause_key: str = Field(
        default="",
        description="the cause without the occurrence: outcome, initiating symptom ids and "
        "culprit nodes (e.g. gpu_hardware_fault:xid_fatal@node2; a workload outcome's without "
        "nodes: the job's own fault follows it); equal for the same fault seen again, so "
        "retry budgets and the sticky-cause rule can count it",
    )
    action_hint: str = Field(
        default="",
        description="the catalogue's action for the signatures behind the verdict (an XID's "
        "job_action, a log pattern's action) when they all name the same one; the policy may "
        "honour it instead of the outcome's default action (honour_catalogue_hints)",
    )
    affected_nodes: list[str] = []
    affected_gpus: list[GpuRef] = []
    symptoms: list[Symptom] = []
    evidence: list[EvidenceItem] = []
    confidence: float = Field(ge=0.0, le=1.0)
    confidence_basis: str = ""
    connector_reports: list[ConnectorReport] = []
    diagnosed_at: float = Field(default_factory=time.time)
    onset: float | None = Field(default=None, description="earliest symptom time (unix s)")


def json_schema() -> dict:
    schema = Diagnosis.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://goodput.dev/schemas/diagnosis-1.json"
    return schema


def validate(doc: dict) -> dict:
    """Check `doc` against the schema; returns it in canonical JSON form."""
    return Diagnosis.model_validate(doc).model_dump(mode="json")


if __name__ == "__main__":
    print(json.dumps(json_schema(), indent=2, sort_keys=True))

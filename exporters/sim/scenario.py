"""The scenario file (YAML): cluster, jobs and faults with onset times. Validated with pydantic."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from catalogue import names
from exporters.sim.faults import FAULT_KINDS

NODE_RE = names.NODE
JOB_ID_RE = names.JOB_ID


class ScenarioError(ValueError):
    """A scenario or fault request is invalid; the message names the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _check_job_id(v: str | None) -> str | None:
    if v is not None and not JOB_ID_RE.match(v):
        raise ValueError("job_id must be digits (array jobs: 123_4)")
    return v


class JobSpec(_Strict):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    job_id: str | None = None
    nodes: int = Field(default=2, ge=1, le=1024)
    gpus_per_node: int = Field(default=8, ge=1, le=8)
    start_s: float = Field(default=0.0, ge=0)
    duration_s: float = Field(default=3600.0, gt=0)
    step_time_s: float = Field(default=1.2, gt=0.01, le=600)
    init_s: float = Field(default=20.0, ge=0)
    load_s: float = Field(default=0.0, ge=0, le=3600)  # a checkpoint load before the first step
    resume_iter: int = Field(default=0, ge=0, le=10**9)  # resume from a checkpoint there
    warmup_s: float = Field(default=60.0, ge=0)
    checkpoint_every_s: float = Field(default=600.0, ge=0)
    checkpoint_s: float = Field(default=25.0, ge=0)
    eval_every_s: float = Field(default=0.0, ge=0)
    eval_s: float = Field(default=30.0, ge=0)
    # who saves (evaluates): every rank, or rank 0 while the others wait for it in a barrier
    checkpoint_by: Literal["all", "rank0"] = "all"
    eval_by: Literal["all", "rank0"] = "all"
    eval_log: Literal["none", "bar"] = "none"  # an evaluation's log: silent, or a tqdm bar
    # before the first step rank 0 tokenises the data set (transformers' main_process_first)
    # while the others wait in a barrier, spinning; its log: a bar, or silent
    preprocess_s: float = Field(default=0.0, ge=0, le=7200)
    preprocess_log: Literal["none", "bar"] = "bar"
    # the first step compiles silently after `training ...` (torch.compile): every GPU idle,
    # its memory held, nothing logged
    compile_s: float = Field(default=0.0, ge=0, le=3600)
    global_batch: int = Field(default=512, ge=1)
    log_interval: int = Field(default=10, ge=1)
    requeue: bool = True
    comment: str = ""

    @field_validator("job_id")
    @classmethod
    def _job_id(cls, v: str | None) -> str | None:
        return _check_job_id(v)


class FaultTruth(_Strict):
    """The right answer to a fault, stated by whoever wrote the scenario: what a diagnosis
    should conclude (`outcome`), what should be done (`action`) and whether the node is to
    blame (`culprit`). Names are checked against the catalogue's vocabulary (outcomes.yaml),
    but the answer is never read from the catalogue: a `log_signature` fault is scored against
    this, so a catalogue entry that says the wrong thing shows as a miss."""

    outcome: str
    action: str
    culprit: Literal["node", "none"]
    root_cause: str = ""
    why: str = ""  # where the answer comes from (a public source, failures.md)

    @field_validator("outcome")
    @classmethod
    def _outcome(cls, v: str) -> str:
        import catalogue

        if v not in catalogue.outcomes():
            raise ValueError(f"unknown outcome {v!r}; one of {sorted(catalogue.outcomes())}")
        return v

    @field_validator("action")
    @classmethod
    def _action(cls, v: str) -> str:
        import catalogue

        if v not in catalogue.actions():
            raise ValueError(f"unknown action {v!r}; one of {sorted(catalogue.actions())}")
        return v


class FaultSpec(_Strict):
    kind: str
    at_s: float = Field(ge=0)
    node: str | None = None
    gpu: int | None = Field(default=None, ge=0, le=7)
    job: str | None = None  # job name in the scenario
    job_id: str | None = None  # run-time requests name the job by id
    params: dict[str, Any] = Field(default_factory=dict)
    # the stated ground truth of a `log_signature` fault (required in a scenario file; other
    # kinds' truth is their FAULT_KINDS entry)
    truth: FaultTruth | None = None

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if v not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {v!r}; one of {sorted(FAULT_KINDS)}")
        return v

    @model_validator(mode="after")
    def _truth_only_for_signatures(self) -> FaultSpec:
        if self.truth is not None and self.kind != "log_signature":
            raise ValueError(
                f"truth: only a log_signature fault states its truth ({self.kind}'s is "
                "its FAULT_KINDS entry)"
            )
        return self

    @field_validator("node")
    @classmethod
    def _node(cls, v: str | None) -> str | None:
        if v is not None and not NODE_RE.match(v):
            raise ValueError("node name must match " + names.NODE_PATTERN)
        return v

    @field_validator("job_id")
    @classmethod
    def _fault_job_id(cls, v: str | None) -> str | None:
        return _check_job_id(v)


class StaleXid(_Strict):
    """An application XID an earlier job left on a GPU's XID gauge (it holds the last XID
    until the GPU is reset): on it from t=0, under whatever job runs there."""

    node: str
    gpu: int = Field(ge=0, le=7)
    xid: Literal[13, 31, 43]


class BackgroundSpec(_Strict):
    """Benign hardware background (exporters/sim/background.py: rates and their sources):
    correctable ECC errors, PCIe replays and NVLink CRC flits trickling in on healthy GPUs,
    and stale application XIDs. Not a fault: nothing is to blame."""

    scale: float = Field(default=1.0, ge=0, le=10)  # x every rate; 0: perfectly clean GPUs
    stale_xids: list[StaleXid] = Field(default_factory=list)


GapSource = Literal["dcgm", "jobm", "logs", "slurm"]
GAP_SOURCES: tuple[GapSource, ...] = ("dcgm", "jobm", "logs", "slurm")


class GapSpec(_Strict):
    """A monitoring gap: the named exporters go unscraped (their series go stale) from at_s
    for duration_s; the cluster and its jobs run on as before. Not a fault: nothing is to
    blame, and nothing should be drained, requeued or stopped. The in-process benchmark
    gaps every source; the live simulator closes its DCGM listeners (the other sources are
    the real log and Slurm exporters)."""

    at_s: float = Field(ge=0)
    duration_s: float = Field(gt=0, le=86400)
    sources: list[GapSource] = Field(default_factory=lambda: list(GAP_SOURCES), min_length=1)

    def covers(self, source: str, t: float) -> bool:
        return source in self.sources and self.at_s <= t < self.at_s + self.duration_s


class Scenario(_Strict):
    name: str = Field(min_length=1, max_length=128)
    description: str = ""
    seed: int = 0
    start: float = Field(default=1735689600.0, description="unix time of t=0 (2025-01-01)")
    duration_s: float = Field(gt=0, le=14 * 86400)
    interval_s: float = Field(default=5.0, gt=0, le=300)
    nodes: int = Field(default=4, ge=1, le=1024)
    gpus_per_node: int = Field(default=8, ge=1, le=8)
    model_name: str = "NVIDIA H200"
    jobs: list[JobSpec] = Field(default_factory=list)
    faults: list[FaultSpec] = Field(default_factory=list)
    gaps: list[GapSpec] = Field(default_factory=list)
    background: BackgroundSpec = Field(default_factory=BackgroundSpec)
    expect: str | None = Field(default=None, description="'healthy' for a no-fault scenario")

    @model_validator(mode="after")
    def _refs(self) -> Scenario:
        names = [j.name for j in self.jobs]
        if len(set(names)) != len(names):
            raise ValueError("jobs: job names must be unique")
        node_names = {f"node{i + 1}" for i in range(self.nodes)}
        for i, job in enumerate(self.jobs):
            if job.nodes > self.nodes:
                raise ValueError(f"jobs.{i}.nodes: {job.nodes} > cluster nodes {self.nodes}")
        for i, f in enumerate(self.faults):
            if f.job is not None and f.job not in names:
                raise ValueError(f"faults.{i}.job: no job named {f.job!r}")
            if f.node is not None and f.node not in node_names:
                raise ValueError(f"faults.{i}.node: no node {f.node!r} (node1..node{self.nodes})")
            if f.at_s > self.duration_s:
                raise ValueError(f"faults.{i}.at_s: after the end of the scenario")
            if f.kind == "log_signature" and f.truth is None:
                raise ValueError(
                    f"faults.{i}.truth: a log_signature fault states its own truth (outcome, "
                    "action, culprit), written apart from the catalogue entry it injects"
                )
        for i, x in enumerate(self.background.stale_xids):
            if x.node not in node_names:
                raise ValueError(f"background.stale_xids.{i}.node: no node {x.node!r}")
            if x.gpu >= self.gpus_per_node:
                raise ValueError(f"background.stale_xids.{i}.gpu: {x.gpu} out of range")
        for i, g in enumerate(self.gaps):
            if g.at_s > self.duration_s:
                raise ValueError(f"gaps.{i}.at_s: after the end of the scenario")
        return self

    def unscraped(self, source: str, t: float) -> bool:
        """Whether `source`'s exporters go unscraped at scenario time `t`."""
        return any(g.covers(source, t) for g in self.gaps)


def _explain(err: ValidationError, where: str) -> ScenarioError:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        parts.append(f"{loc}: {e['msg']}")
    return ScenarioError(f"{where}: " + "; ".join(parts))


def parse_scenario(data: Any, where: str = "scenario") -> Scenario:
    """Validate a scenario mapping; ScenarioError names the offending field."""
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}: a scenario is a mapping, got {type(data).__name__}")
    try:
        return Scenario.model_validate(data)
    except ValidationError as err:
        raise _explain(err, where) from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario YAML file."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as err:
        raise ScenarioError(f"{p}: cannot read: {err.strerror}") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{p}: not a text file (a scenario is YAML)") from None
    except yaml.YAMLError as err:
        raise ScenarioError(f"{p}: not valid YAML: {err}") from None
    return parse_scenario(data, str(p))


def parse_fault(data: Any) -> FaultSpec:
    """Validate a run-time fault request (at_s defaults to now)."""
    if not isinstance(data, dict):
        raise ScenarioError("fault: a JSON object is required")
    try:
        return FaultSpec.model_validate({"at_s": 0, **data})
    except ValidationError as err:
        raise _explain(err, "fault") from None

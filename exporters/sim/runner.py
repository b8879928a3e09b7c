"""A scenario driving a Cluster: job submissions and faults at their times. Faults that cannot
apply (their job is not running) are recorded as errors, never raised."""

from __future__ import annotations

from typing import Any

from exporters.sim.inject import inject
from exporters.sim.logs import LogSink
from exporters.sim.model import Cluster, SchedulerError
from exporters.sim.scenario import FaultSpec, JobSpec, Scenario

_JOB_FIELDS = (
    "duration_s",
    "step_time_s",
    "init_s",
    "load_s",
    "resume_iter",
    "warmup_s",
    "checkpoint_every_s",
    "checkpoint_s",
    "eval_every_s",
    "eval_s",
    "checkpoint_by",
    "eval_by",
    "eval_log",
    "preprocess_s",
    "preprocess_log",
    "compile_s",
    "global_batch",
    "log_interval",
    "requeue",
    "comment",
)


def job_kwargs(spec: JobSpec) -> dict[str, Any]:
    return {k: getattr(spec, k) for k in _JOB_FIELDS}


class Simulation:
    """Runs `scenario` on a Cluster. `step(dt)` advances; `elapsed` is seconds since t=0."""

    def __init__(
        self,
        scenario: Scenario,
        seed: int | None = None,
        sink: LogSink | None = None,
        start: float | None = None,
        scheduler: str = "sim",
        job_id_base: int = 1000,
        nodes: int | None = None,
    ) -> None:
        self.scenario = scenario
        self.seed = scenario.seed if seed is None else seed
        self.cluster = Cluster(
            nodes or scenario.nodes,
            scenario.gpus_per_node,
            scenario.model_name,
            self.seed,
            scenario.start if start is None else start,
            sink,
            scheduler,
            job_id_base,
            scenario.background,
        )
        self.elapsed = 0.0
        self._jobs = sorted(enumerate(scenario.jobs), key=lambda p: p[1].start_s)
        self._faults: list[FaultSpec] = sorted(scenario.faults, key=lambda f: f.at_s)
        self._base = job_id_base
        self._fault_n = 0
        self.errors: list[dict[str, Any]] = []
        self._due()

    def step(self, dt: float) -> None:
        self.cluster.step(dt)
        self.elapsed += dt
        self._due()

    def _due(self) -> None:
        if self.cluster.scheduler == "sim":
            while self._jobs and self._jobs[0][1].start_s <= self.elapsed:
                i, spec = self._jobs.pop(0)
                self.cluster.submit(
                    spec.name,
                    spec.nodes,
                    spec.gpus_per_node,
                    spec.job_id or str(self._base + i + 1),
                    **job_kwargs(spec),
                )
            if self.elapsed == 0.0:
                self.cluster._schedule()
        while self._faults and self._faults[0].at_s <= self.elapsed:
            self.inject(self._faults.pop(0))

    def inject(self, spec: FaultSpec) -> dict[str, Any]:
        """Inject now; returns the fault record (with `error` instead when it cannot apply)."""
        self._fault_n += 1
        fid = f"f{self._fault_n}"
        try:
            return inject(self.cluster, spec, fid)
        except SchedulerError as err:
            rec = {"fault_id": fid, "kind": spec.kind, "onset": self.cluster.now, "error": str(err)}
            self.errors.append(rec)
            return rec

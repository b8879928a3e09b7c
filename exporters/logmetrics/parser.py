"""Turn log lines into per-job and per-node state, using the catalogue's patterns.

`LogState.feed_job(job_id, lines, now)` and `LogState.feed_kernel(node, lines, now)` update
plain dicts that the exporter's collector reads at scrape time. `now` is the time the lines are
attributed to: the exporter passes min(wall clock, file mtime) so that a backlog read at start
does not look like fresh progress. One read's lines share that time, so a pause line read after
the job's latest progress (a step, a start-up milestone) is dated `ORDER_S` after it: the
detector tells a milestone that ends the start-up (progress and pause at the same time) from
start-up work logged after it (a checkpoint load) by that order alone.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from catalogue import Catalogue, default, names

JOB_ID = names.JOB_ID
NODE = names.NODE
# Slurm's line that ends the job's run (a requeue, a node failure, ...): a restart follows or
# the job is over; on a `JOB` line (a `STEP` one, `<job>.<step>`, ends one step of the run)
RUN_END_PATTERNS = (
    "slurm_job_cancelled",
    "slurm_job_node_failure",
    "slurm_job_preempted",
    "slurm_job_time_limit",
)
ORDER_S = 0.001  # the recordings' time resolution (detector/export.py writes milliseconds)
# A job's output is its owner's text: it names at most this many ranks and nodes as labels
# (a loop printing `rank <i>` would otherwise grow series without end); later ones read as
# unknown (""). Enough for every rank of a 4,096-GPU job to print its own progress.
MAX_LABELS_PER_JOB = 4096


@dataclass
class JobState:
    last_progress: dict[str, float] = field(default_factory=dict)  # rank ("" unknown) -> ts
    iteration: float | None = None
    iteration_seconds: float | None = None
    throughput: float | None = None
    loss: float | None = None
    nan_iterations: float = 0.0
    skipped_iterations: float = 0.0
    last_checkpoint: float | None = None
    last_pause: float | None = None  # a line that begins a pause (catalogue symptom "pause")
    nodes_named: set[str] = field(default_factory=set)  # node labels its lines gave
    _samples: tuple[int, int] | None = None  # (iteration, consumed samples) of the last line


@dataclass
class LogState:
    catalogue: Catalogue = field(default_factory=default)
    jobs: dict[str, JobState] = field(default_factory=dict)
    # (job_id, node, pattern) -> count; job_id "" for kernel lines, node "" when unknown
    pattern_matches: dict[tuple[str, str, str], float] = field(
        default_factory=lambda: defaultdict(float)
    )
    xids: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    lines: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def feed_job(self, job_id: str, lines: list[str], now: float) -> None:
        if not JOB_ID.match(job_id):
            raise ValueError(f"invalid job_id {job_id!r}")
        job = self.jobs.setdefault(job_id, JobState())
        match_line = self.catalogue.match_line
        self.lines["job"] += len(lines)
        for line in lines:
            for m in match_line(line, "job"):
                g = m.groups
                if m.symptom == "progress":  # a step line, or a bar's update (liveness)
                    _progress(job, g, now)
                elif m.pattern == "checkpoint_saved":
                    job.last_checkpoint = now
                elif m.pattern == "training_start":
                    _new_run(job, now)
                elif m.pattern in RUN_END_PATTERNS and "." not in str(g.get("slurm_job_id")):
                    _new_run(job, now)  # the next run's start-up is open from here ...
                    job.last_pause = now + ORDER_S  # ... as start-up work, not a milestone
                if m.symptom == "pause":  # later in the log than any progress read before it
                    latest = max(job.last_progress.values(), default=-math.inf)
                    job.last_pause = latest + ORDER_S if latest >= now else now
                node = g.get("node", "")
                if not isinstance(node, str) or not NODE.match(node):
                    node = ""
                elif node not in job.nodes_named:
                    if len(job.nodes_named) >= MAX_LABELS_PER_JOB:
                        node = ""
                    else:
                        job.nodes_named.add(node)
                self.pattern_matches[(job_id, node, m.pattern)] += 1

    def feed_kernel(self, node: str, lines: list[str], now: float) -> None:
        if not NODE.match(node):
            raise ValueError(f"invalid node {node!r}")
        match_line = self.catalogue.match_line
        self.lines["kernel"] += len(lines)
        for line in lines:
            for m in match_line(line, "kernel"):
                self.pattern_matches[("", node, m.pattern)] += 1
                if m.pattern.startswith("nvrm_xid") and "xid" in m.groups:  # nvrm_xid*
                    self.xids[(node, str(m.groups["xid"]))] += 1

    def forget_job(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)
        for key in [k for k in self.pattern_matches if k[0] == job_id]:
            del self.pattern_matches[key]


def _new_run(job: JobState, now: float) -> None:
    """A start-up milestone or the end of a run: a (re)started run is making progress from now
    (a requeued job's old last-progress time must not read as a hang while it initialises),
    its start-up is a pause until it iterates, and it has no step time of its own yet: the
    earlier run's would read as "iterated" (the long never-started allowance) and is not this
    run's rate."""
    job.last_progress = {"": now}
    job.last_pause = now
    job.iteration_seconds = job.throughput = job._samples = None


def _progress(job: JobState, g: dict, now: float) -> None:
    rank = "" if g.get("rank") is None else str(g["rank"])
    named = len(job.last_progress) - ("" in job.last_progress)
    if rank not in job.last_progress and named >= MAX_LABELS_PER_JOB:
        rank = ""  # past the cap
    job.last_progress[rank] = now
    iteration = g.get("iteration")
    if iteration is not None:
        job.iteration = float(iteration)
    step_ms = g.get("step_ms")
    if step_ms is not None and step_ms >= 0:
        job.iteration_seconds = step_ms / 1000.0
    loss = g.get("loss")
    if loss is not None:
        job.loss = loss
    nan = g.get("nan")
    if nan is not None:
        job.nan_iterations += nan
    elif loss is not None and not math.isfinite(loss):
        job.nan_iterations += 1
    skipped = g.get("skipped")
    if skipped is not None:
        job.skipped_iterations += skipped
    throughput = _throughput(job, g)
    if throughput is not None:
        job.throughput = throughput
    samples = g.get("samples")
    if iteration is not None and samples is not None:
        job._samples = (iteration, samples)


def _throughput(job: JobState, g: dict) -> float | None:
    if "samples_per_second" in g:
        return float(g["samples_per_second"])
    step_ms = g.get("step_ms")
    if not step_ms or step_ms <= 0:
        return None
    if "global_batch_size" in g:
        return g["global_batch_size"] / (step_ms / 1000.0)
    iteration, samples = g.get("iteration"), g.get("samples")
    if job._samples and iteration is not None and samples is not None:
        d_it, d_samples = iteration - job._samples[0], samples - job._samples[1]
        if d_it > 0 and d_samples >= 0:
            return (d_samples / d_it) / (step_ms / 1000.0)
    return None

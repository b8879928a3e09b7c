"""One simulated data-parallel training job: phases, progress, log lines, pending fault events."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from exporters.sim import gpu as G
from exporters.sim import logs
from exporters.sim.logs import LogSink

END_STATES = {"COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT"}
# the last start-up line to the first iteration, measured on one H200 (0.3-0.5 s; failures.md's
# trace: process start to first iteration 8.0 s and 11.9 s, start-up lines just before it)
FIRST_STEP_LEAD_S = 0.5


@dataclass
class Event:
    """Log lines due at time t (and optionally the job's end), planted by a fault."""

    t: float
    lines: list[str]
    fault_id: str
    end: tuple[str, int] | None = None  # (state, exit_code)
    pause: bool = False  # start-up lines: the log parser dates the job's pause from them


@dataclass
class Job:
    job_id: str
    name: str
    nodes_wanted: int
    gpus_per_node: int = 8
    duration_s: float = 3600.0
    step_time_s: float = 1.2
    init_s: float = 20.0
    load_s: float = 0.0  # a checkpoint load before the first step, when there is one to load
    resume_iter: int = 0  # submitted to resume from a checkpoint at this iteration
    warmup_s: float = 60.0
    checkpoint_every_s: float = 600.0
    checkpoint_s: float = 25.0
    eval_every_s: float = 0.0
    eval_s: float = 30.0
    checkpoint_by: str = "all"  # "rank0": rank 0 saves while the others wait in a barrier
    eval_by: str = "all"  # "rank0": rank 0 evaluates while the others wait in a barrier
    eval_log: str = "none"  # "bar": the evaluation prints a tqdm bar (none: silent, Megatron's)
    preprocess_s: float = 0.0  # rank 0 tokenises the data set before the first step ...
    preprocess_log: str = "bar"  # ... printing a bar (or not) while the others wait for it
    compile_s: float = 0.0  # the first step compiles silently after `training ...` (GPUs idle)
    global_batch: int = 512
    log_interval: int = 10
    requeue: bool = True
    comment: str = ""
    external: bool = False  # a real Slurm job that registered; Slurm owns its lifecycle
    # scheduler state
    state: str = "PENDING"
    alloc: list[tuple[str, int]] = field(default_factory=list)  # (node, gpu) by rank
    restarts: int = 0
    exit_code: int = 0
    excluded: list[str] = field(default_factory=list)
    held: bool = False
    not_before: float = 0.0  # a requeue with backoff: not started before this time
    reason: str = "None"
    submit_t: float = 0.0
    start_t: float = 0.0
    end_t: float = 0.0
    pid: int = 0  # the fake pid printed in logs
    os_pid: int = 0  # a real Slurm job's process (job mode), watched for liveness
    # run state
    iteration: float = 0.0
    logged_iter: int = 0
    phase: str = "init"
    phase_end: float = 0.0
    startup_s: float = 0.0  # this run's process start to first iteration (init, load, data)
    preprocessing: tuple[float, float] = (0.0, 0.0)  # this run's rank-0 tokenisation (from, to)
    train_s: float = 0.0
    next_ckpt: float = 0.0
    next_eval: float = 0.0
    ckpt_iter: int = 0
    last_ckpt_t: float = 0.0
    last_progress_t: float = 0.0
    last_pause_t: float = 0.0  # start-up or a checkpoint began (the log says so)
    step_s: float = 0.0
    loss_logged: float = float("nan")
    ever_nodes: list[str] = field(default_factory=list)
    nans: int = 0
    skipped: int = 0
    # fault effects
    stall: str | None = None  # "spin": peers wait in a collective; "host"/"fs": stuck on host
    stuck: set[tuple[str, int]] = field(default_factory=set)  # ranks stuck on the host
    slow: float = 1.0
    slow_host: str | None = None  # host straggler: this node's ranks compute slowly
    nan: bool = False
    oom_gpu: tuple[str, int] | None = None
    thermal_gpus: set[tuple[str, int]] = field(default_factory=set)
    events: list[Event] = field(default_factory=list)

    @property
    def nodes(self) -> list[str]:
        return list(dict.fromkeys(n for n, _ in self.alloc))

    @property
    def train_iters(self) -> int:
        return max(1000, int(self.duration_s / self.step_time_s * 2))

    def rank_of(self, node: str, gpu: int) -> int:
        return self.alloc.index((node, gpu))

    def local_ranks(self, node: str) -> list[int]:
        return [r for r, (n, _) in enumerate(self.alloc) if n == node]

    def start(self, now: float, sink: LogSink) -> None:
        self.state, self.reason, self.start_t, self.phase = "RUNNING", "None", now, "init"
        self.train_s = 0.0
        self.ckpt_iter = max(self.ckpt_iter, self.resume_iter)
        self.ever_nodes += [n for n in self.nodes if n not in self.ever_nodes]
        self.iteration = float(self.ckpt_iter)  # resume from the last checkpoint
        self.logged_iter = self.ckpt_iter
        self.next_ckpt = self.checkpoint_every_s or math.inf
        self.next_eval = self.eval_every_s or math.inf
        self.stall, self.stuck, self.slow, self.slow_host = None, set(), 1.0, None
        self.nan, self.oom_gpu, self.events, self.thermal_gpus = False, None, [], set()
        self.pid = 20000 + (int(self.job_id.split("_")[0]) * 37 + self.restarts * 101) % 40000
        sink.job(
            self.job_id,
            logs.job_header(now, self.job_id, self.name, self.nodes, self.gpus_per_node),
        )
        # the start-up lines come once the processes are up, just before the first iteration
        # (a checkpoint load between them); they open a pause, `training ...` ends the start-up
        load = self.load_s if self.ckpt_iter else 0.0
        self.startup_s = self.init_s + load + self.preprocess_s + self.compile_s
        up = now + max(0.0, self.init_s - FIRST_STEP_LEAD_S)
        lines = logs.startup(self.nodes, self.gpus_per_node, self.pid)
        if load:
            lines += logs.checkpoint_load(self.ckpt_iter, self.name)
            self.events.append(Event(up, lines, "", pause=True))
            lines, up = [], up + load
        self.preprocessing = (up, up + self.preprocess_s)
        if self.preprocess_s:
            if lines:
                self.events.append(Event(up, lines, "", pause=True))
            lines, up = [], up + self.preprocess_s
        ready = logs.training_begins(up)
        self.events.append(Event(up, lines + ready, "", pause=True))
        self._due(now, sink)

    def end(self, now: float, state: str, exit_code: int) -> None:
        self.state, self.exit_code, self.end_t = state, exit_code, now
        self.phase = "ended"

    def advance(self, now: float, dt: float, sink: LogSink, rng: random.Random) -> None:
        """Move the job forward by dt (it ends at `now`)."""
        if self.state != "RUNNING" or self._due(now, sink):
            return
        if not self.external and now - self.start_t >= self.duration_s:
            sink.job(self.job_id, f" [{logs._ts(now)}] [after training is done] exiting.")
            self.end(now, "COMPLETED", 0)
            return
        if self.stall:
            return
        if now - self.start_t < self.startup_s:
            if self._tokenising(now) and self.preprocess_log == "bar":
                start, end = self.preprocessing
                sink.job(self.job_id, logs.tokenizer_bar(now - start, end - start))
                self.last_pause_t = now
            return
        if self.phase in ("ckpt", "eval"):
            if now < self.phase_end:
                if self.phase == "eval" and self.eval_log == "bar":
                    done = self.eval_s - (self.phase_end - now)
                    sink.job(self.job_id, logs.eval_bar(done, self.eval_s))
                return
            if self.phase == "ckpt":
                self.ckpt_iter, self.last_ckpt_t = int(self.iteration), self.phase_end
                sink.job(
                    self.job_id, logs.checkpoint_done(self.phase_end, self.ckpt_iter, self.name)
                )
            else:
                sink.job(
                    self.job_id,
                    logs.validation(self.phase_end, int(self.iteration), self._loss(rng) + 0.05),
                )
                self.phase = "train"
                if self._begin_phase(now, sink):  # a save due at the same step: no step between
                    return
        self.phase = "train"
        self._train(now, dt, sink, rng)

    def _tokenising(self, now: float) -> bool:
        """Rank 0 tokenises the data set now (this run's `preprocessing` window)."""
        start, end = self.preprocessing
        return start <= now < end

    def _due(self, now: float, sink: LogSink) -> bool:
        """Print the lines due by `now`; True when one of them ended the job."""
        for ev in sorted(self.events, key=lambda e: e.t):
            if ev.t <= now:
                self.events.remove(ev)
                sink.job(self.job_id, ev.lines)
                if ev.pause:
                    self.last_pause_t = ev.t
                if ev.end:
                    self.end(ev.t, *ev.end)
                    return True
        return False

    def _train(self, now: float, dt: float, sink: LogSink, rng: random.Random) -> None:
        self.train_s += dt
        warm = 1.0 + 1.5 * max(0.0, 1.0 - self.train_s / self.warmup_s) if self.warmup_s else 1.0
        if self.iteration < self.ckpt_iter + 10 and self.last_ckpt_t:
            warm *= 1.18  # the first ~10 iterations after a save run ~18 % slow (measured)
        step = self.step_time_s * self.slow * warm * (1 + rng.gauss(0, 0.01))
        self.step_s = step
        before = self.iteration
        self.iteration += dt / step
        li = self.log_interval
        while (self.logged_iter // li + 1) * li <= self.iteration:
            it = (self.logged_iter // li + 1) * li
            t = now - dt + (it - before) / (self.iteration - before) * dt
            loss = self.loss_logged = self._loss(rng)
            if self.nan:
                self.nans += li
                self.skipped += li
            sink.job(
                self.job_id,
                logs.progress(
                    t,
                    it,
                    self.train_iters,
                    self.global_batch,
                    step * 1000,
                    loss,
                    3e-4 * min(1.0, it / 2000),
                    0.9 + rng.gauss(0, 0.05),
                    self.skipped,
                    self.nans,
                    420.0 / self.slow / warm,
                ),
            )
            self.logged_iter = it
            self.last_progress_t = t
        self._begin_phase(now, sink)

    def _begin_phase(self, now: float, sink: LogSink) -> bool:
        """Begin an evaluation or a save now when one is due (True); when both are, the
        evaluation first, the save right after it, as Megatron-LM's training loop and Hugging
        Face's Trainer (log, evaluate, save) order them on a shared step."""
        if self.train_s >= self.next_eval:
            self.next_eval += self.eval_every_s
            self.phase, self.phase_end = "eval", now + self.eval_s
        elif self.train_s >= self.next_ckpt:
            self.next_ckpt += self.checkpoint_every_s
            self.phase, self.phase_end = "ckpt", now + self.checkpoint_s
            self.last_pause_t = now
            sink.job(self.job_id, logs.checkpoint_start(now, int(self.iteration), self.name))
        else:
            return False
        return True

    def _loss(self, rng: random.Random) -> float:
        if self.nan:
            return float("nan")
        it = self.iteration
        return 1.9 + 8.5 * math.exp(-it / 700.0) + 0.6 * math.exp(-it / 20000) + rng.gauss(0, 0.02)

    def load(self, node: str, gpu: int, now: float) -> G.Load:
        """What this job's rank on (node, gpu) makes the GPU do now."""
        if self.oom_gpu == (node, gpu):
            return G.Load(99, 0.9, 0.6, 650, 0.5, 1530, 0.999)
        # a fault shows from its onset, also during start-up (a first collective that hangs)
        if self.stall in ("host", "fs") or (node, gpu) in self.stuck:
            return G.HOST_STALL
        if self.stall == "spin":
            return G.SPIN
        if now - self.start_t < self.startup_s:
            if self._tokenising(now) and self.rank_of(node, gpu) > 0:
                return G.SPIN  # waiting in a barrier for rank 0's tokenisation
            return G.INIT  # process up, NCCL init, model build, a checkpoint load, tokenising
        if self.phase in ("ckpt", "eval"):
            by = self.checkpoint_by if self.phase == "ckpt" else self.eval_by
            if by == "rank0" and self.rank_of(node, gpu) > 0:
                return G.SPIN  # waiting for rank 0 in a barrier: NCCL spins (cupy/cupy#3557)
            return G.CKPT if self.phase == "ckpt" else G.EVAL
        base = G.NAN if self.nan else G.TRAIN
        if self.slow > 1.0:
            busy = 1.0 / self.slow
            if self.slow_host == node:  # the slow host: compute stretched by host-side gaps
                return G.HOST_STALL.mix(base, busy)
            if self.slow_host is None and self._thermal_culprit(node, gpu):
                return base
            return G.NCCL_WAIT.mix(base, busy)  # peers: compute, then wait for the straggler
        return base

    def _thermal_culprit(self, node: str, gpu: int) -> bool:
        return (node, gpu) in self.thermal_gpus

"""Physics priors as a detector: judge each GPU from its first sample, no baseline, no peer.

The rules and their per-model thresholds are data (`catalogue/priors.yaml`); this module only
evaluates them. Two rules read the job's log-derived progress as well:

- `idle_hang`: a GPU idle with its memory held while the job makes no progress and no pause
  is open (checkpoint save/load, start-up: the catalogue's `pause` patterns) scores, for jobs
  whose log announces its pauses at all (others are left to the progress detector),
  stall / allowance, allowance = max(`idle_stall_floor_s`, `idle_stall_factor` x the job's p99
  progress gap outside pauses (fitted), or x its last iteration time before a fit);
- `never_started`: a GPU idle with memory held before the job's first progress, or inside a
  pause, of a job none of whose GPUs has been seen busy yet, scores the time since the pause
  began (or the job's age) / an allowance: short (`startup_s` + `startup_per_doubling_s` x
  log2(the job's GPUs): the first collective's communicator init idles every GPU and grows
  with the world size) before the job's first iteration when the log's latest start-up line
  is a milestone (`training_start`: start-up done, it dates progress and pause alike); long
  (`pause_allowance`: the model's `pause_allowance_s`, or, given the progress detector that
  learns the job's pauses, 3 x its longest earlier pause where longer) while start-up work is
  open (a `pause` line after the latest milestone, or before any: checkpoint load, model
  build, compilation), inside a pause after iterating, or when the log says nothing. A job
  with no step time whose GPUs were busy since its latest pause or start-up line began (ever,
  with no log) has started, whatever its log says (a log whose progress lines the catalogue
  does not know reads as "no first step"): no never_started for it; a restarted job's earlier
  run does not start the new one.
  A job whose start-up was seen before (this run's earlier start, or its stored baseline by
  name: `startup_`, from the latest start-up line to the first iteration, measured online)
  gets max(`startup_floor_s`, `startup_factor` x that) after the milestone instead of the
  model's short allowance: a restart that hung where its last start took seconds is caught
  in under a minute, a known slow starter (a silent compile) is left its own time. A wait
  for the first step after a milestone that ended without one (a later milestone came with
  no step between: the restart of a run requeued as not started) leaves the job's next runs
  at least `startup_factor` x that wait, at most `pause_allowance_s`: a silent compile longer
  than the allowance costs one requeue, not a second verdict that stops the job.

A `wait` rule (`spin_wait`: a rank spinning in a collective) after the job's first step is a
hang only when the rank it waits for is stuck. Inside a pause (a checkpoint save) it waits for
the rank that saves: it scores as `never_started` does inside a pause (the time since the pause
began / `pause_allowance_s`). In a live wait (`live_wait`: at least half of the job's GPUs
wait) it waits for a rank that shows life: while the job's log moves (stall under
`live_log_s`, or under `idle_stall_factor` x its p99 progress gap (its iteration time before a
fit) where that is longer, at most `live_log_max_s`: rank 0 evaluating and printing its bar, or
ranks spinning in the slow collectives of a job that logs every 30 s) it scores stall / that,
while a GPU of the job works (the priors' `working`: rank 0 evaluating silently) stall /
`pause_allowance_s`, kept within 0.01..0.99 so that the persistence window holds and a hang,
whose log stops and where nobody works, counts at the rule's score at once. Before the first
step, ranks that wait while some GPU of the job does not wait for a rank alive at start-up:
while its start-up work moves the log (a `pause` line under `live_log_max_s` old: rank 0
tokenising the data set, printing its bar) scored since that line / `live_log_max_s`; where
every GPU not waiting is a main process (its node's first GPU of the job: rank 0 preparing
alone, silently or past its bar, `if rank == 0: download(); barrier()`), as its start-up's
`never_started` (since / that allowance). Rank 0 stuck from the start looks the same: it is a
hang once that allowance is spent; a stuck rank that is no main process is one at once.

The host side (`goodput_gpu_process_cpu_cores`, the rate of the NVML exporter's counter of
the GPU's processes and their children; absent: nothing changes): an idle GPU whose processes
use `host_busy_cores` works on the host (a silent compile, a checkpoint load, rank 0
preparing): its `idle_hang` allowance and its job's `never_started` one are at least
`pause_allowance`, and ranks spinning while it works are in a live wait; a job all of whose
GPUs that do not wait report at most `host_idle_cores` does nothing on the host either, and
after a milestone has `host_idle_startup_s` for `startup_s` (a first batch and a compile are
host work). Thresholds measured of real PyTorch processes (tests/data/real/host-cpu/).

Scores are in the calibrated units (1.0 = alert level). The engine counts a physics score only
once some rule held on every sample of its persistence window, and then at its latest value.

>>> from detector.synthetic import healthy_frame
>>> frame = healthy_frame(jobs=1, nodes=1, gpus=1, steps=2, seed=1)
>>> det = Physics()
>>> float(det.score(frame).max())
0.0
>>> sm = frame.fields.index("DCGM_FI_PROF_SM_ACTIVE")
>>> util = frame.fields.index("DCGM_FI_DEV_GPU_UTIL")
>>> frame.values[0, [util, sm]] = [100.0, 0.008]  # busy by util, one SM spinning
>>> float(det.score(frame)[0]) < 1.0  # its job's log moved 0.6 s ago: a wait for a live rank
True
>>> frame.values[:, frame.fields.index("goodput_job_stall_seconds")] = 30.0  # the log stopped
>>> float(det.score(frame)[0])
2.0
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from catalogue import priors as P
from detector import fields as F
from detector.base import nanpercentile, pause_open
from detector.frame import Frame, JobRows
from detector.memo import Memo
from detector.perjob import PerJob, keep_latest

if TYPE_CHECKING:
    from detector.progress import Progress

FB = "DCGM_FI_DEV_FB_USED"
JOB_RULES = ("idle_hang", "never_started")  # the two rules that read the job's progress


_COMPARE = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


def _holds(x: np.ndarray, op: str, v: float | np.ndarray) -> np.ndarray:
    """`x op v` per row (`v` a number or each row's prior; NaN on either side: False)."""
    with np.errstate(invalid="ignore"):
        if op == "&":
            ok = np.isfinite(x) & np.isfinite(v)
            bits = np.where(ok, v, 0).astype(np.int64)
            return ok & ((np.where(ok, x, 0).astype(np.int64) & bits) != 0)
        return _COMPARE[op](x, v)


def prior_by_model(models: np.ndarray, key: str, pri: P.Priors) -> np.ndarray:
    """Prior `key` of each of `models` (catalogue/priors.yaml; NaN where unset), and NaN last
    for rows without a model code."""
    per = [pri.params(str(m)).get(key, np.nan) for m in models.tolist()]
    return np.array(per + [np.nan], dtype=float)


# the priors' parameter for how long a pause the log announced may last, per GPU model
PAUSE_ALLOWANCE = "pause_allowance_s"


def prior_rows(frame: Frame, key: str, pri: P.Priors | None = None) -> np.ndarray:
    """Each row's prior `key` for its GPU model (NaN where unset)."""
    codes, models = frame.model_codes
    return prior_by_model(models, key, pri or P.load())[codes]


def _instants(frame: Frame) -> np.ndarray:
    """Each row's code of (its job, its time): the rows of one job at one instant share it."""
    if not len(frame):
        return np.zeros(0, dtype=np.int64)
    if frame.time[0] == frame.time[-1]:  # one instant (the engine's cycle): the cached codes
        return frame.job_codes[0]
    return pd.factorize(pd.MultiIndex.from_arrays([frame.job, frame.time]))[0]


def _log2_job_size(codes: np.ndarray) -> np.ndarray:
    """Each row's log2 of the count of its job's GPUs at the same instant (`codes`:
    `_instants`)."""
    return np.log2(np.maximum(np.bincount(codes), 1).astype(float))[codes] if len(codes) else codes


def _as_wait(out: np.ndarray, rows: np.ndarray, cols: np.ndarray, share: np.ndarray) -> None:
    """Score `rows` as a wait, not as their `wait` rules (`cols`): a share of its allowance
    kept within 0.01..0.99, so that the persistence window holds and a wait that stops being
    one counts at the rule's score at once."""
    out[np.ix_(rows, cols)] = 0.0
    out[rows, cols[0]] = np.clip(share, 0.01, 0.99)


def _share_of_job(codes: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Each row's share of its job's rows at the same instant (`codes`: `_instants`) that are
    in `rows` (a mask)."""
    if not rows.any():
        return np.zeros(len(rows))
    n = np.bincount(codes)
    return (np.bincount(codes, weights=rows, minlength=len(n)) / np.maximum(n, 1))[codes]


def _first_of_node(frame: Frame, codes: np.ndarray) -> np.ndarray:
    """Rows whose GPU is the lowest-numbered of its job's on its node at the same instant
    (`codes`: `_instants`): local rank 0, where a job's main process runs."""
    nodes, uniq = frame.node_codes
    key = codes.astype(np.int64) * (len(uniq) + 1) + nodes
    groups, at = np.unique(key, return_inverse=True)
    low = np.full(len(groups), np.iinfo(np.int64).max)
    np.minimum.at(low, at, frame.gpu.astype(np.int64))
    return frame.gpu == low[at]


class Physics(PerJob):
    """Per-GPU physics rules from `catalogue/priors.yaml` (see the module docstring)."""

    name = "physics"
    params = ("path", "min_gaps")
    state_keys = ("gap_", "startup_")
    gap_: np.ndarray
    startup_: np.ndarray  # seconds from the latest start-up line to the first iteration

    def __init__(
        self, path: str | None = None, min_gaps: int = 5, pauses: Progress | None = None
    ) -> None:
        self.path = path
        self.min_gaps = min_gaps
        self.pauses = pauses  # the detector that learns each job's pauses from its log
        self._busy_last: dict[str, float] = {}  # job -> the latest time it was seen busy
        self._busy: tuple[np.ndarray, np.ndarray] | None = None  # (jobs, `_busy_rows`)
        self._models: Memo[dict[str, np.ndarray]] = Memo()  # the priors per model (`_rules`)
        self._startup: dict[str, float] = {}  # job -> its start-up as measured (`_measure`)
        self._waited: dict[str, tuple[float, float]] = {}  # job -> (its milestone, waited since)
        self._at_least: dict[str, float] = {}  # job -> a milestone waited that long, no step
        self._unstarted: set[str] = set()  # jobs seen before their first iteration

    def _started(self, frame: Frame, busy: np.ndarray) -> np.ndarray:
        """Rows of jobs seen busy since their latest pause or start-up line began (or ever, with
        no log) and at or before the row's time, in this frame or earlier ones: a restarted
        job's earlier run, busy before the new run's start-up, has not started this run."""
        t = frame.time
        began = t - np.nan_to_num(frame.col(F.SINCE_PAUSE), nan=np.inf)
        codes, uniq = frame.job_codes
        prev = self._busy_rows(uniq)
        last = prev[codes]
        with np.errstate(invalid="ignore"):
            out = (last >= began) & (last <= t)
        seen = busy & frame.job_named[codes] if len(codes) else busy
        if not seen.any():
            return out
        one = t[0] == t[-1]  # one instant (the engine's cycle)
        if one:
            latest = np.where(np.bincount(codes[seen], minlength=len(uniq)) > 0, t[0], -np.inf)
            out |= np.isfinite(latest[codes]) & (began <= t)
        else:  # a busy row of the row's job in [began, t], by one sorted (job, time) key
            latest = np.full(len(uniq), -np.inf)
            np.maximum.at(latest, codes[seen], t[seen])
            t0, span = t.min(), t.max() - t.min() + 1.0
            keys = np.sort(codes[seen] * span + (t[seen] - t0))
            lo = codes * span + np.clip(began - t0, 0.0, span)
            hi = codes * span + (t - t0)
            out |= np.searchsorted(keys, hi, "right") - np.searchsorted(keys, lo) > 0
        prev = prev.copy()
        fin = np.flatnonzero(np.isfinite(latest))
        prev[fin] = np.fmax(latest[fin], prev[fin])
        self._busy = (uniq, prev)  # written back to `_busy_last` when the jobs change
        return out

    def _busy_rows(self, uniq: np.ndarray) -> np.ndarray:
        """`_busy_last` of each of the frame's jobs (NaN: never busy), and NaN last for rows
        without a code; kept while the frame's jobs are the last frame's (the same array)."""
        if self._busy is not None and self._busy[0] is uniq:
            return self._busy[1]
        self._write_back()
        get = self._busy_last.get
        return np.array([get(j, np.nan) for j in uniq.tolist()] + [np.nan])

    def _write_back(self) -> None:
        """The kept `_busy_rows` into `_busy_last` (the times of the jobs seen busy)."""
        if self._busy is not None:
            uniq, prev = self._busy
            fin = np.flatnonzero(np.isfinite(prev[:-1]))
            self._busy_last.update(zip(uniq[fin].tolist(), prev[fin].tolist(), strict=True))
            self._busy = None

    def drop_jobs(self, jobs: set[str]) -> None:
        super().drop_jobs(jobs)
        self._write_back()
        for job in jobs:  # a start-up stays: a requeued job keeps its id (`KEEP_ENDED`)
            self._busy_last.pop(job, None)
        self._unstarted -= jobs

    def set_job_state(self, job: str, state: dict[str, Any]) -> None:
        super().set_job_state(job, {"startup_": None, **state})  # stored before it was kept

    @property
    def priors(self) -> P.Priors:
        return P.load(self.path)

    def pause_allowance(self, frame: Frame) -> np.ndarray:
        """Per row, how long its job may pause where its log announces one: the pause
        learner's (`pauses`: the GPU model's `pause_allowance_s`, or a multiple of the job's
        own longest pause where longer) or, alone, the model's."""
        if self.pauses is not None:
            return self.pauses.pause_allowance(frame, self.priors)
        return prior_rows(frame, PAUSE_ALLOWANCE, self.priors)

    def _fit_jobs(self, rows: JobRows) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Each job's p99 progress gap outside pauses (stall seconds sampled while healthy)."""
        stall = rows.col(F.STALL_SECONDS)
        gaps = np.isfinite(stall) & ~pause_open(stall, rows.col(F.SINCE_PAUSE))
        p99 = nanpercentile(np.where(gaps, stall, np.nan), 99, axis=1)
        startup = np.array([self._known_startup(j) for j in rows.jobs], dtype=float)
        return gaps.sum(axis=1) >= self.min_gaps, {"gap_": p99, "startup_": startup}

    def _known_startup(self, job: str) -> float:
        """The job's longest start-up as measured by this detector or, failing that, as
        stored (NaN: none)."""
        if job in self._startup:
            return self._startup[job]
        i = self._positions().get(job)
        return np.nan if i is None or self.startup_ is None else float(self.startup_[i])

    def _measure(self, frame: Frame, step: np.ndarray, since_pause: np.ndarray) -> None:
        """Each job's start-up: a job seen with no step yet (this run's), then with one after
        a start-up line logged while the engine watched it, took from that line to the row's
        latest progress (at most one interval more than to its first iteration); the longest
        of its runs is kept."""
        codes, uniq = frame.job_codes
        t = frame.time
        one = len(t) > 0 and t[0] == t[-1]  # one instant: the job values are the first row's
        idx = frame.job_first if one else np.arange(len(t))
        c, t, step, since = codes[idx], t[idx], step[idx], since_pause[idx]
        before = ~np.isfinite(step) & frame.job_named[c]
        if not self._unstarted and not before.any():
            return
        seen = np.full(len(uniq) + 1, np.inf)  # first seen with no step; inf last
        if self._unstarted:
            known = self._unstarted.__contains__
            seen[:-1][np.fromiter(map(known, uniq.tolist()), bool, len(uniq))] = -np.inf
        np.minimum.at(seen, c[before], t[before])
        stall, age = frame.col(F.STALL_SECONDS)[idx], frame.col(F.JOB_AGE)[idx]
        after = np.isfinite(step) & (t > seen[c])
        done = np.full(len(uniq) + 1, -np.inf)
        if after.any():
            rows = np.flatnonzero(after)
            rows = rows[np.lexsort((t[rows], c[rows]))]
            for i in rows[np.r_[True, c[rows][1:] != c[rows][:-1]]].tolist():
                job = str(uniq[c[i]])
                self._unstarted.discard(job)
                done[c[i]] = t[i]
                self._waited.pop(job, None)  # it started: its start-up is measured now
                self._at_least.pop(job, None)
                if stall[i] <= since[i] <= age[i]:  # the line dates this run's start-up
                    took = since[i] - stall[i]  # the longest seen: a cold cache's, say
                    keep_latest(self._startup, job, float(np.fmax(took, self._known_startup(job))))
        last = np.full(len(uniq) + 1, -np.inf)
        np.maximum.at(last, c[before], t[before])
        self._unstarted.update(uniq[np.flatnonzero(last[:-1] > done[:-1])].tolist())

    def _note_waits(
        self, names: list[str], at: np.ndarray, t: np.ndarray, since: np.ndarray
    ) -> None:
        """Each job's wait for its first step since its latest start-up milestone (rows at `t`
        `since` it, `at` their index in `names`; one instant at a time, as the service and
        replay score). A later milestone with no step between (a restart: a requeued job keeps
        its id; kept while the job is out of the running set) ends a wait: the job's start-up
        takes at least that long, or that run hung. Two milestones of one start-up with an
        idle wait between count so too (an allowance only ever longer)."""
        with np.errstate(invalid="ignore"):
            mark, waited = np.full(len(names), -np.inf), np.full(len(names), -np.inf)
            np.maximum.at(mark, at, np.nan_to_num(t - since, nan=-np.inf))
            np.maximum.at(waited, at, np.nan_to_num(since, nan=-np.inf))
        for job, m, w in zip(names, mark.tolist(), waited.tolist(), strict=True):
            if not np.isfinite(w):
                continue
            m0, w0 = self._waited.get(job, (m, 0.0))
            if m > m0 + 1.0:  # a new milestone (the clocks agree within a second)
                if w0 > self._at_least.get(job, 0.0):  # that wait ended with no step
                    keep_latest(self._at_least, job, w0)
                m0, w0 = m, 0.0
            keep_latest(self._waited, job, (max(m0, m), max(w0, w)))

    def live_wait(self, frame: Frame) -> np.ndarray:
        """Rows of jobs past their first step, no pause open, at least half of whose GPUs wait
        (a `wait` rule holds) while the job's log moved within its live window or, for under
        `pause_allowance_s` of silence, another GPU of it works (`working`): the ranks wait
        for one that is alive (rank 0 evaluating), not for a stuck one; and, before the first
        step, the waiting GPUs of a job whose start-up work moves its log or that waits for its
        main processes within the start-up's allowance (see the module docstring: the rank
        doing that work is left to the engine's pause rule)."""
        return self._rules(frame)[2]

    def _rules(self, frame: Frame) -> tuple[np.ndarray, tuple[str, ...], np.ndarray]:
        """(n, rules) scores, the rule id of each column and the rows in a live wait; once per
        frame while it is unchanged (an engine step: the engine reads `live_wait` too)."""
        return frame.derived(("physics", id(self)), lambda: self._evaluate(frame))

    def _evaluate(self, frame: Frame) -> tuple[np.ndarray, tuple[str, ...], np.ndarray]:
        pri = self.priors
        ids = tuple(dict.fromkeys(r.id for r in pri.rules)) + JOB_RULES
        out = np.zeros((len(frame), len(ids)), order="F")  # column-major: a fast row max
        if not len(frame):
            return out, ids, np.zeros(0, dtype=bool)
        mcodes, models = frame.model_codes
        table = self._models.get((models, pri), dict)  # key -> value per model, NaN last
        one = len(models) == 1 and bool((mcodes >= 0).all())  # one model: a number will do

        def prior(key: str) -> np.ndarray:
            if key not in table:
                table[key] = prior_by_model(models, key, pri)
            return table[key][0] if one else table[key][mcodes]

        codes = self._codes(frame)
        gap = np.full(len(frame), np.nan)
        known = codes >= 0
        if known.any():
            gap[known] = self.gap_[codes[known]]
        stall = frame.col(F.STALL_SECONDS)
        since_pause = frame.col(F.SINCE_PAUSE)
        announced = np.isfinite(since_pause)  # the job's log says when it pauses
        paused = pause_open(stall, since_pause)
        step = frame.col(F.ITER_SECONDS)
        with np.errstate(invalid="ignore"):  # before the first step, a milestone is the latest
            ready = ~np.isfinite(step) & (since_pause == stall)
        age = frame.col(F.JOB_AGE)
        util = frame.col(F.UTIL)
        fb = frame.col(FB)
        with np.errstate(invalid="ignore"):
            busy = util > prior("idle_util_max")
            held = (util <= prior("idle_util_max")) & (fb >= prior("fb_held_min_mib"))
        started = self._started(frame, busy)
        instants = _instants(frame)  # (job, time) codes: the sizes and shares of jobs below
        self._measure(frame, step, since_pause)

        def holds(clauses: tuple[P.Clause, ...]) -> np.ndarray:
            hit = np.ones(len(frame), dtype=bool)
            for c in clauses:
                if c.field not in frame.fields:
                    return np.zeros(len(frame), dtype=bool)
                value = prior(c.value) if isinstance(c.value, str) else c.value
                hit &= _holds(frame.col(c.field), c.op, value)
            return hit

        waits = np.zeros(len(frame), dtype=bool)  # a `wait` rule holds
        for rule in pri.rules:
            hit = holds(rule.when)
            col = ids.index(rule.id)
            out[hit, col] = np.fmax(out[hit, col], rule.score)
            if rule.wait:
                waits |= hit
        idle_col, wait_col = len(ids) - 2, len(ids) - 1
        # the host side (the GPU's processes and their children, in cores; NaN: not reported):
        # an idle GPU whose processes work on the host (a silent compile, a checkpoint being
        # unpickled, rank 0 tokenising) is alive; a job none of whose GPUs that do not wait
        # for a rank (a spinning rank's host thread spins with it) shows host work is idle
        host = frame.col(F.HOST_CPU)
        with np.errstate(invalid="ignore"):
            on_host = held & (host >= prior("host_busy_cores"))
            rests = host <= prior("host_idle_cores")
        not_waiting = ~waits
        host_works = _share_of_job(instants, not_waiting & on_host) > 0
        host_rests = (_share_of_job(instants, not_waiting) > 0) & (
            _share_of_job(instants, not_waiting & ~rests) == 0
        )
        base = np.where(np.isfinite(gap), gap, np.nan_to_num(step))
        allow = np.fmax(prior("idle_stall_floor_s"), prior("idle_stall_factor") * base)
        if on_host.any():  # idle on the GPU while working on the host: a pause's allowance
            allow = np.where(on_host, np.fmax(allow, self.pause_allowance(frame)), allow)
        idle = held & announced & np.isfinite(stall) & ~paused
        out[idle, idle_col] = stall[idle] / allow[idle]
        waiting = held & (~np.isfinite(stall) | paused) & ~(started & ~np.isfinite(step))
        # after iterating, a rank waits (a `wait` rule) for the one that saves inside a pause
        # (scored by the pause's allowance below), or in a live wait for one whose log moves
        # or whose GPU works (`working`: silent work, allowed `pause_allowance_s`)
        iterated = waits & np.isfinite(step)
        inside, after = iterated & paused, iterated & ~paused
        cols = np.array([ids.index(i) for i in dict.fromkeys(r.id for r in pri.rules if r.wait)])
        live = np.zeros(len(frame), dtype=bool)
        if after.any():
            works = on_host.copy()  # a rank that works on the host is alive too
            for alt in pri.working:
                works |= holds(alt)
            # the log moves while it is silent for less than live_log_s, or than its own cadence
            # (a job logging every 30 s whose ranks spin in slow collectives is not hung), at
            # most live_log_max_s (a p99 gap a silent evaluation stretched hides no hang long)
            live_s = np.clip(
                prior("idle_stall_factor") * base, prior("live_log_s"), prior("live_log_max_s")
            )
            allowance = np.broadcast_to(prior(PAUSE_ALLOWANCE), len(frame))
            with np.errstate(invalid="ignore"):
                moves = stall < live_s
                worker = _share_of_job(instants, works & np.isfinite(step) & ~paused) > 0
                # most of the job waits for the rest (rank 0 evaluating while the others
                # wait); one GPU alone at a spin's power among working peers is not that (a
                # power-braked straggler, seen where dcgm reports no SM activity)
                most = _share_of_job(instants, after) >= 0.5
                live = most & (moves | worker & (stall < allowance))
            lw = np.flatnonzero(live & after)
            _as_wait(out, lw, cols, stall[lw] / np.where(moves[lw], live_s[lw], allowance[lw]))
        if inside.any():
            out[np.ix_(np.flatnonzero(inside), cols)] = 0.0
            waiting |= inside
        # before the first step, ranks that wait while another does not wait for a live rank:
        # one whose start-up work moves the log (a `pause` line within live_log_max_s: rank 0
        # tokenising the data set with its bar, an update per batch, while the others wait in
        # a barrier, hiyouga/LlamaFactory#2424), scored since that line / live_log_max_s; or,
        # silent, only main processes (each node's first GPU of the job: `main_process_first`,
        # `if rank == 0: download(); barrier()`, mosaicml/llm-foundry#716), scored as that
        # start-up's never_started; another rank stuck while rank 0 waits (ranks stuck in
        # their first data fetch, dylanyunlon/Neuron_SP#73) is a hang at once
        pre = waits & ~np.isfinite(step)
        moving, by_main = np.zeros(len(frame), dtype=bool), np.zeros(len(frame), dtype=bool)
        if pre.any():
            window = np.broadcast_to(prior("live_log_max_s"), len(frame))
            pre &= _share_of_job(instants, ~waits) > 0
            with np.errstate(invalid="ignore"):
                moving = pre & paused & ~ready & (since_pause < window)
            mv = np.flatnonzero(moving)
            _as_wait(out, mv, cols, since_pause[mv] / window[mv])
            lone = ~waits & ~_first_of_node(frame, instants)
            by_main = pre & ~moving & (_share_of_job(instants, lone) == 0)
        since = np.where(paused, since_pause, age)
        allow = self._startup_allowance(
            frame, prior, waiting | by_main, ready, since, instants, (host_works, host_rests)
        )
        out[waiting, wait_col] = np.nan_to_num(since[waiting]) / allow[waiting]
        bm = np.flatnonzero(by_main)
        share = np.nan_to_num(since[bm], nan=np.inf) / allow[bm]
        bm, share = bm[share < 1.0], share[share < 1.0]  # past it, the wait is a hang
        _as_wait(out, bm, cols, share)
        live |= moving
        live[bm] = True
        return out, ids, live

    def _startup_allowance(
        self,
        frame: Frame,
        prior: Callable[[str], np.ndarray],
        rows: np.ndarray,
        ready: np.ndarray,
        since: np.ndarray,
        instants: np.ndarray,
        host: tuple[np.ndarray, np.ndarray],
    ) -> np.ndarray:
        """never_started's allowance per row (meant for `rows`, the GPUs idle or waiting
        before the job started): after a milestone (`ready`) the model's short one
        (`host_idle_startup_s` for `startup_s` where the job's processes rest on the host:
        `host` = (works, rests) per row, nothing compiles or loads), or
        max(`startup_floor_s`, `startup_factor` x the job's own start-up) where it was seen,
        stretched to `startup_factor` x the wait a run ended in (requeued as not started),
        at most `pause_allowance_s`, so a silent compile longer than the allowance costs one
        requeue, not a stop on the same verdict again; else the job's pause allowance
        (`pause_allowance`), at least that where they work on the host. Notes the waits of
        `rows` on the way (`_note_waits`)."""
        works, rests = host
        first = np.where(rests, prior("host_idle_startup_s"), prior("startup_s"))
        short = first + prior("startup_per_doubling_s") * _log2_job_size(instants)
        seen = np.flatnonzero(rows & ready)
        if seen.size:
            jobs, at = np.unique(frame.job_codes[0][seen], return_inverse=True)
            names = frame.job_codes[1][jobs].tolist()
            own = np.array([self._known_startup(j) for j in names], dtype=float)[at]
            known = np.isfinite(own)
            mine = seen[known]
            floor = np.broadcast_to(prior("startup_floor_s"), len(frame))[mine]
            factor = np.broadcast_to(prior("startup_factor"), len(frame))
            short[mine] = np.fmax(floor, factor[mine] * own[known])
            self._note_waits(names, at, frame.time[seen], since[seen])
            least = np.array([self._at_least.get(j, np.nan) for j in names], dtype=float)
            longest = np.broadcast_to(prior(PAUSE_ALLOWANCE), len(frame))[seen]
            short[seen] = np.fmax(short[seen], np.minimum(factor[seen] * least[at], longest))
        pause = self.pause_allowance(frame)
        allow = np.where(ready, short, pause)
        return np.where(works, np.fmax(allow, pause), allow)

    def score(self, frame: Frame) -> np.ndarray:
        s = self._rules(frame)[0]
        return s.max(axis=1) if len(s) else np.zeros(0)

    def explain(self, frame: Frame, rows: np.ndarray) -> list[str]:
        s, ids, _ = self._rules(frame.take(rows))
        return [f"physics rule {ids[i]} ({s[k, i]:.2f})" for k, i in enumerate(s.argmax(axis=1))]

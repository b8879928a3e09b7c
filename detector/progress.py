"""The job's own progress: stalls (`Progress`) and step-time slowdowns (`Pace`) against its
baseline."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from catalogue import priors as P
from detector import fields as F
from detector.base import Detector, pause_open, robust, z_crit
from detector.frame import Frame, JobRows
from detector.perjob import PerJob, keep_latest
from detector.physics import PAUSE_ALLOWANCE, prior_rows
from detector.thresholds import level

_PER_JOB = (F.STALL_SECONDS, F.ITER_SECONDS, F.SINCE_PAUSE)  # one value per job in a cycle


def _fmax(a: float, b: float) -> float:
    """`np.fmax` of two floats (NaN only where both are) without numpy's per-call cost: it
    runs per job and cycle."""
    return b if a != a or b > a else a


class Seen(NamedTuple):
    """A job's latest pause as the progress detector saw it open."""

    began: float  # when (the log's pause line)
    ran: float  # how long it had run when last seen
    longest: float  # the longest of the job's earlier pauses (NaN: none)
    step: float  # the job's step time when it began (NaN: not known)
    trained: bool = False  # a step time other than `step` was seen after it: training resumed
    saved: bool = False  # an earlier pause began after a step (a save, not start-up): of this
    # run, or of the job's earlier one where a quick requeue kept it in the running set


class Early(NamedTuple):
    """A job's step times before its first fit, as its log reported them (kept across its runs
    until it is fitted: a requeued job keeps its id, and its restart settles before it is
    compared)."""

    fastest: float  # the fastest step held over two lines so far (inf: none yet); a run's
    # first steps run slow, and a single line may run fast (a real H200's first: 76 ms at 85)
    line: float  # when the latest progress line was logged
    last: float  # its step time
    prev: float  # the step time of the line before it (NaN: none yet)


class Progress(PerJob):
    """The job's own progress: its score is the stall (time since last progress); the
    step-time slowdown it works out beside it is `Pace`'s score.

    Fit learns the job's median step time, its robust spread (log scale), and the longest
    progress gap seen while healthy (checkpoints, evals); the longest pause its log announced
    is learned online from the announcements. Stall score = stall / allowance, with
    allowance = max(`stall_factor` x step, 1.5 x longest healthy gap, `min_stall_s`) (or
    `unfitted_stall_s` before a baseline exists), inside a pause at least `pause_factor` x
    the longest pause seen before it (a save runs long on a busy filesystem), and inside a
    run's start-up or its first save long enough that its alert fires only once
    `pause_allowance` is spent (the GPU model's, or that multiple where longer: pauses are
    kept across the job's runs);
    slowdown score = robust z of log step time / z_crit(p), 0 after a pause began for 1.5 x
    the longest pause seen (`unknown_pause_s` before one was seen), or the pause as it ran
    when longer (until the step time moves, when a bar closed it), plus max(`after_pause_s`,
    30 steps): the first steps after a checkpoint or a restart run slow. Before a job's first
    fit, its latest two logged steps (the faster of them) against the fastest it held over two
    lines so far, with `early_floor` as the spread, scored only from the alert level on (a
    fault after the first steps and before the first fit: the fit never learns it, since its
    rows are not calm; a job that settles a little slower than its first steps is still
    learned). Catches hangs that GPU metrics disguise (spin-wait at 100 % util).

    >>> import numpy as np
    >>> from detector.synthetic import healthy_frame
    >>> det = Progress().fit(healthy_frame(jobs=1, nodes=1, steps=60, seed=4))
    >>> test = healthy_frame(jobs=1, nodes=1, steps=2, seed=5, start=900.0)
    >>> bool(det.score(test).max() < 1.0)
    True
    >>> test.values[:, test.fields.index("goodput_job_stall_seconds")] = 600.0  # no progress
    >>> bool(det.score(test).min() > 1.0)
    True
    """

    name = "progress"
    params = (
        "p",
        "stall_factor",
        "min_stall_s",
        "unfitted_stall_s",
        "rel_floor",
        "after_pause_s",
        "unknown_pause_s",
        "pause_factor",
        "early_floor",
    )
    state_keys = ("step_", "step_scale_", "gap_", "pause_")
    pause_: np.ndarray
    step_: np.ndarray
    step_scale_: np.ndarray
    gap_: np.ndarray

    def __init__(
        self,
        p: float = 1e-4,
        stall_factor: float = 10.0,
        min_stall_s: float = 180.0,
        unfitted_stall_s: float = 300.0,
        rel_floor: float = 0.05,
        after_pause_s: float = 10.0,
        unknown_pause_s: float = 30.0,
        pause_factor: float = 3.0,
        early_floor: float = 0.08,
    ) -> None:
        self.p = p
        self.stall_factor = stall_factor
        self.min_stall_s = min_stall_s
        self.unfitted_stall_s = unfitted_stall_s
        self.rel_floor = rel_floor
        self.after_pause_s = after_pause_s
        self.unknown_pause_s = unknown_pause_s
        self.pause_factor = pause_factor
        self.early_floor = early_floor
        self._early: dict[str, Early] = {}  # running job -> its steps before its first fit
        self._early_ended: dict[str, Early] = {}  # ... of the latest jobs that left unfitted
        self._pauses: dict[str, Seen] = {}  # job -> its latest pause seen open
        self._ended: dict[str, float] = {}  # job -> the longest pause of its runs that left
        self._cut: dict[str, float] = {}  # job -> the longest pause a run left inside (requeued)

    def _fit_jobs(self, rows: JobRows) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Each job's typical step (median and MAD of log step times, at least 3) and its
        longest progress gap, all jobs in one pass, and its longest pause seen
        (`_known_pause`)."""
        it = rows.col(F.ITER_SECONDS)
        stall = rows.col(F.STALL_SECONDS)
        with np.errstate(invalid="ignore", divide="ignore"):
            good = np.isfinite(it) & (it > 0)
            med, mad = robust(np.log(np.where(good, it, np.nan)), axis=1)
        longest = np.fmax.reduce(stall, axis=1)
        pause = np.array([self._known_pause(j) for j in rows.jobs], dtype=float)
        ok = good.sum(axis=1) >= 3
        for i in np.flatnonzero(ok).tolist():  # compared with its fit from now on
            self._early.pop(rows.jobs[i], None)
        return ok, {
            "step_": np.exp(med),
            "step_scale_": np.fmax(mad, self.rel_floor),
            "gap_": np.where(np.isfinite(stall).any(axis=1), longest, 0.0),
            "pause_": np.nan_to_num(pause, nan=0.0),
        }

    def _known_pause(self, job: str) -> float:
        """The job's longest announced pause that ended, as seen by this detector (its latest
        only once training resumed after it: a pause still open, refitted mid-way, would
        stretch its own allowance), in its runs that left, or as stored (NaN: none)."""
        seen = self._pauses.get(job)
        mine = np.nan if seen is None else _fmax(seen.longest, seen.ran if seen.trained else np.nan)
        i = self._positions().get(job)
        stored = np.nan if i is None else float(self._stored(np.array([i]))[0])
        return _fmax(_fmax(mine, self._ended.get(job, np.nan)), stored)

    def _stored(self, codes: np.ndarray) -> np.ndarray:
        """The longest pause stored in each fitted job's state (`codes` >= 0; NaN: none)."""
        out = np.full(len(codes), np.nan)
        if self.pause_ is not None and (codes >= 0).any():
            kept = self.pause_[codes[codes >= 0]]
            out[codes >= 0] = np.where(kept > 0, kept, np.nan)
        return out

    def _parts(self, frame: Frame) -> tuple[np.ndarray, np.ndarray]:
        """(stall score, slow score) per row; worked out per job when the frame has the
        progress fields per job (a service cycle), then given to each of its rows."""
        one = frame.one_per_job(_PER_JOB)
        sel = slice(None) if one is None else one[0]
        stall = frame.col(F.STALL_SECONDS)[sel]
        it = frame.col(F.ITER_SECONDS)[sel]
        since = frame.col(F.SINCE_PAUSE)[sel]
        codes = self._codes(frame)[sel]
        ran, usual, before, saved = self._pauses_seen(frame, sel, stall, since, codes, it)
        allow, slow = self._allow_slow(codes, it, since, ran, usual, before)
        early = self._early_slow(frame, sel, codes, (it, stall, since, ran, usual, before))
        slow = np.fmax(slow, early)
        inside = pause_open(stall, since)
        # a pause the log announced waits as long as the physics rules wait on the GPUs
        # (`pause_allowance`) when it is a run's start-up (no step time yet: a fresh job, or a
        # restarted one, whose earlier step time the log parser drops; a requeued job loading
        # a checkpoint for minutes is not a hang) or the job's first save (a 13B model's took
        # 5 minutes, epfLLM/Megatron-LLM#69); a later save `pause_factor` x the longest pause
        # the job was seen to take (one saving in 20 s is stuck long before the model's)
        saving = np.isfinite(it) & inside & np.isfinite(usual) & saved
        allow[saving] = np.fmax(allow[saving], self.pause_factor * usual[saving])
        first = inside & ~saving
        if one is not None:  # each row its job's
            job = one[1]
            stall, allow, slow, first = stall[job], allow[job], slow[job], first[job]
        if first.any():  # its alert (tuned below 1.0) fires once that allowance is spent
            pause = self.pause_allowance(frame)[first] / level("progress")
            allow[first] = np.fmax(allow[first], pause)
        return np.nan_to_num(stall / allow), slow

    def _pauses_seen(
        self,
        frame: Frame,
        sel: np.ndarray | slice,
        stall: np.ndarray,
        since: np.ndarray,
        codes: np.ndarray,
        it: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(how long each job's latest pause ran, the longest of its earlier ones, its step
        time when the pause began, whether a save came before it) as seen open by this
        detector in one-instant frames (a service cycle, which updates them; other frames read
        them; NaN where not seen: the longest as stored, if any; no save: not in this run).
        Learned from the log's own announcements, not from the reservoir's calm rows (the idle
        GPUs of a save alarm the other detectors, so its rows are never calm)."""
        ran, before = np.full(len(stall), np.nan), np.full(len(stall), np.nan)
        usual = self._stored(codes)
        saved = np.zeros(len(stall), dtype=bool)
        rows = np.flatnonzero(np.isfinite(since))
        if not rows.size:
            return ran, usual, before, saved
        t = frame.time[sel][rows]
        jobs = frame.job[sel][rows].tolist()
        began = (t - since[rows]).tolist()
        cycle = isinstance(sel, np.ndarray)  # one row per job at one instant (`one_per_job`)
        opened = pause_open(stall[rows], since[rows])
        for k in np.flatnonzero(opened & cycle).tolist():
            job, took = jobs[k], float(since[rows[k]])
            last = self._pauses.get(job)
            if last is not None and abs(last.began - began[k]) <= 1.0:  # the same pause
                self._pauses[job] = last._replace(ran=took)
            else:  # a new one: the last ended (in this run, or in a run that left)
                longest = (
                    self._ended.get(job, np.nan) if last is None else _fmax(last.longest, last.ran)
                )
                # the step time before it: a save's line follows the last progress line; a
                # start-up milestone dates progress and pause alike (a new run's first step)
                then = float(it[rows[k]]) if since[rows[k]] < stall[rows[k]] else np.nan
                after = last is not None and (last.saved or bool(np.isfinite(last.step)))
                self._pauses[job] = Seen(began[k], took, longest, then, saved=after)
        every, uniq = frame.job_codes
        usual[rows] = np.fmax(usual[rows], self._earlier(every[sel][rows], uniq, np.array(began)))
        caps: np.ndarray | None = None
        for k, job in enumerate(jobs):
            seen = self._pauses.get(job)
            if seen is not None:
                newer = began[k] > seen.began + 1.0  # a pause after the one seen open: it ended
                saved[rows[k]] = seen.saved or newer and math.isfinite(seen.step)
                if abs(seen.began - began[k]) <= 1.0:  # the pause the log dates now
                    if cycle and not opened[k] and not seen.trained:
                        # closed by a bar with no step line since (an evaluation after the
                        # save printing its bar): it runs on until the step time moves, at
                        # most the model's pause allowance (a log rounding its step time may
                        # print the same one for hours of training)
                        if caps is None:
                            caps = prior_rows(frame, PAUSE_ALLOWANCE)[sel]
                        took = float(np.fmin(since[rows[k]], caps[rows[k]]))
                        same = it[rows[k]] == seen.step
                        seen = seen._replace(ran=took) if same else seen._replace(trained=True)
                        self._pauses[job] = seen
                    ran[rows[k]], before[rows[k]] = seen.ran, seen.step
        return ran, usual, before, saved

    def _record(self, job: str, seen: Seen | None) -> tuple[float, float, float]:
        """(the longest pause `job` ended before its latest one, `seen`, a pause a requeue
        cut included; how long that latest one ran; when it began) as this detector saw them
        (NaN: none)."""
        cut = self._cut.get(job, np.nan) if self._cut else np.nan
        if seen is None:
            return _fmax(self._ended.get(job, np.nan), cut), np.nan, np.nan
        return _fmax(seen.longest, cut), seen.ran, seen.began

    def _earlier(self, codes: np.ndarray, uniq: np.ndarray, began: np.ndarray) -> np.ndarray:
        """Per row (`codes` into the job ids `uniq`), the longest pause its job was seen to
        take before the one that began at `began` (`_record`; the latest one too when a later
        one began; NaN: none), looked up only for the jobs of rows with `began` finite."""
        table = np.full((len(uniq), 3), np.nan)
        for c in np.unique(codes[np.isfinite(began)]).tolist():
            table[c] = self._record(uniq[c], self._pauses.get(uniq[c]))
        out, ran, at = table[codes, 0], table[codes, 1], table[codes, 2]
        with np.errstate(invalid="ignore"):
            newer = began > at + 1.0  # a pause after the one seen open: that one ended
        out[newer] = np.fmax(out[newer], ran[newer])
        return out

    def pause_allowance(self, frame: Frame, pri: P.Priors | None = None) -> np.ndarray:
        """Per row inside a pause its job's log announced (start-up work, a save), how long
        it may last before the job's GPUs idling or waiting count as stuck: the GPU model's
        `pause_allowance_s`, or `pause_factor` x the longest pause the job was seen to take
        before this one (in this run, in an earlier run of the same id, the one a requeue
        cut included, in its stored baseline by name) where longer. A job whose saves or
        checkpoint loads outlast the model's allowance (a 70B checkpoint takes about 10
        minutes to write) is flagged once, not at every save or restart; other rows get the
        model's. Read after this detector scored the frame (the engine's order), once per
        frame while it is unchanged (progress, physics and the engine read it in one step)."""

        def compute() -> np.ndarray:
            codes, uniq = frame.job_codes
            since = frame.col(F.SINCE_PAUSE)
            inside = pause_open(frame.col(F.STALL_SECONDS), since)
            usual = self._earlier(codes, uniq, np.where(inside, frame.time - since, np.nan))
            usual = np.fmax(usual, np.where(inside, self._stored(self._codes(frame)), np.nan))
            return np.fmax(prior_rows(frame, PAUSE_ALLOWANCE, pri), self.pause_factor * usual)

        return frame.derived(("pause_allowance", id(self), id(pri)), compute)

    def typical_steps(self, frame: Frame) -> dict[str, np.ndarray]:
        """{job_id, value}: each named job's fitted step time in seconds (its own calm steps,
        or its stored baseline by name), the reference its slowdown score compares with.
        Exported for attribution: a restart slow from its first step has no faster part of
        its own to compare with."""
        return self.per_named_job(frame, "step_")

    def drop_jobs(self, jobs: set[str]) -> None:
        super().drop_jobs(jobs)
        for job in jobs:
            early = self._early.pop(job, None)
            if early is not None:  # left unfitted: its restart under the id is compared with it
                keep_latest(self._early_ended, job, early)
            # its pauses stay: a requeued job keeps its id (`KEEP_ENDED`)
            seen = self._pauses.pop(job, None)
            if seen is None:
                continue
            ended = _fmax(seen.longest, seen.ran if seen.trained else np.nan)
            keep_latest(self._ended, job, _fmax(ended, self._ended.get(job, np.nan)))
            if not seen.trained:  # left inside it: for this id's restart, never stored by name
                keep_latest(self._cut, job, _fmax(seen.ran, self._cut.get(job, np.nan)))

    def _allow_slow(
        self,
        codes: np.ndarray,
        it: np.ndarray,
        since: np.ndarray,
        ran: np.ndarray,
        usual: np.ndarray,
        before: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(stall allowance, slow score) of rows with these job codes and progress fields;
        `ran`, `usual`, `before`: see `_pauses_seen` (NaN: not seen)."""
        allow = np.full(len(codes), self.unfitted_stall_s)
        slow = np.zeros(len(codes))
        known = codes >= 0
        if known.any():
            c = codes[known]
            allow[known] = np.fmax(
                np.fmax(self.stall_factor * self.step_[c], 1.5 * self.gap_[c]), self.min_stall_s
            )

            def z_of(step: np.ndarray) -> np.ndarray:  # robust z of log step time
                return (np.log(step) - np.log(self.step_[c])) / self.step_scale_[c]

            with np.errstate(all="ignore"):
                z = z_of(it[known])
                # the first iterations after a pause (a save, a restart) run slow: measured
                # ~18 % for ~10 iterations on an H200; not a straggler. 1.5 x the longest
                # pause seen, or the pause as it ran when longer; a job already slow when
                # the pause began does not settle (its alert would clear at every save)
                settle = self._settle_s(ran[known], usual[known], self.step_[c])
                was = z_of(before[known])
                settling = (since[known] <= settle) & ~(was >= z_crit(self.p))
            slow[known] = np.where(settling, 0.0, np.nan_to_num(np.fmax(z, 0.0)) / z_crit(self.p))
        return allow, slow

    def _settle_s(self, ran: np.ndarray, usual: np.ndarray, step: np.ndarray) -> np.ndarray:
        """How long after a pause began the first steps after it settle: 1.5 x the longest
        pause seen (`unknown_pause_s` before one was; `usual`), or the pause as it ran when
        longer (`ran`), + max(`after_pause_s`, 30 steps of `step`)."""
        pause = np.where(np.isfinite(usual), usual, self.unknown_pause_s)
        return np.fmax(ran, 1.5 * pause) + np.fmax(self.after_pause_s, 30.0 * step)

    def _early_slow(
        self,
        frame: Frame,
        sel: np.ndarray | slice,
        codes: np.ndarray,
        fields: tuple[np.ndarray, ...],
    ) -> np.ndarray:
        """The slow score of a service cycle's jobs (one row each, `sel`) that have no fit yet:
        the faster of the latest two logged step times against the fastest the job held over
        two lines so far (`Early`), from the alert level on (0 below it), and 0 while the first
        steps after a pause settle (as `_allow_slow`'s, that fastest step as the job's; not for
        a job already that slow when the pause began). Other frames: 0 (the state is of the
        latest cycle)."""
        slow = np.zeros(len(codes))
        if not isinstance(sel, np.ndarray):
            return slow
        it, stall, since, ran, usual, before = fields
        with np.errstate(invalid="ignore"):
            rows = np.flatnonzero((codes < 0) & (it > 0) & np.isfinite(stall))
        if not rows.size:
            return slow
        jobs = frame.job[sel][rows].tolist()
        steps = it[rows].tolist()
        lines = (frame.time[sel][rows] - stall[rows]).tolist()
        ref, cur = np.full(len(rows), np.nan), np.full(len(rows), np.nan)
        for k, job in enumerate(jobs):
            if not job:
                continue
            v, line = steps[k], lines[k]
            seen = self._early.get(job) or self._early_ended.pop(job, None)
            if seen is None:
                seen = Early(math.inf, line, v, np.nan)
            elif line > seen.line + 0.5:  # a new line (a bar's too: the frame cannot tell)
                seen = Early(min(seen.fastest, max(v, seen.last)), line, v, seen.last)
            self._early[job] = seen
            if seen.fastest < math.inf:
                ref[k], cur[k] = seen.fastest, min(seen.last, seen.prev)
        settle = self._settle_s(ran[rows], usual[rows], ref)
        alert = level("pace")

        def score_of(step: np.ndarray) -> np.ndarray:
            return np.log(step / ref) / self.early_floor / z_crit(self.p)

        with np.errstate(all="ignore"):
            score = np.nan_to_num(score_of(cur))
            settling = (since[rows] <= settle) & ~(score_of(before[rows]) >= alert)
        slow[rows] = np.where(settling | (score < alert), 0.0, score)
        return slow

    def parts(self, frame: Frame) -> tuple[np.ndarray, np.ndarray]:
        """(stall score, slow score) per row, worked out once per unchanged frame: this
        detector scores the stall, `Pace` the slowdown."""
        return frame.derived(("progress_parts", id(self)), lambda: self._parts(frame))

    def score(self, frame: Frame) -> np.ndarray:
        return self.parts(frame)[0]

    def explain(self, frame: Frame, rows: np.ndarray) -> list[str]:
        st = frame.col(F.STALL_SECONDS)[rows]
        return [f"no progress for {v:.0f} s" for v in st.tolist()]


class Pace(Detector):
    """The job's step time against the one its `Progress` detector learned: the slowdown
    score described there (robust z of log step time / z_crit(p); 0 while the first steps
    after a pause or a restart settle). A job that still steps, slower, is a straggler or more
    work per step, not a hang: scored apart from the stall so that its alert
    (`GoodputJobSlow`) says so. It keeps no state of its own (the progress detector's fit,
    one stored state).

    >>> from detector.synthetic import healthy_frame
    >>> prog = Progress().fit(healthy_frame(jobs=1, nodes=1, steps=60, seed=4))
    >>> test = healthy_frame(jobs=1, nodes=1, steps=2, seed=5, start=900.0)
    >>> test.values[:, test.fields.index("goodput_job_iteration_seconds")] *= 1.46
    >>> bool(Pace(prog).score(test).min() > 1.0 and prog.score(test).max() < 1.0)
    True
    """

    name = "pace"

    def __init__(self, of: Progress) -> None:
        self.of = of

    def fit(self, frame: Frame) -> Detector:
        return self

    def score(self, frame: Frame) -> np.ndarray:
        return self.of.parts(frame)[1]

    def set_job_state(self, job: str, state: dict[str, Any]) -> None:
        """Nothing of its own: the progress detector's state is its."""

    def explain(self, frame: Frame, rows: np.ndarray) -> list[str]:
        it = frame.col(F.ITER_SECONDS)[rows]
        return [f"step time {v:.3g} s is slower than the job's baseline" for v in it.tolist()]

"""The job's own progress: stalls and step-time slowdowns against its baseline."""

from __future__ import annotations

import numpy as np

from detector import fields as F
from detector.base import nanpercentile, pause_open, robust, z_crit
from detector.frame import Frame, JobRows
from detector.perjob import PerJob
from detector.physics import prior_rows

_PER_JOB = (F.STALL_SECONDS, F.ITER_SECONDS, F.SINCE_PAUSE)  # one value per job in a cycle


class Progress(PerJob):
    """The job's own progress: stall (time since last progress) and step-time slowdown.

    Fit learns the job's median step time, its robust spread (log scale), and the longest
    progress gap seen while healthy (checkpoints, evals). Stall score = stall / allowance, with
    allowance = max(`stall_factor` x step, 1.5 x longest healthy gap, `min_stall_s`) (or
    `unfitted_stall_s` before a baseline exists); slowdown score = robust z of log step time /
    z_crit(p), 0 after a pause began for 1.5 x the job's usual pause length (p99 fitted;
    `unknown_pause_s` before one was seen), or the pause as it ran when longer (seen open by
    this detector), plus max(`after_pause_s`, 30 steps): the first steps after a checkpoint or
    a restart run slow. Catches hangs that GPU metrics disguise (spin-wait at 100 % util).

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
    ) -> None:
        self.p = p
        self.stall_factor = stall_factor
        self.min_stall_s = min_stall_s
        self.unfitted_stall_s = unfitted_stall_s
        self.rel_floor = rel_floor
        self.after_pause_s = after_pause_s
        self.unknown_pause_s = unknown_pause_s
        self._pauses: dict[str, tuple[float, float]] = {}  # job -> its latest pause seen open:
        # (when it began, how long it ran as last seen)

    def _fit_jobs(self, rows: JobRows) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Each job's typical step (median and MAD of log step times, at least 3), its
        longest progress gap and its p99 gap inside pauses, all jobs in one pass."""
        it = rows.col(F.ITER_SECONDS)
        stall = rows.col(F.STALL_SECONDS)
        since = rows.col(F.SINCE_PAUSE)
        with np.errstate(invalid="ignore", divide="ignore"):
            good = np.isfinite(it) & (it > 0)
            med, mad = robust(np.log(np.where(good, it, np.nan)), axis=1)
            paused = np.isfinite(since) & (since <= stall)  # samples inside a pause
        longest = np.fmax.reduce(stall, axis=1)
        pause = nanpercentile(np.where(paused, stall, np.nan), 99, axis=1)
        return good.sum(axis=1) >= 3, {
            "step_": np.exp(med),
            "step_scale_": np.fmax(mad, self.rel_floor),
            "gap_": np.where(np.isfinite(stall).any(axis=1), longest, 0.0),
            "pause_": np.nan_to_num(pause, nan=0.0),
        }

    def _parts(self, frame: Frame) -> tuple[np.ndarray, np.ndarray]:
        """(stall score, slow score) per row; worked out per job when the frame has the
        progress fields per job (a service cycle), then given to each of its rows."""
        one = frame.one_per_job(_PER_JOB)
        sel = slice(None) if one is None else one[0]
        stall = frame.col(F.STALL_SECONDS)[sel]
        it = frame.col(F.ITER_SECONDS)[sel]
        since = frame.col(F.SINCE_PAUSE)[sel]
        ran = self._pause_ran(frame, one, stall, since)
        allow, slow = self._allow_slow(self._codes(frame)[sel], stall, it, since, ran)
        # a run's start-up that its log announces (a pause open, no step time yet: a fresh
        # job, or a restarted one, whose earlier step time the log parser drops) waits as
        # long as the physics priors' start-up work does: a requeued job loading a checkpoint
        # for minutes is not a hang (physics judges that window on the GPUs)
        starting = ~np.isfinite(it) & pause_open(stall, since)
        if one is not None:  # each row its job's
            job = one[1]
            stall, allow, slow, starting = stall[job], allow[job], slow[job], starting[job]
        if starting.any():  # the allowance is the GPU model's
            pause_allowance = prior_rows(frame, "pause_allowance_s")[starting]
            allow[starting] = np.fmax(allow[starting], pause_allowance)
        return np.nan_to_num(stall / allow), slow

    def _pause_ran(
        self,
        frame: Frame,
        one: tuple[np.ndarray, np.ndarray] | None,
        stall: np.ndarray,
        since: np.ndarray,
    ) -> np.ndarray:
        """How long each job's latest pause ran, as seen open in one-instant frames (a service
        cycle; NaN where it was not seen); a pause open now updates its job's."""
        out = np.full(len(stall), np.nan)
        rows = np.flatnonzero(np.isfinite(since))
        if one is None or not rows.size:
            return out
        t = float(frame.time[0])
        jobs = frame.job[one[0]][rows].tolist()
        began = (t - since[rows]).tolist()
        for k in np.flatnonzero(pause_open(stall[rows], since[rows])).tolist():
            self._pauses[jobs[k]] = (began[k], float(since[rows[k]]))
        seen = map(self._pauses.get, jobs)
        out[rows] = [  # the latest seen, if it is the pause the log dates now
            np.nan if p is None or abs(p[0] - b) > 1.0 else p[1]
            for p, b in zip(seen, began, strict=True)
        ]
        return out

    def drop_jobs(self, jobs: set[str]) -> None:
        super().drop_jobs(jobs)
        for job in jobs:
            self._pauses.pop(job, None)

    def _allow_slow(
        self,
        codes: np.ndarray,
        stall: np.ndarray,
        it: np.ndarray,
        since: np.ndarray,
        ran: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(stall allowance, slow score) of rows with these job codes and progress fields;
        `ran`: how long the latest pause ran (NaN: not seen)."""
        allow = np.full(len(codes), self.unfitted_stall_s)
        slow = np.zeros(len(codes))
        known = codes >= 0
        if known.any():
            c = codes[known]
            allow[known] = np.fmax(
                np.fmax(self.stall_factor * self.step_[c], 1.5 * self.gap_[c]), self.min_stall_s
            )
            with np.errstate(all="ignore"):
                z = (np.log(it[known]) - np.log(self.step_[c])) / self.step_scale_[c]
                # the first iterations after a pause (a save, a restart) run slow: measured
                # ~18 % for ~10 iterations on an H200; not a straggler. 1.5 x the usual
                # pause, or the pause as it ran when longer (seen open)
                usual = np.where(self.pause_[c] > 0, self.pause_[c], self.unknown_pause_s)
                length = np.fmax(ran[known], 1.5 * usual)
                settle = length + np.fmax(self.after_pause_s, 30.0 * self.step_[c])
                settling = since[known] <= settle
            slow[known] = np.where(settling, 0.0, np.nan_to_num(np.fmax(z, 0.0)) / z_crit(self.p))
        return allow, slow

    def score(self, frame: Frame) -> np.ndarray:
        stall, slow = self._parts(frame)
        return np.fmax(stall, slow)

    def explain(self, frame: Frame, rows: np.ndarray) -> list[str]:
        stall, slow = self._parts(frame.take(rows))
        st = frame.col(F.STALL_SECONDS)[rows]
        it = frame.col(F.ITER_SECONDS)[rows]
        return [
            f"no progress for {st[i]:.0f} s"
            if stall[i] >= slow[i]
            else f"step time {it[i]:.3g} s is slower than the job's baseline"
            for i in range(len(rows))
        ]

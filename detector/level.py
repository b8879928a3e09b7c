"""`Level`: each job's level of a few series against its own adaptive, unit-free baseline
(`univariate.Bank`: every job's series are rows of one set of arrays, one update per instant)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from detector import fields as F
from detector.base import Detector, group_median, job_medians, pause_open, row_max
from detector.frame import Frame
from detector.memo import Memo
from detector.univariate import Bank

# the job-level series the engine follows: watts, a 0..1 ratio, MiB and seconds, one threshold
SERIES = (
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_DEV_FB_USED",
    "goodput_job_iteration_seconds",
)
K = len(SERIES)
_STEP = SERIES.index(F.ITER_SECONDS)


class Level(Detector):
    """Each job's level of `SERIES` (the median over its GPUs at each instant) against its own
    adaptive baseline (one `Bank` row per job and series, unit-free), learned online.

    The engine scores a cycle, then calls `update` with the jobs whose alert is on: an alerting
    window is never learned (nor taken as a new normal), a sustained shift nobody alerted on is
    (see `univariate`). Samples inside a pause the job's log announced (checkpoint, start-up),
    and while the job settles after one, are neither scored nor learned. Score = max over
    series, Bonferroni-corrected (each series at p / len(SERIES)), so 1.0 is the alert level on
    watts and on ratios alike. State per job:
    each series' level and scale, stored by job name like the other baselines.

    >>> from detector.synthetic import healthy_frame
    >>> det = Level().fit(healthy_frame(jobs=1, nodes=1, steps=60, seed=1))
    >>> test = healthy_frame(jobs=1, nodes=1, steps=1, seed=2, start=600.0)
    >>> bool(det.score(test).max() < 1.0)
    True
    >>> test.values[:, test.fields.index("DCGM_FI_DEV_POWER_USAGE")] *= 0.8  # the job draws less
    >>> bool(det.score(test).min() > 1.0)
    True
    """

    name = "level"
    params = ("p", "relearn_after", "period")

    def __init__(self, p: float = 1e-4, relearn_after: int = 30, period: int | None = None):
        self.p = p
        self.relearn_after = relearn_after
        self.period = period

    def _ensure(self) -> None:
        if not hasattr(self, "bank_"):
            self.bank_ = Bank(self.p / K, self.period, relearn_after=self.relearn_after)
            self.slot_: dict[str, int] = {}  # job -> its rows slot * K ... slot * K + K - 1
            self.free_: list[int] = []  # slots of ended jobs, reused
            self.pause_: dict[str, float] = {}  # each job's longest announced pause (s)
            self._changes = 0  # changes to slot_ and pause_ (the memo's check)
            self._memo: Memo[tuple[np.ndarray, np.ndarray]] = Memo()
            # what scoring an instant computed, for the learning of the same frame: its groups
            # (`_groups`) and its series' scores (frame, rows, values, scores: `_job_z`)
            self._scored: tuple[Any, ...] | None = None
            self._zs: tuple[Frame, np.ndarray, np.ndarray, np.ndarray] | None = None

    def rows(self, job: str) -> np.ndarray | None:
        """The job's `Bank` rows, one per series (None if unknown)."""
        self._ensure()
        s = self.slot_.get(job)
        return None if s is None else s * K + np.arange(K)

    def _slots(self, jobs: np.ndarray, create: bool) -> np.ndarray:
        """Each job's slot (-1 unknown; created on first sight when `create`, not for "")."""
        out = self._per_job(jobs)[0]
        if create and (out < 0).any():
            for j in dict.fromkeys(jobs[out < 0].tolist()):
                if j:
                    self.slot_[j] = self._new_slot()
            self._changes += 1
            out = self._per_job(jobs)[0]
        return out

    def _per_job(self, jobs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each job's slot (-1 unknown) and longest pause (NaN: none seen), kept while the
        jobs and the tables are the last call's (a cycle's jobs are the last one's)."""

        def lookup() -> tuple[np.ndarray, np.ndarray]:
            names = jobs.tolist()
            slot, pause = self.slot_.get, self.pause_.get
            return (
                np.array([slot(j, -1) for j in names], dtype=np.int64),
                np.array([pause(j, np.nan) for j in names], dtype=float),
            )

        return self._memo.get((jobs, self._changes), lookup)

    def _new_slot(self) -> int:
        if self.free_:
            s = self.free_.pop()
            self.bank_.reset(s * K + np.arange(K))
            return s
        return int(self.bank_.add(K)[0]) // K

    @staticmethod
    def _compute(frame: Frame) -> tuple[np.ndarray, ...]:
        columns = (*SERIES, F.SINCE_PAUSE)
        if frame.time[0] == frame.time[-1]:  # one instant (the engine's cycle): by job
            codes, jobs = frame.job_codes
            times = np.full(len(jobs), frame.time[0])
            both = job_medians(frame, columns)  # (shared with peer)
        else:  # groups in time order (frames are sorted by time)
            codes, uniq = pd.factorize(pd.MultiIndex.from_arrays([frame.job, frame.time]))
            jobs = uniq.get_level_values(0).to_numpy(dtype=object)
            times = uniq.get_level_values(1).to_numpy(dtype=float)
            both = group_median(frame.cols(columns), codes, len(jobs))
        n = len(jobs)
        since = frame.col(F.SINCE_PAUSE)
        is_open = np.bincount(codes, pause_open(frame.col(F.STALL_SECONDS), since), n) > 0
        return codes, jobs, times, both, is_open

    def _groups(
        self, frame: Frame, learn: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Row -> (job, instant) group, each group's job and time, and their (g, series)
        medians: NaN while a pause is open and while the job settles after one (its first steps
        run slow), for 1.5 x the job's longest pause seen (30 s before one) + max(10 s, 30
        steps), as `progress` does. `learn` records the pauses' lengths.

        The engine scores an instant, then learns it: scoring keeps what it computed, and
        the learning of the same frame object takes it (all of it unless a pause is to be
        recorded, the medians then) instead of computing it again."""
        last, self._scored = self._scored, None
        if learn and last is not None and last[0] is frame:
            if not last[2]:
                return last[3]
            codes, jobs, times, both, is_open = last[1]
        else:
            codes, jobs, times, both, is_open = computed = self._compute(frame)
        med, sp = both[:, :K].copy(), both[:, K]
        pause = self._per_job(jobs)[1]
        seen = is_open & np.isfinite(sp)
        if learn and seen.any():  # each group knows the pauses up to and including its own
            run = pd.Series(np.where(seen, np.fmax(sp, 0.0), -np.inf)).groupby(jobs).cummax()
            pause = np.fmax(pause, np.where(np.isinf(run), np.nan, run))
            for j, v in zip(jobs[seen].tolist(), pause[seen].tolist(), strict=True):
                self.pause_[j] = max(self.pause_.get(j, 0.0), v)
            self._changes += 1
        settle = 1.5 * np.where(np.isfinite(pause), pause, 30.0) + np.maximum(
            10.0, 30.0 * np.nan_to_num(med[:, _STEP])
        )
        med[is_open | (sp <= settle)] = np.nan
        if not learn:
            self._scored = (frame, computed, bool(seen.any()), (codes, jobs, times, med))
        return codes, jobs, times, med

    def _learn(self, frame: Frame, alerting: set[str]) -> None:
        """Each instant in time order, all its jobs in one `Bank.update`."""
        self._ensure()
        if not len(frame):
            return
        _, jobs, times, med = self._groups(frame, learn=True)
        slot = self._slots(jobs, create=True)
        # a set lookup per job: np.isin on object arrays compares every pair (8 ms at 625 jobs)
        conf = np.zeros(len(jobs), dtype=bool)
        if alerting:
            conf[:] = np.fromiter((j in alerting for j in jobs.tolist()), bool, len(jobs))
        g = np.flatnonzero(slot >= 0)
        g = g[np.argsort(times[g], kind="stable")]
        cuts = np.flatnonzero(np.diff(times[g])) + 1
        last, self._zs = self._zs, None
        for part in np.split(g, cuts) if len(g) else []:
            rows, x = (slot[part][:, None] * K + np.arange(K)).ravel(), med[part].ravel()
            known = None  # the scores this frame's scoring gave the same rows and values
            if last is not None and last[0] is frame and np.array_equal(last[1], rows):
                known = last[3] if np.array_equal(last[2], x, equal_nan=True) else None
            self.bank_.update(rows, x, np.repeat(conf[part], K), known)

    def fit(self, frame: Frame) -> Detector:
        """Learn from a recording: each job's instants in time order, none confirmed."""
        self._learn(frame, set())
        return self

    def update(self, frame: Frame, alerting: set[str]) -> None:
        """Learn this instant: the jobs in `alerting` (their alert is on) are not learned."""
        self._learn(frame, alerting)

    def _job_z(self, frame: Frame) -> tuple[np.ndarray, np.ndarray]:
        """(each row's (job, instant) group; each group's (series) scores)."""
        self._ensure()
        if not len(frame) or not self.slot_:
            return np.zeros(len(frame), dtype=np.int64), np.zeros((1, K))
        codes, jobs, _, med = self._groups(frame)
        slot = self._slots(jobs, create=False)
        per = np.zeros((len(jobs), K))
        k = slot >= 0
        rows, x = (slot[k][:, None] * K + np.arange(K)).ravel(), med[k].ravel()
        z = self.bank_.score(rows, x)
        self._zs = (frame, rows, x, z)  # for the learning of the same instant (`_learn`)
        per[k] = z.reshape(-1, K)
        return codes, per

    def _z(self, frame: Frame) -> np.ndarray:
        codes, per = self._job_z(frame)
        return per[codes]

    def score(self, frame: Frame) -> np.ndarray:
        codes, per = self._job_z(frame)  # a max per group, then one value per row
        return row_max(per)[codes] if len(codes) else np.zeros(0)

    def explain(self, frame: Frame, rows: np.ndarray) -> list[str]:
        z = self._z(frame.take(rows))
        return [
            f"the job's {SERIES[a]} moved {z[i, a]:.2f}x the alert level from its learned level"
            for i, a in enumerate(z.argmax(axis=1))
        ]

    def job_state(self, job: str) -> dict[str, Any] | None:
        rows = self.rows(job)
        if rows is None:
            return None
        level, scale = self.bank_.level_[rows].tolist(), self.bank_.scale_[rows].tolist()
        if not any(map(math.isfinite, level)):  # no series fitted
            return None
        return {
            n: [v, s] if math.isfinite(v) else None
            for n, v, s in zip(SERIES, level, scale, strict=True)
        }

    def set_job_state(self, job: str, state: dict[str, Any]) -> None:
        self._ensure()
        got: dict[int, tuple[float, float]] = {}
        for k, n in enumerate(SERIES):
            v = state.get(n)
            if v is None:
                continue
            level, scale = (float(x) for x in v)
            if not (math.isfinite(level) and math.isfinite(scale) and scale > 0):
                raise ValueError(f"level state for {n}: want a finite level and scale > 0")
            got[k] = (level, scale)
        rows = self.rows(job)
        if rows is None:
            self.slot_[job] = self._new_slot()
            self._changes += 1
            rows = self.rows(job)
            assert rows is not None
        else:
            self.bank_.reset(rows)
        for k, (level, scale) in got.items():
            self.bank_.level_[rows[k]], self.bank_.scale_[rows[k]] = level, scale

    def jobs(self) -> list[str]:
        self._ensure()
        return list(self.slot_)

    def drop_jobs(self, jobs: set[str]) -> None:
        self._ensure()
        for j in jobs:
            s = self.slot_.pop(j, None)
            if s is not None:
                self.free_.append(s)
            self.pause_.pop(j, None)
        self._changes += 1

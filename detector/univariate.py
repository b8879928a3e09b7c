"""An adaptive, unit-free baseline for one series: the same threshold means the same on a
series of milliwatts and one of petabytes, through level shifts and daily cycles.

Each sample's residual from the baseline (level, plus a seasonal profile when a `period` is
given and two periods are learned: statsmodels' STL) is divided by a robust scale, the MAD of
the learned residuals floored at `rel_floor` x the series' own typical magnitude (its median
absolute value, or its spread when that is ~0): no unit appears anywhere. Score =
|residual| / scale / z_crit(p), so 1.0 is the alert level and a fault-free series exceeds it on
a fraction ~p of its samples, whatever its scale.

Learning: calm samples (score below `learn_below`) fill a window of `window` samples; the first
fit comes as soon as `min_fit` are in, then every `refit_every` samples. With a `period`, the
first two periods are learned whole (the cycle is not an anomaly) and the seasonal profile is
fitted once they are in; until then the series is scored against its level only. A sustained shift
(the median score of the last `relearn_after` samples at or above 1.0) that no incident confirmed
(`confirmed=False` in `update`) becomes the new normal: the window restarts from the shifted
samples. Samples inside a confirmed incident are never learned.

>>> import numpy as np
>>> noise = np.random.default_rng(0).standard_normal(400)
>>> for scale in (1e-3, 1e9):  # the same noise in millis or in gigas: the same scores
...     det = Univariate()
...     s = [det.update(v) for v in scale * (5 + noise)]
...     print(int(sum(v >= 1 for v in s[60:])), det.update(scale * 12.0) > 1)
0 True
0 True
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from typing import Any

import numpy as np
import pandas as pd

from detector import fields as F
from detector.base import Detector, group_median, z_crit
from detector.frame import Frame

MAD_TO_SIGMA = 1.4826


class Univariate:
    """Online robust baseline of one series (see the module docstring)."""

    def __init__(
        self,
        p: float = 1e-4,
        period: int | None = None,
        window: int = 512,
        min_fit: int = 30,
        refit_every: int = 60,
        relearn_after: int = 30,
        rel_floor: float = 0.01,
        learn_below: float = 1.0,  # below the alert level: a tighter cut biases the scale low
        robust: str = "mad",
    ) -> None:
        if robust not in ("mad", "qn"):
            raise ValueError(f"robust scale must be 'mad' or 'qn', got {robust!r}")
        self.robust = robust
        self.p = p
        self.period = period
        self.window = max(window, 2 * (period or 0) + 1)
        self.min_fit = min_fit
        self.refit_every = refit_every
        self.relearn_after = relearn_after
        self.rel_floor = rel_floor
        self.learn_below = learn_below
        self.buf_: deque[float] = deque(maxlen=self.window)
        self.phase_: deque[int] = deque(maxlen=self.window)
        self.recent_: deque[tuple[float, int]] = deque(maxlen=relearn_after)
        self.t_ = 0  # samples seen
        self.since_fit_ = 0
        self.level_: float | None = None
        self.season_: np.ndarray | None = None
        self.scale_ = math.inf
        self.relearned_ = 0

    def fitted(self) -> bool:
        return self.level_ is not None

    def _fit(self) -> None:
        x = np.asarray(self.buf_, dtype=float)
        ph = np.asarray(self.phase_, dtype=int)
        season = np.zeros(self.period or 1)
        if self.season_ is not None and len(self.season_) == len(season):
            season = self.season_  # kept until two fresh periods allow a new profile
        if self.period and len(x) >= 2 * self.period + 1:
            from statsmodels.tsa.seasonal import STL

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = STL(x, period=self.period, robust=True).fit()
            prof = np.zeros(self.period)
            for k in range(self.period):  # the seasonal profile by phase of the cycle
                mine = res.seasonal[ph == k]
                prof[k] = float(np.median(mine)) if len(mine) else 0.0
            # smoothed around the cycle: with two periods a phase has two values, and an
            # unsmoothed profile would fit the noise (in-sample residuals too small)
            w = max(3, self.period // 24)
            ring = np.concatenate([prof[-w:], prof, prof[:w]])
            season = np.convolve(ring, np.ones(2 * w + 1) / (2 * w + 1), mode="same")[w:-w]
        level = float(np.median(x - season[ph % len(season)]))
        resid = x - season[ph % len(season)] - level
        if self.robust == "qn" and len(resid) >= 8:
            from statsmodels.robust.scale import qn_scale

            mad = float(qn_scale(resid))
        else:
            mad = float(np.median(np.abs(resid - np.median(resid)))) * MAD_TO_SIGMA
        typical = float(np.median(np.abs(x)))
        spread = float(np.percentile(x, 95) - np.percentile(x, 5))
        floor = self.rel_floor * (typical if typical > 1e-12 * max(spread, 1e-300) else spread)
        self.level_, self.season_ = level, season
        self.scale_ = max(mad, floor, 1e-300)
        self.since_fit_ = 0

    def score(self, x: float, phase: int | None = None) -> float:
        """The score of `x` (at `phase` of the cycle) without learning from it."""
        if self.level_ is None or self.season_ is None or not math.isfinite(x):
            return 0.0
        ph = (self.t_ if phase is None else phase) % len(self.season_)
        z = abs(x - self.level_ - float(self.season_[ph])) / self.scale_
        return min(z / z_crit(self.p), 1e6)

    def update(self, x: float, confirmed: bool = False) -> float:
        """Score `x`, then learn from it (see the module docstring); returns the score."""
        ph = self.t_ % (self.period or 1)
        s = self.score(x, ph)
        self.t_ += 1
        if not math.isfinite(x):
            return s
        if confirmed:
            self.recent_.clear()
            return s
        self.recent_.append((x, ph))
        seasoning = bool(self.period) and self.t_ <= 2 * (self.period or 0) + 1
        if s < self.learn_below or seasoning:  # a cycle is learned whole, over two periods
            self.buf_.append(x)
            self.phase_.append(ph)
            self.since_fit_ += 1
        elif (
            len(self.recent_) == self.relearn_after
            and np.median([self.score(v, k) for v, k in self.recent_]) >= 1.0
        ):  # a sustained shift nobody confirmed: the new normal
            self.buf_.clear()
            self.phase_.clear()
            for v, k in self.recent_:
                self.buf_.append(v)
                self.phase_.append(k)
            self.relearned_ += 1
            self._fit()
            return s
        if (self.level_ is None and len(self.buf_) >= self.min_fit) or (
            self.level_ is not None and self.since_fit_ >= self.refit_every
        ):
            self._fit()
        return s


# the job-level series the engine follows: watts, a 0..1 ratio, MiB and seconds, one threshold
SERIES = (
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_DEV_FB_USED",
    "goodput_job_iteration_seconds",
)


class Level(Detector):
    """Each job's level of `SERIES` (the median over its GPUs at each instant) against its own
    adaptive baseline (`Univariate`, one per series, unit-free), learned online.

    The engine scores a cycle, then calls `update` with the jobs whose alert is on: an alerting
    window is never learned (nor taken as a new normal), a sustained shift nobody alerted on is
    (see `Univariate`). Samples inside a pause the job's log announced (checkpoint, start-up),
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
        if not hasattr(self, "series_"):
            self.series_: dict[str, list[Univariate]] = {}
            self.pause_: dict[str, float] = {}  # each job's longest announced pause (s)

    def _of(self, job: str) -> list[Univariate]:
        """The job's series baselines, created on first sight (not built and thrown away on
        every later one, as `setdefault(job, self._new())` would)."""
        us = self.series_.get(job)
        if us is None:
            us = self.series_[job] = self._new()
        return us

    def _new(self) -> list[Univariate]:
        return [
            Univariate(self.p / len(SERIES), self.period, relearn_after=self.relearn_after)
            for _ in SERIES
        ]

    def _groups(
        self, frame: Frame, learn: bool = False
    ) -> tuple[np.ndarray, list[tuple[str, float]], np.ndarray]:
        """Row -> (job, instant) group, the groups, and their (g, series) medians: NaN while a
        pause is open and while the job settles after one (its first steps run slow), for 1.5 x
        the job's longest pause seen (30 s before one) + max(10 s, 30 steps), as `progress`
        does. `learn` records the pauses' lengths."""
        from detector.physics import _open  # the one definition of an open pause

        if frame.time[0] == frame.time[-1]:  # one instant (the engine's cycle): by job
            codes, jobs = frame.job_codes
            uniq = list(zip(jobs, np.full(len(jobs), frame.time[0]), strict=True))
        else:
            codes, uniq = pd.factorize(pd.MultiIndex.from_arrays([frame.job, frame.time]))
        n = len(uniq)
        med = group_median(frame.cols(SERIES), codes, n)
        since = frame.col(F.SINCE_PAUSE)
        is_open = np.bincount(codes, _open(frame.col(F.STALL_SECONDS), since), n) > 0
        sp = group_median(since[:, None], codes, n)[:, 0]
        groups = [(str(j), float(t)) for j, t in uniq]
        step = np.nan_to_num(med[:, SERIES.index(F.ITER_SECONDS)])
        for g, (job, _) in enumerate(groups):
            if is_open[g] and learn and np.isfinite(sp[g]):
                self.pause_[job] = max(self.pause_.get(job, 0.0), float(sp[g]))
            settle = 1.5 * self.pause_.get(job, 30.0) + max(10.0, 30.0 * step[g])
            if is_open[g] or sp[g] <= settle:
                med[g] = np.nan
        return codes, groups, med

    def fit(self, frame: Frame) -> Detector:
        """Learn from a recording: each job's instants in time order, none confirmed."""
        self._ensure()
        if len(frame):
            _, groups, med = self._groups(frame, learn=True)
            for g in sorted(range(len(groups)), key=lambda g: groups[g][1]):
                job = groups[g][0]
                if job:
                    for u, v in zip(self._of(job), med[g], strict=True):
                        u.update(float(v))
        return self

    def update(self, frame: Frame, alerting: set[str]) -> None:
        """Learn this instant: the jobs in `alerting` (their alert is on) are not learned."""
        self._ensure()
        if not len(frame):
            return
        _, groups, med = self._groups(frame, learn=True)
        for g, (job, _) in enumerate(groups):
            if job:
                on = job in alerting
                for u, v in zip(self._of(job), med[g], strict=True):
                    u.update(float(v), confirmed=on)

    def _z(self, frame: Frame) -> np.ndarray:
        self._ensure()
        out = np.zeros((len(frame), len(SERIES)))
        if not len(frame) or not self.series_:
            return out
        codes, groups, med = self._groups(frame)
        per = np.zeros((len(groups), len(SERIES)))
        for g, (job, _) in enumerate(groups):
            us = self.series_.get(job)
            if us is not None:
                per[g] = [u.score(float(v)) for u, v in zip(us, med[g], strict=True)]
        return per[codes]

    def score(self, frame: Frame) -> np.ndarray:
        z = self._z(frame)
        return z.max(axis=1) if len(z) else np.zeros(0)

    def explain(self, frame: Frame, rows: np.ndarray) -> list[str]:
        z = self._z(frame.take(rows))
        return [
            f"the job's {SERIES[a]} moved {z[i, a]:.2f}x the alert level from its learned level"
            for i, a in enumerate(z.argmax(axis=1))
        ]

    def job_state(self, job: str) -> dict[str, Any] | None:
        self._ensure()
        us = self.series_.get(job)
        if us is None or not any(u.fitted() for u in us):
            return None
        pairs = zip(SERIES, us, strict=True)
        return {n: [u.level_, u.scale_] if u.fitted() else None for n, u in pairs}

    def set_job_state(self, job: str, state: dict[str, Any]) -> None:
        self._ensure()
        us = self._new()
        for n, u in zip(SERIES, us, strict=True):
            v = state.get(n)
            if v is None:
                continue
            level, scale = (float(x) for x in v)
            if not (math.isfinite(level) and math.isfinite(scale) and scale > 0):
                raise ValueError(f"level state for {n}: want a finite level and scale > 0")
            u.level_, u.scale_, u.season_ = level, scale, np.zeros(1)
        self.series_[job] = us

    def jobs(self) -> list[str]:
        self._ensure()
        return list(self.series_)

    def drop_jobs(self, jobs: set[str]) -> None:
        self._ensure()
        for j in jobs:
            self.series_.pop(j, None)
            self.pause_.pop(j, None)

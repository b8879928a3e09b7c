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

import numpy as np

from detector.base import z_crit

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
    ) -> None:
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

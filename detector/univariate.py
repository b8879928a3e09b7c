"""An adaptive, unit-free baseline per series: the same threshold means the same on a series of
milliwatts and one of petabytes, through level shifts and daily cycles. `Bank` holds many
series as arrays (one row each, one vectorised update per instant); `Univariate` is one series.

Each sample's residual from the baseline (level, plus a seasonal profile when a `period` is
given and two periods are learned: statsmodels' STL) is divided by a robust scale, the MAD of
the learned residuals floored at `rel_floor` x the series' own typical magnitude (its median
absolute value, or its spread when that is ~0): no unit appears anywhere. Score =
|residual| / scale / z_crit(p), so 1.0 is the alert level and a fault-free series exceeds it on
a fraction ~p of its samples, whatever its scale.

Learning: calm samples (score below `learn_below`) fill a window of `window` samples; the first
fit comes as soon as `min_fit` are in (and again once `min_fit` are in after a fit on fewer, a
relearn's), then every `refit_every` samples. With a `period`, the
first two periods are learned whole (the cycle is not an anomaly) and the seasonal profile is
fitted once they are in; until then the series is scored against its level only. A sustained shift
(the median score of the last `relearn_after` samples at or above 1.0) that no incident confirmed
(`confirmed=False` in `update`) becomes the new normal: the window restarts from the shifted
samples (those of the last `relearn_after` scoring at or above 1.0, not the ones before the
shift: a window mixing both levels fitted a scale several sigmas wide, under which a later
shift half-scored and was half-learned, alerting for days). Samples inside a confirmed incident
are never learned.

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

import warnings

import numpy as np

from detector.base import (
    MAD_TO_SIGMA,
    nanmedian,
    sorted_distance_median,
    sorted_median,
    sorted_percentile,
    z_crit,
)


class Bank:
    """Many series' baselines (see the module docstring) as arrays, one row per series. Rows
    come from `add` and are cleared by `reset`; `update` and `score` take row indexes (unique
    within one `update`) and one value per row."""

    buf_: np.ndarray
    bph_: np.ndarray
    nbuf_: np.ndarray
    bhead_: np.ndarray
    rec_: np.ndarray
    rph_: np.ndarray
    nrec_: np.ndarray
    rhead_: np.ndarray
    t_: np.ndarray
    since_: np.ndarray
    fitn_: np.ndarray
    prior_: np.ndarray
    level_: np.ndarray
    season_: np.ndarray
    scale_: np.ndarray
    relearned_: np.ndarray

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
        max_refits: int = 128,
    ) -> None:
        if robust not in ("mad", "qn"):
            raise ValueError(f"robust scale must be 'mad' or 'qn', got {robust!r}")
        self.robust = robust
        self.p = p
        self.period = period
        self.window = max(window, 2 * (period or 0) + 1)
        if not 1 <= relearn_after <= self.window:
            raise ValueError(f"relearn_after must be in 1..{self.window}, got {relearn_after}")
        self.min_fit = min_fit
        self.refit_every = refit_every
        # at most this many regular refits per update: rows of jobs that started together
        # come due together (2,500 rows at 10,000 GPUs: 150 ms in one cycle)
        self.max_refits = max_refits
        self.relearn_after = relearn_after
        self.rel_floor = rel_floor
        self.learn_below = learn_below
        self.zc = z_crit(p)
        self.rows = 0  # rows handed out by `add`
        w, r, ps = self.window, relearn_after, period or 1
        # name: (per-row shape, dtype, cleared value)
        self._layout = {
            "buf_": ((w,), float, np.nan),  # the learned window (a ring) ...
            "bph_": ((w,), np.int64, 0),  # ... and each sample's phase of the cycle
            "nbuf_": ((), np.int64, 0),
            "bhead_": ((), np.int64, 0),
            "rec_": ((r,), float, np.nan),  # the last `relearn_after` samples (a ring)
            "rph_": ((r,), np.int64, 0),
            "nrec_": ((), np.int64, 0),
            "rhead_": ((), np.int64, 0),
            "t_": ((), np.int64, 0),  # samples seen
            "since_": ((), np.int64, 0),  # samples learned since the last fit
            "fitn_": ((), np.int64, 0),  # samples the last fit saw
            "prior_": ((), float, 0.0),  # the scale before a relearn, floor of the next fits
            "level_": ((), float, np.nan),  # NaN: not fitted
            "season_": ((ps,), float, 0.0),
            "scale_": ((), float, np.inf),
            "relearned_": ((), np.int64, 0),
        }
        for name, (shape, dtype, fill) in self._layout.items():
            setattr(self, name, np.full((0, *shape), fill, dtype=dtype))

    def __len__(self) -> int:
        return self.rows

    def add(self, k: int) -> np.ndarray:
        """`k` new cleared rows (the arrays grow by doubling)."""
        need, cap = self.rows + k, len(self.t_)
        if need > cap:
            new = max(need, 2 * cap, 16)
            for name, (shape, dtype, fill) in self._layout.items():
                a = np.full((new, *shape), fill, dtype=dtype)
                a[:cap] = getattr(self, name)
                setattr(self, name, a)
        out = np.arange(self.rows, need)
        self.rows = need
        return out

    def reset(self, rows: np.ndarray) -> None:
        """Forget everything the rows learned."""
        for name, (_, _, fill) in self._layout.items():
            getattr(self, name)[rows] = fill

    def fitted(self, rows: np.ndarray) -> np.ndarray:
        return np.isfinite(self.level_[rows])

    def score(self, rows: np.ndarray, x: np.ndarray, phase: np.ndarray | None = None) -> np.ndarray:
        """Scores of `x` (at `phase` of the cycle; default each row's next) without learning."""
        ph = self.t_[rows] if phase is None else phase
        level = self.level_[rows]
        with np.errstate(invalid="ignore", over="ignore"):
            z = np.abs(x - level - self.season_[rows, ph % self.season_.shape[1]])
            z = np.minimum(z / self.scale_[rows] / self.zc, 1e6)
        return np.where(np.isfinite(level) & np.isfinite(x), z, 0.0)

    def update(
        self,
        rows: np.ndarray,
        x: np.ndarray,
        confirmed: np.ndarray,
        scores: np.ndarray | None = None,
    ) -> np.ndarray:
        """Score each row's `x`, then learn from it (see the module docstring). `scores`:
        what `score(rows, x)` just gave, when the caller has it."""
        rows = np.asarray(rows, dtype=np.int64)
        x = np.asarray(x, dtype=float)
        ph = self.t_[rows] % (self.period or 1)
        s = self.score(rows, x, ph) if scores is None else scores
        self.t_[rows] += 1
        fin = np.isfinite(x)
        conf = rows[fin & confirmed]
        self.nrec_[conf] = 0  # an incident: the shift so far is not a new normal
        self.rhead_[conf] = 0
        go = fin & ~confirmed
        r, xv, pv = rows[go], x[go], ph[go]
        h = self.rhead_[r]
        self.rec_[r, h] = xv
        if self.period:  # (phases are all 0 without one)
            self.rph_[r, h] = pv
        self.rhead_[r] = (h + 1) % self.relearn_after
        self.nrec_[r] = np.minimum(self.nrec_[r] + 1, self.relearn_after)
        learn = s[go] < self.learn_below
        if self.period:  # a cycle is learned whole, over two periods
            learn |= self.t_[r] <= 2 * self.period + 1
        self._push(r[learn], xv[learn], pv[learn])
        shifted = self._relearn(r[~learn & (self.nrec_[r] == self.relearn_after)])
        rest = r[~np.isin(r, shifted)] if len(shifted) else r
        fit = self.fitted(rest)
        enough = self.nbuf_[rest] >= self.min_fit  # a fit on fewer (a relearn) is redone then
        first = (~fit & enough) | (fit & enough & (self.fitn_[rest] < self.min_fit))
        regular = rest[fit & ~first & (self.since_[rest] >= self.refit_every)]
        if len(regular) > self.max_refits:  # the longest waiting; the rest next time
            regular = regular[np.argsort(-self.since_[regular], kind="stable")[: self.max_refits]]
        self._fit(np.concatenate([rest[first], regular]))
        return s

    def _push(self, r: np.ndarray, x: np.ndarray, ph: np.ndarray) -> None:
        h = self.bhead_[r]
        self.buf_[r, h] = x
        if self.period:
            self.bph_[r, h] = ph
        self.bhead_[r] = (h + 1) % self.window
        self.nbuf_[r] = np.minimum(self.nbuf_[r] + 1, self.window)
        self.since_[r] += 1

    def _relearn(self, cand: np.ndarray) -> np.ndarray:
        """Rows whose last `relearn_after` samples score at or above 1.0 in the median: a
        sustained shift nobody confirmed, the window restarts from it (the new normal)."""
        if not len(cand):
            return cand
        n = self.relearn_after
        order = (self.rhead_[cand][:, None] + np.arange(n)) % n  # oldest first
        v = np.take_along_axis(self.rec_[cand], order, axis=1)
        k = np.take_along_axis(self.rph_[cand], order, axis=1)
        sc = self.score(np.repeat(cand, n), v.ravel(), k.ravel()).reshape(-1, n)
        hit = np.median(sc, axis=1) >= 1.0
        rows = cand[hit]
        if len(rows):  # the window restarts from the shifted samples alone (those at or over
            # 1.0; the others were learned already): not a mix of the old level and the new
            shifted = sc[hit] >= 1.0
            first = np.argsort(~shifted, axis=1, kind="stable")  # in time order
            m = shifted.sum(axis=1)
            self.buf_[rows] = np.nan
            self.buf_[rows, :n] = np.take_along_axis(v[hit], first, axis=1)
            self.bph_[rows, :n] = np.take_along_axis(k[hit], first, axis=1)
            self.buf_[rows[:, None], np.arange(n)] = np.where(
                np.arange(n) < m[:, None], self.buf_[rows, :n], np.nan
            )
            self.nbuf_[rows], self.bhead_[rows] = m, m % self.window
            self.relearned_[rows] += 1
            self.prior_[rows] = self.scale_[rows]  # a shift moves the level, not the noise
            self._fit(rows)
        return rows

    def _fit(self, rows: np.ndarray) -> None:
        if not len(rows):
            return
        n = self.nbuf_[rows]
        full = bool((n == self.window).all())  # (the usual refit: every window full)
        x = (
            self.buf_[rows]
            if full
            else np.where(np.arange(self.window) < n[:, None], self.buf_[rows], np.nan)
        )
        ph = self.bph_[rows]
        season = self.season_[rows]  # kept until two fresh periods allow a new profile
        if self.period:
            for i in np.flatnonzero(n >= 2 * self.period + 1):
                season[i] = self._profile(int(rows[i]))
        srt = np.sort(x, axis=1)  # shared where it can be: one sort of the window, not three
        count = np.count_nonzero(~np.isnan(x), axis=1)
        median_x = sorted_median(srt, count, 1)
        seasonal = season.any()
        if seasonal:
            x0 = x - np.take_along_axis(season, ph % season.shape[1], axis=1)
            level = nanmedian(x0, 1)
        else:  # no seasonal profile: x0 is x
            x0, level = x, median_x
        if not seasonal and np.isfinite(level).all():  # x less a finite level keeps x's order:
            shifted = srt - level[:, None]  # the residuals sorted, no second sort for either
            centre = sorted_median(shifted, count, 1)
            mad = sorted_distance_median(shifted, count, centre) * MAD_TO_SIGMA
        else:
            resid = x0 - level[:, None]
            centre = nanmedian(resid, 1)
            mad = nanmedian(np.abs(resid - centre[:, None]), 1) * MAD_TO_SIGMA
        if self.robust == "qn":
            from statsmodels.robust.scale import qn_scale

            resid = x0 - level[:, None]
            for i in np.flatnonzero(n >= 8):
                mad[i] = float(qn_scale(resid[i, : n[i]]))
        typical = nanmedian(np.abs(x), 1) if (srt[:, 0] < 0).any() else median_x
        spread = sorted_percentile(srt, n, 95) - sorted_percentile(srt, n, 5)
        floor = self.rel_floor * np.where(
            typical > 1e-12 * np.maximum(spread, 1e-300), typical, spread
        )
        # until the window after a relearn holds `refit_every` samples, its scale (from a few
        # dozen) is held at least at the scale before the shift: a small sample's MAD runs low
        prior = np.where(n < self.refit_every, self.prior_[rows], 0.0)
        self.prior_[rows] = prior
        self.level_[rows], self.season_[rows] = level, season
        self.scale_[rows] = np.fmax(np.fmax(np.fmax(mad, floor), prior), 1e-300)
        self.since_[rows] = 0
        self.fitn_[rows] = n

    def _profile(self, row: int) -> np.ndarray:
        """The seasonal profile of one row's window (in time order): STL, by phase, smoothed."""
        from statsmodels.tsa.seasonal import STL

        assert self.period
        n, w = int(self.nbuf_[row]), self.window
        idx = (self.bhead_[row] - n + np.arange(n)) % w
        x, ph = self.buf_[row, idx], self.bph_[row, idx]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = STL(x, period=self.period, robust=True).fit()
        prof = np.zeros(self.period)
        for k in range(self.period):  # the seasonal profile by phase of the cycle
            mine = res.seasonal[ph == k]
            prof[k] = float(np.median(mine)) if len(mine) else 0.0
        # smoothed around the cycle: with two periods a phase has two values, and an
        # unsmoothed profile would fit the noise (in-sample residuals too small)
        sw = max(3, self.period // 24)
        ring = np.concatenate([prof[-sw:], prof, prof[:sw]])
        return np.convolve(ring, np.ones(2 * sw + 1) / (2 * sw + 1), mode="same")[sw:-sw]


class Univariate:
    """One series' online baseline: a `Bank` of one row (the same code, scalar calls)."""

    def __init__(self, *args: object, **kw: object) -> None:
        self.bank = Bank(*args, **kw)  # type: ignore[arg-type]
        self._row = self.bank.add(1)

    def __getattr__(self, name: str) -> object:  # the parameters: p, period, min_fit, ...
        if name.startswith("_") or name == "bank":
            raise AttributeError(name)
        return getattr(self.bank, name)

    @property
    def relearned_(self) -> int:
        return int(self.bank.relearned_[0])

    @property
    def level_(self) -> float | None:
        v = float(self.bank.level_[0])
        return v if np.isfinite(v) else None

    @property
    def scale_(self) -> float:
        return float(self.bank.scale_[0])

    def fitted(self) -> bool:
        return bool(self.bank.fitted(self._row)[0])

    def score(self, x: float, phase: int | None = None) -> float:
        """The score of `x` (at `phase` of the cycle) without learning from it."""
        ph = None if phase is None else np.array([phase])
        return float(self.bank.score(self._row, np.array([x], dtype=float), ph)[0])

    def update(self, x: float, confirmed: bool = False) -> float:
        """Score `x`, then learn from it; returns the score."""
        return float(
            self.bank.update(self._row, np.array([x], dtype=float), np.array([confirmed]))[0]
        )

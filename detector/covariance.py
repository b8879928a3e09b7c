"""The multivariate view: robust Mahalanobis distance from the job's busy baseline."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from detector import fields as F
from detector.base import FLOORS, robust
from detector.frame import Frame, by_size
from detector.perjob import PerJob


class RobustCovariance(PerJob):
    """Multivariate view: robust Mahalanobis distance of each GPU from its job's busy baseline.

    Fit (per job, outside the scoring loop) standardises the gauges by the robust median and
    the floored MAD-sigma, then fits scikit-learn's MinCovDet (seeded) and keeps its location
    and the whitening matrix W of a regularised precision (covariance + `ridge` x I: one floor
    is one sigma at most; precision = W W^T). Correlations matter: power, clocks and activity
    move together in healthy training, so a spin-wait (util high, power low) is far even
    when each field alone is borderline.
    Score = sqrt(d^2 / chi2.isf(p, k)), k = fields present, d^2 = |W^T (z - loc)|^2: one batched
    matmul per distinct job size, over all jobs at once.
    Idle rows score 0 (whole-job stalls are the progress detector's).

    >>> from detector.synthetic import healthy_frame
    >>> det = RobustCovariance(seed=0).fit(healthy_frame(jobs=1, nodes=1, steps=60, seed=7))
    >>> test = healthy_frame(jobs=1, nodes=1, steps=1, seed=8, start=900.0)
    >>> bool(det.score(test).max() < 1.0)
    True
    >>> test.values[0, test.fields.index("DCGM_FI_DEV_POWER_USAGE")] = 125.0
    >>> bool(det.score(test)[0] > 1.0)
    True
    """

    name = "multivariate"
    params = ("seed", "p", "ridge", "busy_util", "min_rows")
    state_keys = ("med_", "scale_", "loc_", "white_", "k_")
    med_: np.ndarray
    scale_: np.ndarray
    loc_: np.ndarray
    white_: np.ndarray
    k_: np.ndarray

    def __init__(
        self,
        seed: int = 0,
        p: float = 1e-4,
        ridge: float = 0.5,
        busy_util: float = 50.0,
        min_rows: int = 30,
    ) -> None:
        self.seed = seed
        self.p = p
        self.ridge = ridge
        self.busy_util = busy_util
        self.min_rows = min_rows

    def _fit_job(self, frame: Frame) -> dict[str, Any] | None:
        from sklearn.covariance import MinCovDet

        x = frame.cols(F.GAUGE_NAMES)[frame.col(F.UTIL) >= self.busy_util]
        if len(x) < self.min_rows:
            return None
        med, mad = robust(x)
        present = np.isfinite(med)
        scale = np.where(present, np.fmax(np.nan_to_num(mad), FLOORS), 1.0)
        z = np.nan_to_num((x - np.nan_to_num(med)) / scale)[:, present]
        with warnings.catch_warnings():  # constant fields (e.g. memory clock) are expected
            warnings.simplefilter("ignore")
            mcd = MinCovDet(random_state=self.seed, support_fraction=0.75).fit(z)
        k = int(present.sum())
        loc = np.zeros(len(F.GAUGES))
        loc[present] = mcd.location_
        white = np.zeros((len(F.GAUGES), len(F.GAUGES)))
        prec = np.linalg.inv(mcd.covariance_ + self.ridge * np.eye(k))
        white[np.ix_(present, present)] = np.linalg.cholesky((prec + prec.T) / 2)
        return {"med_": med, "scale_": scale, "loc_": loc, "white_": white, "k_": np.array(k)}

    def score(self, frame: Frame) -> np.ndarray:
        from scipy.stats import chi2

        codes = self._codes(frame)
        out = np.zeros(len(frame))
        ok = (codes >= 0) & (frame.col(F.UTIL) >= self.busy_util)
        if not ok.any():
            return out
        c = codes[ok]
        d = np.zeros((len(frame), len(F.GAUGES)))
        z = np.nan_to_num((frame.cols(F.GAUGE_NAMES)[ok] - self.med_[c]) / self.scale_[c])
        d[ok] = z - self.loc_[c]
        d2 = np.zeros(len(frame))
        for g, rows in by_size(np.where(ok, codes, -1), len(self.jobs_)):
            w = np.matmul(d[rows], self.white_[g])  # (g, s, k) @ (g, k, k)
            d2[rows] = np.einsum("gsk,gsk->gs", w, w)
        crit = chi2.isf(self.p, np.maximum(self.k_, 1))
        out[ok] = np.sqrt(np.fmax(d2[ok], 0.0) / crit[c])
        return out

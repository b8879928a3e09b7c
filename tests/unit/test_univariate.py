"""The adaptive univariate baseline keeps its calibration (1.0 = alert level, fault-free
exceedance ~p) on series of any scale, through benign level shifts and a daily cycle."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

import detector.univariate as U
from detector.univariate import Univariate

PERIOD = 288  # one day of 5-minute samples
N = 5 * PERIOD
SHIFTS = ((800, 8.0), (1150, -6.0))  # benign level shifts (in noise sigmas), after the warm-up
SCALES = [1e-3, 10.0, 1e5, 1e9]


def series(scale: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(N)
    x = 5.0 + 3.0 * np.sin(2 * np.pi * t / PERIOD) + rng.standard_normal(N)
    for at, step in SHIFTS:
        x[at:] += step
    return scale * x


def run(x: np.ndarray) -> tuple[np.ndarray, Univariate]:
    det = Univariate(period=PERIOD)
    return np.array([det.update(v) for v in x]), det


def judged(scores: np.ndarray, det: Univariate) -> np.ndarray:
    """Samples after the two-period warm-up, outside the relearning window of each shift."""
    keep = np.arange(N) > 2 * PERIOD + 1
    for at, _ in SHIFTS:
        keep[at : at + det.relearn_after + 1] = False
    return scores[keep]


def test_docstring_example() -> None:
    assert doctest.testmod(U).failed == 0


def test_alert_rate_is_calibrated_and_the_same_at_every_scale() -> None:
    counts = {}
    total = 0
    for scale in SCALES:
        hits = 0
        for seed in range(2):
            scores, det = run(series(scale, seed))
            kept = judged(scores, det)
            hits += int((kept >= 1.0).sum())
            total += len(kept)
            assert det.relearned_ == len(SHIFTS), "each sustained benign shift is learned"
        counts[scale] = hits
    # unit-free: the same noise gives the same alerts whether it is 1e-3 or 1e9 of a unit
    assert len(set(counts.values())) == 1, counts
    # calibrated: p = 1e-4 per sample nominal; allow for the robust scale's estimation error
    rate = sum(counts.values()) / total
    assert rate <= 1e-3, (rate, counts)


@pytest.mark.parametrize("scale", SCALES)
def test_a_real_spike_is_seen_at_every_scale(scale: float) -> None:
    x = series(scale, 7)
    x[1000] += scale * 8.0  # 8 noise sigmas
    scores, _ = run(x)
    assert scores[1000] >= 1.0


def test_a_confirmed_incident_is_never_learned() -> None:
    det = Univariate()
    rng = np.random.default_rng(1)
    for v in 10 + rng.standard_normal(100):
        det.update(v)
    for _ in range(200):  # the shift lasts, but an incident says it is a fault
        det.update(30.0, confirmed=True)
    assert det.relearned_ == 0 and det.score(30.0) >= 1.0
    for _ in range(det.relearn_after):  # nobody confirms it any more: the new normal
        det.update(30.0 + rng.standard_normal())
    assert det.relearned_ == 1 and det.score(30.0) < 1.0


def test_level_detector_is_calibrated_alike_at_every_scale() -> None:
    """The engine's `level` detector (every job's series rows of one array state, STL with an
    explicit period) on jobs whose four series run at 1e-3 ... 1e9 of their unit, with a daily
    cycle and two benign shifts: the same alerts at every scale, at the calibrated rate, and
    each shift learned as the new normal on every series."""
    from detector import fields as F
    from detector.frame import Frame
    from detector.level import SERIES, Level

    period, n = 96, 5 * 96  # one day of 15-minute samples, five days
    shifts = ((267, 8.0), (383, -6.0))
    t = np.arange(n)
    base = 5.0 + 3.0 * np.sin(2 * np.pi * t / period)
    noise = np.random.default_rng(5).standard_normal((len(SERIES), n))  # one per series
    x = base + noise
    for at, step in shifts:
        x[:, at:] += step
    cols = [F.ALL_FIELDS.index(s) for s in SERIES]
    jobs = np.array([str(100 + i) for i in range(len(SCALES))], dtype=object)
    det = Level(period=period)
    scores = np.zeros((n, len(SCALES)))
    for k in range(n):
        values = np.full((len(SCALES), len(F.ALL_FIELDS)), np.nan)
        values[:, cols] = np.outer(SCALES, x[:, k])  # the same noise at every scale
        frame = Frame(
            np.full(len(SCALES), 300.0 * k),
            jobs,
            np.array([f"node{i + 1}" for i in range(len(SCALES))], dtype=object),
            np.zeros(len(SCALES), dtype=np.int64),
            values,
        )
        scores[k] = det.score(frame)
        det.update(frame, set())
    keep = t > 2 * period + 1
    for at, _ in shifts:
        keep[at : at + det.relearn_after + 1] = False
    hits = (scores[keep] >= 1.0).sum(axis=0)
    assert len(set(hits.tolist())) == 1, hits  # unit-free: identical at every scale
    assert hits[0] / keep.sum() <= 1e-3, hits  # calibrated: p = 1e-4 nominal per instant
    for job in jobs:
        rows = det.rows(job)
        assert rows is not None and (det.bank_.relearned_[rows] == len(shifts)).all()
    spike = scores[keep].max(axis=0)
    assert np.ptp(spike) <= 1e-6 * spike.max()  # the same scores, not just the same counts

"""The medians every fit and score takes (`base.nanmedian`, `base.group_median`, both on
`base.sorted_median`) give exactly what `np.nanmedian` gives, except where numpy overflows
averaging an odd count's middle value with itself (that value is kept); the fits' percentiles
(`base.nanpercentile`) exactly what `np.nanpercentile` gives."""

from __future__ import annotations

import warnings

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from detector.base import (
    MAD_TO_SIGMA,
    group_median,
    nanmedian,
    nanpercentile,
    robust,
    sorted_distance_median,
    sorted_median,
)

VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.sampled_from([np.nan, 0.0, -0.0, 1.0, 1e-300, 1e300]),
)


def numpy_median(x: np.ndarray, axis: int) -> np.ndarray:
    """np.nanmedian, with an odd count's middle value as it is (numpy averages it with itself,
    which overflows to inf above half the float range: 8.99e307 -> inf)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        want = np.atleast_1d(np.nanmedian(x, axis=axis))
    if not x.shape[axis]:
        return want
    lines = np.moveaxis(x, axis, -1).reshape(-1, x.shape[axis])
    flat = want.reshape(-1)
    for j, line in enumerate(lines):
        vals = np.sort(line[~np.isnan(line)])
        if len(vals) % 2:
            flat[j] = vals[len(vals) // 2]
    return want


@settings(max_examples=300, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(0, 40), st.integers(1, 6)), elements=VALUES))
def test_columns_match_numpy(x):
    np.testing.assert_array_equal(nanmedian(x, 0), numpy_median(x, 0))


@settings(max_examples=300, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 6), st.integers(1, 40)), elements=VALUES))
def test_rows_match_numpy(x):
    np.testing.assert_array_equal(nanmedian(x, 1), numpy_median(x, 1))


@settings(max_examples=300, deadline=None)
@given(
    arrays(np.float64, st.tuples(st.integers(0, 48), st.integers(1, 5)), elements=VALUES),
    st.data(),
)
def test_group_medians_match_numpy(values, data):
    """Groups of mixed sizes, rows in any order, some codes unused or left out (-1)."""
    n = len(values)
    codes = np.array(data.draw(st.lists(st.integers(-1, 6), min_size=n, max_size=n)), dtype=int)
    got = group_median(values, codes, 8)
    for g in range(8):
        rows = values[codes == g]
        want = numpy_median(rows, 0) if len(rows) else np.full(values.shape[1], np.nan)
        np.testing.assert_array_equal(got[g], want)


def test_a_huge_single_value_is_its_own_median():
    np.testing.assert_array_equal(nanmedian(np.array([[8.98846567e307]]), 0), [8.98846567e307])
    huge = np.array([[8.98846567e307], [1.0], [9e307]])
    np.testing.assert_array_equal(group_median(huge, np.zeros(3, int), 1), [[8.98846567e307]])


def test_robust_on_a_reservoir_with_gaps():
    rng = np.random.default_rng(3)
    x = rng.normal(5.0, 2.0, (256, 12))
    x[rng.random(x.shape) < 0.1] = np.nan
    x[:, 3] = np.nan  # a field the job never reported
    med, mad = robust(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        np.testing.assert_array_equal(med, np.nanmedian(x, axis=0))
        np.testing.assert_array_equal(
            mad, np.nanmedian(np.abs(x - np.nanmedian(x, axis=0)), axis=0) * MAD_TO_SIGMA
        )


FINITE = st.one_of(
    st.floats(-1e12, 1e12, allow_nan=False, width=64), st.sampled_from([np.nan, 0.0, 1.0])
)


@settings(max_examples=300, deadline=None)
@given(
    arrays(np.float64, st.tuples(st.integers(1, 5), st.integers(0, 40)), elements=FINITE),
    st.sampled_from([0.0, 1.0, 50.0, 99.0, 100.0]),
    st.sampled_from([0, 1]),
)
def test_percentiles_match_numpy(x, q, axis):
    """`nanpercentile` (the fits' p99 gaps) is `np.nanpercentile` bit for bit, per line."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = np.nanpercentile(x, q, axis=axis)
    np.testing.assert_array_equal(nanpercentile(x, q, axis=axis), want)


def test_robust_along_the_last_axis_of_planes():
    """The batched fits' shape: (fields, jobs, rows) planes, each line its own median."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(3, 4, 50))
    x[rng.random(x.shape) < 0.2] = np.nan
    med, mad = robust(x, axis=-1)
    for f in range(3):
        for j in range(4):
            want_med, want_mad = robust(x[f, j][:, None])
            assert (med[f, j], mad[f, j]) == (want_med[0], want_mad[0])


@settings(max_examples=300, deadline=None)
@given(
    arrays(np.float64, st.tuples(st.integers(1, 5), st.integers(1, 40)), elements=VALUES),
    st.floats(-1e300, 1e300, width=64),
)
def test_a_sorted_window_less_a_finite_level_stays_sorted(x, level):
    """What `Bank._fit` relies on to take its residuals' median without a second sort: x
    minus a finite level keeps x's order (NaN last), so the sorted window serves."""
    srt = np.sort(x, axis=1)
    count = np.count_nonzero(~np.isnan(x), axis=1)
    with np.errstate(all="ignore"):
        shifted = srt - level
        want = nanmedian(x - level, 1)
    np.testing.assert_array_equal(sorted_median(shifted, count, 1), want)


@settings(max_examples=300, deadline=None)
@given(
    arrays(np.float64, st.tuples(st.integers(1, 5), st.integers(1, 40)), elements=VALUES),
    st.sampled_from(["median", "zero", "huge", "value"]),
    st.booleans(),
)
def test_distances_median_from_the_sorted_lines(x, where, full):
    """`sorted_distance_median` (the MAD without a second sort) is the median of the sorted
    distances bit for bit, for full lines (its run search) and lines with gaps alike."""
    if full:
        x = np.where(np.isnan(x), 1.5, x)  # every line full: the run search
    srt = np.sort(x, axis=1)
    n = np.count_nonzero(~np.isnan(x), axis=1)
    centre = {
        "median": sorted_median(srt, n, 1),
        "zero": np.zeros(len(x)),
        "huge": np.full(len(x), 1e300),
        "value": np.nan_to_num(x[:, 0], nan=0.0),
    }[where]
    with np.errstate(all="ignore"):
        want = nanmedian(np.abs(x - centre[:, None]), 1)
    np.testing.assert_array_equal(sorted_distance_median(srt, n, centre), want)

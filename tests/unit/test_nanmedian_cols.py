"""`base.nanmedian_cols` gives exactly what `np.nanmedian(x, axis=0)` gives (the fits use it),
except where numpy overflows averaging an odd count's middle value with itself."""

from __future__ import annotations

import warnings

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from detector.base import MAD_TO_SIGMA, nanmedian_cols, robust

VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.sampled_from([np.nan, 0.0, -0.0, 1.0, 1e-300, 1e300]),
)


@settings(max_examples=400, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(0, 40), st.integers(1, 6)), elements=VALUES))
def test_matches_numpy(x):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        want = np.nanmedian(x, axis=0)
    for j in range(x.shape[1]):  # an odd count's median is its middle value: numpy averages
        col = np.sort(x[:, j][~np.isnan(x[:, j])])  # it with itself, which overflows to inf
        if len(col) % 2:  # above half the float range (8.99e307 -> inf); the value is kept
            want[j] = col[len(col) // 2]
    np.testing.assert_array_equal(nanmedian_cols(x), want)


def test_a_huge_single_value_is_its_own_median():
    np.testing.assert_array_equal(nanmedian_cols(np.array([[8.98846567e307]])), [8.98846567e307])


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

"""`base.job_medians`: each job's medians, worked out once per column while a frame is
`unchanged` (an engine step) and shared by the detectors (peer gives the gauges', level takes
them); the same numbers as each detector computing its own."""

from __future__ import annotations

import numpy as np

from detector import fields as F
from detector.base import group_median, job_medians
from detector.level import Level
from detector.peer import PeerComparison
from detector.synthetic import healthy_frame


def _frame(seed: int):
    f = healthy_frame(jobs=4, nodes=2, gpus=8, steps=1, seed=seed, start=900.0)
    rng = np.random.default_rng(seed)
    gaps = rng.random(f.values.shape) < 0.05
    f.values[gaps] = np.nan
    f.job[:8] = ""  # one node without a job
    return f


def test_medians_are_the_groups_medians_and_progress_columns_their_value():
    f = _frame(1)
    codes, uniq = f.job_codes
    names = (*F.GAUGE_NAMES, F.ITER_SECONDS)
    want = group_median(f.cols(names), codes, len(uniq), f.job_groups)
    np.testing.assert_array_equal(job_medians(f, names), want)
    f.values[:, F.ALL_FIELDS.index(F.ITER_SECONDS)] = 0.7  # one value per job
    assert f.one_per_job([F.ITER_SECONDS]) is not None
    assert (job_medians(f, [F.ITER_SECONDS])[:, 0] == 0.7).all()


def test_kept_only_while_the_frame_is_unchanged():
    f = _frame(2)
    power = F.ALL_FIELDS.index("DCGM_FI_DEV_POWER_USAGE")
    with f.unchanged():
        first = job_medians(f, ["DCGM_FI_DEV_POWER_USAGE"])
        f.values[:, power] *= 2  # (a caller that breaks its promise sees the kept medians)
        np.testing.assert_array_equal(job_medians(f, ["DCGM_FI_DEV_POWER_USAGE"]), first)
    np.testing.assert_array_equal(job_medians(f, ["DCGM_FI_DEV_POWER_USAGE"]), 2 * first)


def test_peer_and_level_score_alike_sharing_or_not():
    for seed in range(3):
        f = _frame(seed)
        level = Level().fit(healthy_frame(jobs=4, nodes=2, gpus=8, steps=60, seed=seed))
        alone = (PeerComparison().score(f), level.score(f))
        with f.unchanged():  # peer first (it gives the gauges' medians), level takes them
            shared = (PeerComparison().score(f), level.score(f))
        for a, b in zip(alone, shared, strict=True):
            np.testing.assert_array_equal(a, b)

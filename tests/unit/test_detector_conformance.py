"""One conformance check over every detector, and every detector's docstring example."""

from __future__ import annotations

import doctest
import json
import warnings

import numpy as np
import pytest

import detector.base
import detector.covariance
import detector.deviation
import detector.hardware
import detector.peer
import detector.progress
from detector import fields as F
from detector.pipeline import ALL
from detector.synthetic import healthy_frame

TRAIN = healthy_frame(jobs=2, nodes=2, steps=40, seed=11)
TEST = healthy_frame(jobs=2, nodes=2, steps=3, seed=12, start=1000.0)


def _faulty():
    f = healthy_frame(jobs=2, nodes=2, steps=3, seed=12, start=1000.0)
    row = 5
    node = (f.node == f.node[row]) & (f.time == f.time[row])  # the row's whole node spins
    f.values[node, F.ALL_FIELDS.index("DCGM_FI_DEV_POWER_USAGE")] = 125.0
    f.values[node, F.ALL_FIELDS.index("DCGM_FI_PROF_GR_ENGINE_ACTIVE")] = 0.01
    f.values[row, F.ALL_FIELDS.index(F.XID_FIELD)] = 79
    f.values[f.job == f.job[row], F.ALL_FIELDS.index(F.STALL_SECONDS)] = 5000.0
    return f, row


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.name)
def test_conformance(cls):
    det = cls()
    assert repr(det).startswith(cls.__name__)
    assert det.fit(TRAIN) is det
    assert any(k.endswith("_") and not k.startswith("_") for k in vars(det)), "fitted state_"
    s = det.score(TEST)
    assert s.shape == (len(TEST),) and s.dtype == float
    assert np.isfinite(s).all() and (s >= 0).all()
    assert (s < 1.0).all(), f"{cls.name} alarms on healthy data: max {s.max():.2f}"
    # sign: the injected fault scores higher than the same row healthy
    faulty, row = _faulty()
    assert det.score(faulty)[row] > max(s[row], 1.0)
    # determinism: a second detector fitted the same way scores identically
    np.testing.assert_array_equal(cls().fit(TRAIN).score(faulty), det.score(faulty))
    # a detector that learns per job: its states through JSON (the baseline store's path)
    # into a fresh detector give identical scores, and that detector differs from an unfitted
    # one (so the states carried something); the peer and hardware detectors learn nothing
    # per job (they compare peers, or counters with their own first values)
    states = {j: st for j in det.jobs() if (st := det.job_state(j)) is not None}
    assert bool(states) == (cls.name not in ("peer", "hardware")), cls.name
    if states:
        again = cls()
        for job, state in states.items():
            again.set_job_state(job, json.loads(json.dumps(state)))
        np.testing.assert_allclose(again.score(faulty), det.score(faulty), rtol=0, atol=1e-12)
        assert not np.array_equal(cls().score(TEST), det.score(TEST))
    # empty frames and unknown jobs score (zeros), never raise
    assert det.score(TEST.take(np.array([], dtype=int))).shape == (0,)


MODULES = [
    detector.deviation,
    detector.peer,
    detector.progress,
    detector.hardware,
    detector.covariance,
]


@pytest.mark.parametrize("module", [*MODULES, detector.base])
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    mine = [c for c in ALL if c.__module__ == module.__name__]
    assert result.attempted >= len(mine) * 3
    if module is not detector.base:
        assert mine, f"{module.__name__} holds no detector of ALL"


def test_z_crit_calibration():
    from detector.base import z_crit

    assert z_crit(0.05) == pytest.approx(1.96, abs=0.01)
    assert z_crit(1e-4, 12) > z_crit(1e-4, 1)
    with pytest.raises(ValueError):
        z_crit(0.0)


@pytest.mark.parametrize("size", [1, 2, 3, 8, 16, 33])
def test_group_median_matches_numpy(size):
    from detector.base import group_median

    rng = np.random.default_rng(size)
    values = rng.normal(size=(size * 5, 4))
    values[0, 3] = np.nan  # a partly missing field
    values[:, 2] = np.nan  # a field nobody reports
    codes = np.repeat(np.arange(5), size)
    got = group_median(values, codes, 6)  # group 5 has no rows
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = np.array([np.nanmedian(values[codes == i], axis=0) for i in range(6)])
    np.testing.assert_allclose(got, want, equal_nan=True)


def test_peer_leaves_gpus_without_a_job_alone_in_recordings_too():
    """GPUs without a job are no one's peers, in a cycle's frame and in a recording (several
    instants: groups by job and instant, the job id their first level)."""
    frame = healthy_frame(jobs=1, nodes=2, steps=3, seed=3)
    idle = np.flatnonzero(frame.node == frame.node[-1])  # the second node's GPUs: no job
    frame.job[idle] = ""
    util = frame.fields.index(F.UTIL)
    frame.values[idle[::8], util] = 0.0  # one idle GPU unlike the others, each instant
    det = detector.peer.PeerComparison().fit(frame)
    assert len(set(frame.time)) == 3 and (det.score(frame)[idle] == 0).all()
    one = frame.take(np.flatnonzero(frame.time == frame.time[0]))
    assert (det.score(one)[np.flatnonzero(one.job == "")] == 0).all()

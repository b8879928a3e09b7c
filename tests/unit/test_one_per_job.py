"""What a detector works out once per job (`Frame.one_per_job`) gives each row exactly what
working it out per row gives."""

from __future__ import annotations

import numpy as np
import pytest

from detector import fields as F
from detector.frame import Frame
from detector.progress import Progress
from detector.synthetic import healthy_frame

FIELDS = (F.STALL_SECONDS, F.ITER_SECONDS, F.SINCE_PAUSE)


def cycle(seed: int = 0) -> Frame:
    """One instant of three jobs, their progress fields per job (as the service's frames)."""
    frame = healthy_frame(jobs=3, nodes=2, steps=40, seed=seed)
    last = frame.take(np.flatnonzero(frame.time == frame.time.max()))
    codes = last.job_codes[0]
    since = np.array([np.nan, 40.0, 400.0])[codes]  # no pause line, one open, one long past
    last.values[:, last.fields.index(F.SINCE_PAUSE)] = since
    last.values[:, last.fields.index(F.STALL_SECONDS)] = np.array([3.0, 50.0, 1.0])[codes]
    return last


def test_one_row_per_job_when_the_fields_are_per_job():
    frame = cycle()
    first, codes = frame.one_per_job(FIELDS)
    assert len(first) == len(frame.job_codes[1]) == 3
    assert (frame.job[first] == frame.job_codes[1]).all()
    np.testing.assert_array_equal(first[codes][:: len(frame) // 3], first)


@pytest.mark.parametrize("name", FIELDS)
def test_none_when_a_field_differs_within_a_job(name):
    frame = cycle()
    frame.values[20, frame.fields.index(name)] = 7.0  # a GPU of the second job
    assert frame.one_per_job(FIELDS) is None


def test_none_for_a_recording_of_many_instants():
    assert healthy_frame(jobs=1, steps=3).one_per_job(FIELDS) is None


@pytest.mark.parametrize("seed", range(4))
def test_progress_per_job_equals_per_row(seed, monkeypatch):
    train = healthy_frame(jobs=3, nodes=2, steps=60, seed=seed + 10)
    det = Progress().fit(train)
    frame = cycle(seed)
    frame.values[:, frame.fields.index(F.ITER_SECONDS)] *= np.array([1.0, 2.0, 1.0])[
        frame.job_codes[0]
    ]  # one job runs slow
    frame.values[frame.job_codes[0] == 0, frame.fields.index(F.ITER_SECONDS)] = np.nan
    assert frame.one_per_job(FIELDS) is not None
    fast = det.parts(frame)  # (stall, slowdown): progress' and pace's scores
    monkeypatch.setattr(Frame, "one_per_job", lambda self, names: None)
    for got, want in zip(fast, det.parts(frame), strict=True):
        np.testing.assert_array_equal(got, want)
    assert (fast[1] > 0).any()

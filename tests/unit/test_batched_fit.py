"""Fits of several jobs in one pass (`PerJob._fit_jobs`, `Baselines.fit_jobs`): each job gets
exactly the state it gets fitted alone, and that state is what its definition says (medians,
MADs and percentiles as numpy takes them)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detector import fields as F
from detector.base import FLOORS, MAD_TO_SIGMA, pause_open
from detector.baselines import BaselineStore
from detector.deviation import BaselineDeviation
from detector.frame import Frame, JobRows
from detector.physics import Physics
from detector.pipeline import Engine
from detector.progress import Progress

BATCHED = (BaselineDeviation, Progress, Physics)
COL = {f: i for i, f in enumerate(F.ALL_FIELDS)}


def training(seed: int, n: int, jobs: int) -> Frame:
    """Rows of `jobs` jobs (and some with no job) in any order: gauges with gaps, busy and
    idle rows, step times with bad values, stalls with and without pauses open."""
    rng = np.random.default_rng(seed)
    job = np.array([f"j{k}" for k in range(jobs)] + [""], dtype=object)
    x = rng.normal(50, 20, (n, len(F.ALL_FIELDS)))
    x[rng.random(x.shape) < 0.1] = np.nan
    x[:, COL[F.UTIL]] = np.where(rng.random(n) < 0.7, 95.0, 5.0)
    step = rng.lognormal(0, 0.3, n) * rng.choice([1.0, -1.0, 0.0], n, p=[0.9, 0.05, 0.05])
    x[:, COL[F.ITER_SECONDS]] = np.where(rng.random(n) < 0.2, np.nan, step)
    x[:, COL[F.STALL_SECONDS]] = np.where(rng.random(n) < 0.1, np.nan, rng.exponential(5, n))
    x[:, COL[F.SINCE_PAUSE]] = np.where(rng.random(n) < 0.5, np.nan, rng.exponential(5, n))
    return Frame(
        np.zeros(n), job[rng.integers(0, jobs + 1, n)], np.full(n, "n", object), np.zeros(n), x
    )


def states(det) -> dict[str, str]:
    return {j: json.dumps(det.job_state(j)) for j in det.jobs_}


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 400), st.integers(1, 6))
def test_each_job_fitted_with_others_gets_the_state_it_gets_alone(seed, n, jobs):
    frame = training(seed, n, jobs)
    for cls in BATCHED:
        together = cls().fit(frame)
        together._ensure()
        alone = {}
        for j in sorted(set(frame.job) - {""}):
            one = cls().fit(frame.take(np.flatnonzero(frame.job == j)))
            alone.update(states(one))
        assert states(together) == alone, cls.__name__


def test_a_refit_replaces_the_jobs_rows_and_keeps_the_others():
    """Refitting two of three fitted jobs (and a new one) together: each its own new state."""
    again = training(2, 400, 4)
    for cls in BATCHED:
        det = cls().fit(training(1, 300, 3))
        before = states(det)
        det.fit(again.take(np.flatnonzero(np.isin(again.job, ["j2", "j0", "j3"]))))
        want = {}
        for j in ("j0", "j2", "j3"):
            want.update(states(cls().fit(again.take(np.flatnonzero(again.job == j)))))
        after = states(det)
        assert after == {**before, **want}, cls.__name__
        assert after["j0"] != before["j0"] and after["j2"] != before["j2"]


def test_states_are_what_their_definitions_say():
    frame = training(7, 300, 1)
    frame = frame.take(np.flatnonzero(frame.job == "j0"))
    x, col = frame.values, COL
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        # progress: median and MAD of the log of the good step times; longest gap; the longest
        # announced pause it saw open (scoring cycles; none here)
        it = x[:, col[F.ITER_SECONDS]]
        logs = np.log(it[np.isfinite(it) & (it > 0)])
        med = np.median(logs)
        stall, since = x[:, col[F.STALL_SECONDS]], x[:, col[F.SINCE_PAUSE]]
        got = Progress().fit(frame).job_state("j0")
        assert got["step_"] == np.exp(med)
        assert got["step_scale_"] == max(np.median(np.abs(logs - med)) * MAD_TO_SIGMA, 0.02)
        assert got["gap_"] == np.nanmax(stall)
        assert got["pause_"] == 0.0
        # physics: p99 of the gaps outside pauses
        gaps = stall[np.isfinite(stall) & ~pause_open(stall, since)]
        assert Physics().fit(frame).job_state("j0")["gap_"] == np.percentile(gaps, 99)
        # deviation: per field, median and MAD-sigma of the busy rows; idle has too few rows
        g = frame.cols(F.GAUGE_NAMES)
        busy = g[x[:, col[F.UTIL]] >= 50]
        bmed = np.nanmedian(busy, axis=0)
        bmad = np.nanmedian(np.abs(busy - bmed), axis=0) * MAD_TO_SIGMA
        dev = BaselineDeviation(min_rows=100).fit(frame).job_state("j0")
    assert len(busy) >= 100 > len(g) - len(busy)
    np.testing.assert_array_equal(np.array(dev["busy_med_"], dtype=float), bmed)
    want_scale = np.fmax(np.fmax(bmad, FLOORS), 0.02 * np.abs(bmed))
    np.testing.assert_array_equal(np.array(dev["busy_scale_"], dtype=float), want_scale)
    assert dev["idle_med_"] == [None] * len(F.GAUGES)
    assert dev["idle_scale_"] == FLOORS.tolist()


def test_too_few_rows_fit_nothing_and_an_empty_frame_is_fine():
    frame = training(3, 200, 2)
    few = frame.take(np.flatnonzero(frame.job == "j0")[:2])
    for cls in BATCHED:
        det = cls().fit(few).fit(frame.take(np.zeros(0, dtype=int)))
        det._ensure()
        assert det.jobs_ == []


@pytest.mark.parametrize("seed", [0, 1])
def test_baselines_fit_jobs_together_as_one_by_one(tmp_path, seed):
    """The engine's refits of a cycle's due jobs in one pass: every detector's state, and
    each saved baseline, as fitting the jobs one after the other gives."""
    longest = np.random.default_rng(seed).choice([0.0, 42.0], 4)  # each job's longest stall
    frame = training(seed, 900, 4)
    engines = [Engine(store=BaselineStore(tmp_path / k), seed=seed) for k in ("one", "all")]
    for eng in engines:
        for k in range(4):
            job = f"j{k}"
            eng.base.add(job, f"name-{k}", 0.0)
            info = eng.base.jobs[job]
            rows = frame.values[frame.job == job]
            info.rows = np.zeros((eng.cfg.reservoir, rows.shape[1]), np.float32)
            info.rows[: len(rows)] = rows[: eng.cfg.reservoir]
            info.seen = len(rows) + k * 300  # a full reservoir for some
            info.max_stall = float(longest[k])
    one, batched = engines
    for k in range(4):
        one.base.fit_job(f"j{k}", 100.0)
    batched.base.fit_jobs([f"j{k}" for k in range(4)], 100.0)
    for name in one.det:
        for k in range(4):
            assert one.det[name].job_state(f"j{k}") == batched.det[name].job_state(f"j{k}")
    for k in range(4):
        info = batched.base.jobs[f"j{k}"]
        assert info.fitted_at == 100.0 and info.fitted_rows == max(info.seen, 1)
        saved = [json.loads(e.base.store.path(f"name-{k}").read_text()) for e in engines]
        assert saved[0]["detectors"] == saved[1]["detectors"]


def test_one_jobs_rows_are_only_its_own():
    """A frame of one job and rows without a label (pandas codes them -1): the job's frame
    holds its own rows only, not the whole frame."""
    frame = training(5, 40, 1)
    frame.job[frame.job == ""] = None
    rows = JobRows.of(frame)
    (job, own), *_ = rows.frames()
    assert rows.jobs == ["j0"] and job == "j0"
    assert list(own.job) == ["j0"] * int((frame.job == "j0").sum())

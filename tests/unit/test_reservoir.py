"""`Baselines._reservoirs` samples several jobs at once exactly as Algorithm R run job by job
would with the same random stream: the same rows kept in the same places, the same counts."""

from __future__ import annotations

import copy

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from detector.learning import Baselines, JobInfo
from detector.pipeline import Config


def one_by_one(info: JobInfo, rows: np.ndarray, size: int, rng: np.random.Generator) -> None:
    """Algorithm R for one job (the reference: fill the free places, then each further row
    replaces a uniform place with probability size / rows seen)."""
    if info.rows is None:
        info.rows = np.full((size, rows.shape[1]), np.nan, dtype=np.float32)
    for row in rows:
        info.seen += 1
        if info.seen <= size:
            info.rows[info.seen - 1] = row
        else:
            place = int(rng.random() * info.seen)
            if place < size:
                info.rows[place] = row


JOB = st.tuples(st.integers(0, 40), st.integers(0, 30))  # (rows seen before, rows added)


@settings(max_examples=200, deadline=None)
@given(st.lists(JOB, min_size=1, max_size=6), st.integers(1, 16), st.integers(0, 2**32))
def test_batched_reservoirs_match_algorithm_r_job_by_job(jobs, size, seed):
    base = Baselines(Config(reservoir=size), None, {}, set(), np.random.default_rng(seed))
    ref_rng = np.random.default_rng(seed)
    block = np.arange(sum(n for _, n in jobs) * 3, dtype=float).reshape(-1, 3)
    spans, refs, a = [], [], 0
    for k, (before, n) in enumerate(jobs):
        info, ref = (JobInfo(name=f"j{k}", first_seen=0.0) for _ in range(2))
        history = -np.arange(1, before * 3 + 1, dtype=float).reshape(-1, 3) - 1000 * k
        one_by_one(ref, history, size, ref_rng)  # the same past for both
        info.rows, info.seen = (None if ref.rows is None else ref.rows.copy()), ref.seen
        spans.append((info, a, a + n))
        refs.append(ref)
        a += n
    base.rng = copy.deepcopy(ref_rng)  # both go on from the same point of one stream
    base._reservoirs(block, spans)
    for (info, a, b), ref in zip(spans, refs, strict=True):
        one_by_one(ref, block[a:b], size, ref_rng)
        assert info.seen == ref.seen
        if ref.rows is None:
            assert info.rows is None or b == a
            continue
        filled = min(ref.seen, size)
        np.testing.assert_array_equal(info.rows[:filled], ref.rows[:filled])

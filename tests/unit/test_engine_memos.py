"""What the engine keeps from one cycle to the next to save work (lookup tables, sorts) is
dropped when what it was computed from changes: the same frame object scored after jobs were
dropped and fitted, GPUs added to the counter baselines, rows regrouped. Each test compares
against a fresh detector or a plain computation, so a memo that outlived its inputs fails."""

from __future__ import annotations

import numpy as np

from detector import fields as F
from detector.deviation import BaselineDeviation
from detector.hardware import HardwareEvents
from detector.pipeline import GroupMax
from detector.synthetic import healthy_frame


def _one_instant(jobs: int, seed: int):
    f = healthy_frame(jobs=jobs, nodes=1, steps=1, seed=seed)
    f.values[:, F.ALL_FIELDS.index(F.UTIL)] = 99.0
    return f


def test_a_per_job_table_follows_drops_and_fits_on_the_same_frame():
    train = healthy_frame(jobs=3, nodes=1, steps=12, seed=1)
    frame = _one_instant(3, 2)
    frame.values[frame.job == "101", F.ALL_FIELDS.index("DCGM_FI_DEV_POWER_USAGE")] *= 0.3
    det = BaselineDeviation().fit(train)
    before = det.score(frame)
    det.drop_jobs({"100"})  # job 101 moves to index 0 of jobs_
    det.fit(train.take(np.flatnonzero(train.job == "100")))  # and 100 comes back last
    fresh = BaselineDeviation().fit(train.take(np.flatnonzero(train.job != "100")))
    fresh.fit(train.take(np.flatnonzero(train.job == "100")))
    np.testing.assert_allclose(det.score(frame), fresh.score(frame))
    np.testing.assert_allclose(det.score(frame), before)
    det.drop_jobs({"101"})  # unfitted now: the slow job is not scored against 100's baseline
    assert det.score(frame)[frame.job == "101"].max() == 0.0


def test_counter_baselines_follow_gpus_fitted_after_a_score():
    """The same GPUs (the same keys) scored before and after some of them got baselines: the
    rows looked up before must not be reused against the grown table."""
    frame = _one_instant(1, 3)
    det = HardwareEvents().fit(frame.take(np.arange(4)))  # GPUs 0-3 of the node only
    sbe = F.ALL_FIELDS.index("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL")  # not severe: scored on its rise
    frame.values[:, sbe] = 1000.0
    assert (det.score(frame)[4:] == 0.0).all()  # no baseline yet for GPUs 4-7
    det.fit(frame)  # the engine fits a GPU when it first sees it: here all eight at once
    frame.values[:, sbe] = 1500.0  # 500 more single-bit errors on every GPU
    got = det.score(frame)
    assert (got[4:] >= 1.0).all() and (got[:4] >= 1.0).all()


def test_group_max_follows_new_codes():
    gm = GroupMax(keep=2)
    rng = np.random.default_rng(5)
    values = rng.random((40, 3))
    for _ in range(3):
        for codes in (rng.integers(0, 6, 40), np.repeat(np.arange(8), 5)):
            want = np.zeros((8, 3))
            for c in range(8):
                if (codes == c).any():
                    want[c] = values[codes == c].max(axis=0)
            np.testing.assert_array_equal(gm(values, codes, 8), want)


def test_counter_baselines_follow_a_refit_of_the_same_gpus():
    """`fit` lowers known GPUs' baselines in place (a counter that went back, e.g. after a GPU
    reset): the baseline rows gathered for the last score must not outlive it."""
    frame = _one_instant(1, 4)
    sbe = F.ALL_FIELDS.index("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL")
    frame.values[:, sbe] = 1000.0
    det = HardwareEvents().fit(frame)
    assert (det.score(frame) == 0.0).all()
    low = _one_instant(1, 4)
    low.values[:, sbe] = 200.0
    det.fit(low)  # the same GPUs: their baselines drop to 200 in the same table
    assert (det.score(frame) >= 1.0).all()  # 800 single-bit errors since


def test_slot_lookup_follows_nodes_and_slots_that_come_and_go():
    """Each row's slot is its own GPU's whatever the order of cycles: the same GPUs again (the
    kept lookup), a new node (slots added), an old one gone for good (slots dropped)."""
    from detector.pipeline import Engine

    eng = Engine()
    a = healthy_frame(jobs=1, nodes=2, steps=1, seed=6)
    b = healthy_frame(jobs=1, nodes=3, steps=1, seed=6)
    b = b.take(np.flatnonzero(b.node != a.node[0]))  # a's second node and a new one
    cycles = ((a, 0.0), (a, 5.0), (b, 10.0), (a, 15.0), (b, 10_000.0), (b, 10_005.0), (a, 10_010.0))
    for frame, now in cycles:
        idx, _, _ = eng._slots(frame)
        key = eng.slot_key[idx]
        assert (np.array(eng._node_names, dtype=object)[key // 1024] == frame.node).all()
        assert (key % 1024 == frame.gpu).all()
        eng.slot_seen[idx] = now
        eng._missing(now)  # drops the slots not seen for a long time


def test_physics_forgets_a_dropped_jobs_busy_time_on_the_same_job_table():
    """The busy times kept for the frame's job table (the same array each cycle) go with
    `drop_jobs`: a job that ended and came back under the same id has not started yet."""
    from detector.physics import Physics

    det = Physics()
    frame = _one_instant(1, 7)
    busy = np.ones(len(frame), dtype=bool)
    assert det._started(frame, busy).all()
    later = frame.with_values(frame.time + 5.0, frame.values.copy())  # the same job table
    assert later.job_codes[1] is frame.job_codes[1]
    assert det._started(later, ~busy).all()  # seen busy before: started
    det.drop_jobs(set(frame.job))
    assert not det._started(later, ~busy).any()


def test_node_shift_regroups_when_the_rows_nodes_change():
    """The (job, node) pairs kept from the last score are not reused for rows on other nodes."""
    from detector.deviation import NodeShift
    from detector.frame import Frame

    train = healthy_frame(jobs=1, nodes=3, steps=30, seed=8)
    a = healthy_frame(jobs=1, nodes=3, steps=1, seed=9, start=600.0)
    a.values[a.node == "node2", F.ALL_FIELDS.index(F.UTIL)] = 40.0  # node2 slowed
    moved = a.node.copy()
    moved[np.flatnonzero(a.node == "node3")[:4]] = "node2"  # half of node3's rows on node2
    b = Frame(a.time, a.job, moved, a.gpu, a.values)  # (labels as a cycle could read them)
    det = NodeShift().fit(train)
    det.score(a)
    np.testing.assert_allclose(det.score(b), NodeShift().fit(train).score(b))


def test_level_follows_jobs_that_end_and_come_back_on_the_same_job_table():
    """Level's per-job lookups (slot, longest pause) are kept for the frame's job table: a job
    dropped and learned again under the same id is looked up again (its rows reset)."""
    from detector.level import Level

    det = Level()
    det._ensure()
    frame = _one_instant(2, 11)
    jobs = frame.job_codes[1]
    first = det._slots(jobs, create=True).copy()
    assert (first >= 0).all() and det._slots(jobs, create=False) is det._slots(jobs, False)
    det.drop_jobs({str(jobs[0])})
    assert det._slots(jobs, create=False)[0] == -1  # gone, though the job table is the same
    again = det._slots(jobs, create=True)
    assert again[0] >= 0 and again[1] == first[1]
    det.pause_[str(jobs[1])] = 120.0  # as learning records a pause (with its count of changes)
    det._changes += 1
    assert det._per_job(jobs)[1][1] == 120.0


def test_memo_compares_its_key_by_value_and_recomputes_on_any_change():
    from detector.memo import Memo

    calls: list[int] = []
    memo: Memo[int] = Memo()

    def value() -> int:
        calls.append(1)
        return len(calls)

    a = np.arange(4)
    assert memo.get((a, ["x"], 3), value) == 1
    assert memo.get((a.copy(), ["x"], 3), value) == 1  # equal parts: kept
    assert memo.get((a.astype(float), ["x"], 3), value) == 2  # another dtype
    assert memo.get((a[:3], ["x"], 3), value) == 3  # another shape
    assert memo.get((a[:3], ["y"], 3), value) == 4
    assert memo.get((a[:3], ["y"], 4), value) == 5
    assert memo.get((a[:3], ["y"], 4.0), value) == 6  # 4 == 4.0, but another type
    nan = np.array([np.nan])
    assert memo.get((nan,), value) == 7 and memo.get((nan,), value) == 7  # the same object
    assert memo.get((nan.copy(),), value) == 8  # NaN is never equal: recomputed
    memo.clear()
    assert memo.get((nan,), value) == 9


def test_the_engines_node_shift_reads_the_deviations_baselines():
    """One fit, one stored state: the engine's NodeShift scores against its deviation
    detector's tables exactly as a NodeShift fitted on the same rows would, and stores none."""
    from detector.deviation import NodeShift
    from detector.pipeline import Config, default_detectors

    train = healthy_frame(jobs=2, nodes=3, steps=30, seed=12)
    test = healthy_frame(jobs=2, nodes=3, steps=1, seed=13, start=600.0)
    test.values[test.node == "node2", F.ALL_FIELDS.index(F.UTIL)] = 40.0
    dets = default_detectors(Config())
    for d in (dets["deviation"], dets["shift"]):
        d.fit(train)
    alone = NodeShift().fit(train)
    np.testing.assert_array_equal(dets["shift"].score(test), alone.score(test))
    assert dets["shift"].score(test).max() > 1.0
    assert all(dets["shift"].job_state(j) is None for j in ("100", *dets["shift"].jobs()))
    assert alone.job_state("100") is not None
    dets["deviation"].drop_jobs({"100"})  # ended: the shift stops scoring it too
    assert (dets["shift"].score(test)[test.job == "100"] == 0.0).all()


def test_a_per_job_table_follows_a_job_fitted_after_a_score():
    """A job fitted after a score is appended to the same `jobs_` list: the table kept from
    that score must not leave it unscored."""
    train = healthy_frame(jobs=2, nodes=1, steps=12, seed=14)
    frame = _one_instant(2, 15)
    frame.values[:, F.ALL_FIELDS.index("DCGM_FI_DEV_POWER_USAGE")] *= 0.3  # both far off
    det = BaselineDeviation().fit(train.take(np.flatnonzero(train.job == "100")))
    assert det.score(frame)[frame.job == "101"].max() == 0.0  # not fitted yet
    det.fit(train.take(np.flatnonzero(train.job == "101")))
    assert det.score(frame)[frame.job == "101"].min() > 1.0

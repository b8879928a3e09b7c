"""Fits that come due together are spread over cycles, not done in one: the engine's per-job
fits (`Config.fits_per_cycle`) and `Bank`'s regular refits (`max_refits`); refits that come
due apart wait to be fitted together (`Config.refit_batch`, `refit_wait_s`)."""

from __future__ import annotations

import numpy as np

from detector.pipeline import Config, Engine
from detector.synthetic import healthy_frame
from detector.univariate import Bank


def test_jobs_due_together_are_fitted_a_few_per_cycle_first_fits_first():
    eng = Engine(Config(fits_per_cycle=2))
    fitted = []
    for k in range(80):  # six 1-GPU jobs started together: their first fits fall due together
        frame = healthy_frame(jobs=6, nodes=1, gpus=1, steps=1, seed=k, start=5.0 * k)
        eng.step(frame, 5.0 * k)
        fitted.append(sum(i.fitted_at is not None for i in eng.base.jobs.values()))
    steps = np.diff(fitted)
    assert fitted[-1] == 6 and steps.max() == 2  # all of them, never more than two a cycle
    assert (steps[np.flatnonzero(steps)[0] :][:3] == 2).all()  # the burst drains at the budget


def test_periodic_refits_wait_for_a_batch_or_the_longest_wait_first_fits_never_wait():
    eng = Engine(Config(refit_batch=3, refit_wait_s=30.0))
    for k in range(60):  # four 1-GPU jobs, fitted
        eng.step(healthy_frame(jobs=4, nodes=1, gpus=1, steps=1, seed=k, start=5.0 * k), 5.0 * k)
    base = eng.base
    assert all(i.fitted_at is not None for i in base.jobs.values())
    at = {j: i.fitted_at for j, i in base.jobs.items()}
    jobs = sorted(base.jobs)
    t = 400.0
    base._due = {jobs[0]: (True, t), jobs[1]: (True, t + 5)}  # two refits: under the batch
    base._fit_due(t + 25)
    assert len(base._due) == 2 and {j: i.fitted_at for j, i in base.jobs.items()} == at
    base._fit_due(t + 30)  # the longest has waited 30 s: both go
    assert not base._due and all(base.jobs[j].fitted_at == t + 30 for j in jobs[:2])
    base._due = {j: (True, t + 40) for j in jobs[1:]}  # three refits: a batch, at once
    base._fit_due(t + 40)
    assert not base._due and all(base.jobs[j].fitted_at == t + 40 for j in jobs[1:])
    base._due = {jobs[0]: (True, t + 45), jobs[1]: (False, t + 50)}  # a first fit: at once,
    base._fit_due(t + 50)  # and the waiting refit with it
    assert not base._due and base.jobs[jobs[0]].fitted_at == t + 50


def test_an_ended_job_leaves_the_fit_queue():
    eng = Engine(Config(fits_per_cycle=1))
    for k in range(40):
        eng.step(healthy_frame(jobs=3, nodes=1, gpus=1, steps=1, seed=k, start=5.0 * k), 5.0 * k)
    eng.base._due = {"100": (False, 0.0), "101": (False, 0.0)}
    eng.end_jobs({"101", "102"})
    assert set(eng.base._due) == {"101"}


def test_bank_refits_at_most_max_refits_rows_per_update_the_longest_waiting_first():
    bank = Bank(min_fit=5, refit_every=10, max_refits=3)
    rows = bank.add(8)
    rng = np.random.default_rng(0)
    for _ in range(5):  # every row's first fit together: not limited
        bank.update(rows, rng.normal(5, 1, 8), np.zeros(8, bool))
    assert bank.fitted(rows).all() and (bank.fitn_[rows] == 5).all()
    bank.since_[rows] = 9 + np.arange(8)  # all come due at the next sample, row 7 the longest
    bank.update(rows, rng.normal(5, 1, 8), np.zeros(8, bool))
    assert sorted(np.flatnonzero(bank.since_[rows] == 0).tolist()) == [5, 6, 7]
    bank.update(rows, rng.normal(5, 1, 8), np.zeros(8, bool))
    assert sorted(np.flatnonzero(bank.since_[rows] == 0).tolist()) == [2, 3, 4]

"""Detectors whose fitted state is per job: stacked per-job arrays, stored by job name."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from detector.base import Detector
from detector.frame import Frame
from detector.memo import Memo


class PerJob(Detector):
    """Fitted state as stacked per-job arrays: `jobs_` and one array per name in `state_keys`."""

    state_keys: ClassVar[tuple[str, ...]] = ()

    def _ensure(self) -> None:
        if not hasattr(self, "jobs_"):
            self.jobs_: list[str] = []
            self._table: Memo[np.ndarray] = Memo()  # `_codes`' job -> row table
            self._changes = 0  # changes to the state arrays (memos of tables built from them)
            self._tables: Memo[Any] = Memo()  # a subclass's tables from the state, by `_changes`
            for k in self.state_keys:
                setattr(self, k, None)

    def job_state(self, job: str) -> dict[str, Any] | None:
        self._ensure()
        if job not in self.jobs_:
            return None
        i = self.jobs_.index(job)
        return {k: to_json(getattr(self, k)[i]) for k in self.state_keys}

    def set_job_state(self, job: str, state: dict[str, Any]) -> None:
        self._ensure()
        rows = {k: np.asarray(from_json(state[k]), dtype=float) for k in self.state_keys}
        self._changes += 1
        if job in self.jobs_:
            i = self.jobs_.index(job)
            for k in self.state_keys:
                getattr(self, k)[i] = rows[k]
            return
        self.jobs_.append(job)
        for k in self.state_keys:
            old = getattr(self, k)
            new = rows[k][None, ...]
            setattr(self, k, new if old is None else np.concatenate([old, new]))

    def drop_jobs(self, jobs: set[str]) -> None:
        self._ensure()
        keep = np.array([j not in jobs for j in self.jobs_], dtype=bool)
        if keep.all():
            return
        self._changes += 1
        self.jobs_ = [j for j, k in zip(self.jobs_, keep, strict=True) if k]
        for k in self.state_keys:
            setattr(self, k, getattr(self, k)[keep] if keep.any() else None)

    def fit(self, frame: Frame) -> Detector:
        self._ensure()
        new: dict[str, dict[str, Any]] = {}
        for job, rows in _by_job(frame):
            if job and (state := self._fit_job(rows)) is not None:
                new[job] = state
        fresh = [j for j in new if j not in self.jobs_]
        for j in [j for j in new if j in self.jobs_]:
            self.set_job_state(j, new[j])
        if fresh:  # stack all new jobs at once (not one concatenate per job)
            self._changes += 1
            for k in self.state_keys:
                block = np.stack([np.asarray(new[j][k], dtype=float) for j in fresh])
                old = getattr(self, k)
                setattr(self, k, block if old is None else np.concatenate([old, block]))
            self.jobs_.extend(fresh)
        return self

    def _fit_job(self, frame: Frame) -> dict[str, Any] | None:
        raise NotImplementedError

    def _codes(self, frame: Frame) -> np.ndarray:
        """Each row's index in `jobs_` (-1: not fitted). The lookup table is kept while the
        frame's distinct jobs and `jobs_` are the last call's (jobs are only appended to it,
        hence its length in the key; a drop makes a new list)."""
        self._ensure()
        codes, uniques = frame.job_codes

        def table() -> np.ndarray:
            index = {j: i for i, j in enumerate(self.jobs_)}
            return np.array([index.get(u, -1) for u in uniques.tolist()] + [-1], dtype=np.int64)

        return self._table.get((uniques, self.jobs_, len(self.jobs_)), table)[codes]


def _by_job(frame: Frame) -> Iterator[tuple[str, Frame]]:
    """Each job of the frame and its rows; a frame of one job (a refit's reservoir) as it is."""
    if len(frame) and (frame.job == frame.job[0]).all():
        yield frame.job[0], frame
        return
    codes, uniques = pd.factorize(frame.job)
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(uniques) + 1))
    for ci, job in enumerate(uniques):
        yield job, frame.take(order[bounds[ci] : bounds[ci + 1]])


def to_json(a: np.ndarray) -> Any:
    if isinstance(a, np.ndarray):
        return np.where(np.isnan(a), None, a.astype(object)).tolist()  # type: ignore[call-overload]
    return None if isinstance(a, float) and np.isnan(a) else a


def from_json(v: Any) -> Any:
    if isinstance(v, list):
        return np.array([np.nan if x is None else from_json(x) for x in v], dtype=float)
    return np.nan if v is None else v

"""Detectors whose fitted state is per job: stacked per-job arrays, stored by job name."""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

import numpy as np

from detector.base import Detector
from detector.frame import Frame, JobRows
from detector.memo import Memo

# what a job's runs showed (its start-ups, its pauses) is kept this many jobs after the job ended:
# a requeued job keeps its id and may be out of Slurm's running set (and the engine's) for
# minutes before it restarts
KEEP_ENDED = 4096
V = TypeVar("V")


def keep_latest(kept: dict[str, V], job: str, value: V) -> None:
    """`kept[job] = value`, the latest last, at most `KEEP_ENDED` jobs (the oldest go)."""
    kept.pop(job, None)
    kept[job] = value
    if len(kept) > KEEP_ENDED:
        del kept[next(iter(kept))]


class PerJob(Detector):
    """Fitted state as stacked per-job arrays: `jobs_` and one array per name in `state_keys`."""

    state_keys: ClassVar[tuple[str, ...]] = ()

    def _ensure(self) -> None:
        if not hasattr(self, "jobs_"):
            self.jobs_: list[str] = []
            self._table: Memo[np.ndarray] = Memo()  # `_codes`' job -> row table
            self._changes = 0  # changes to the state arrays (memos of tables built from them)
            self._tables: Memo[Any] = Memo()  # a subclass's tables from the state, by `_changes`
            self._where: Memo[dict[str, int]] = Memo()  # `_positions`
            for k in self.state_keys:
                setattr(self, k, None)

    def job_state(self, job: str) -> dict[str, Any] | None:
        i = self._positions().get(job)
        if i is None:
            return None
        return {k: to_json(getattr(self, k)[i]) for k in self.state_keys}

    def set_job_state(self, job: str, state: dict[str, Any]) -> None:
        self._ensure()
        rows = {k: np.asarray(from_json(state[k]), dtype=float) for k in self.state_keys}
        self._changes += 1
        i = self._positions().get(job)
        if i is not None:
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
        """Fit every job of the frame at once (`_fit_jobs`) and keep the states of those that
        had enough rows: a refitted job's rows in place, new jobs appended."""
        self._ensure()
        rows = frame.job_rows
        if not rows.jobs:
            return self
        ok, state = self._fit_jobs(rows)
        fitted = [i for i in np.flatnonzero(ok).tolist() if rows.jobs[i]]
        if not fitted:
            return self
        self._changes += 1
        where = self._positions()
        at = [where.get(rows.jobs[i], -1) for i in fitted]
        old = [(i, a) for i, a in zip(fitted, at, strict=True) if a >= 0]
        fresh = [i for i, a in zip(fitted, at, strict=True) if a < 0]
        for k in self.state_keys:
            arr = getattr(self, k)
            if old:
                arr[[a for _, a in old]] = state[k][[i for i, _ in old]]
            if fresh:
                arr = state[k][fresh] if arr is None else np.concatenate([arr, state[k][fresh]])
            setattr(self, k, arr)
        self.jobs_.extend(rows.jobs[i] for i in fresh)
        return self

    def _fit_jobs(self, rows: JobRows) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(which of `rows.jobs` could be fitted (J,), each state key's (J, ...) array): here
        one `_fit_job` per job; detectors whose fit is a few medians do all jobs at once."""
        states = {i: s for i, (j, f) in enumerate(rows.frames()) if j and (s := self._fit_job(f))}
        ok = np.zeros(len(rows.jobs), dtype=bool)
        ok[list(states)] = True
        out: dict[str, np.ndarray] = {}
        for k in self.state_keys:
            shape = np.shape(next(iter(states.values()))[k]) if states else ()
            out[k] = np.full((len(rows.jobs), *shape), np.nan)
            for i, st in states.items():
                out[k][i] = np.asarray(st[k], dtype=float)
        return ok, out

    def _fit_job(self, frame: Frame) -> dict[str, Any] | None:
        raise NotImplementedError

    def _positions(self) -> dict[str, int]:
        """Each fitted job's row in the state arrays (kept while `jobs_` is unchanged)."""
        self._ensure()
        return self._where.get(
            (self.jobs_, len(self.jobs_)), lambda: {j: i for i, j in enumerate(self.jobs_)}
        )

    def per_named_job(
        self, frame: Frame, key: str, column: int | None = None
    ) -> dict[str, np.ndarray]:
        """{job_id, value}: the state array `key` (its `column`, where it has one per field)
        of each named job of the frame that has a value there (NaN: none), for export."""
        uniq = frame.job_codes[1]
        at = self._job_index(frame)[:-1]  # (initialises the state of a detector never fitted)
        keep = frame.job_named & (at >= 0) if len(uniq) else np.zeros(0, dtype=bool)
        values = getattr(self, key)
        if values is not None and column is not None:
            values = values[:, column]
        if values is None or not keep.any():
            return {"job_id": uniq[:0], "value": np.zeros(0)}
        got = values[at[keep]]
        ok = np.isfinite(got)  # a stored state may hold none
        return {"job_id": uniq[keep][ok], "value": got[ok]}

    def _codes(self, frame: Frame) -> np.ndarray:
        """Each row's index in `jobs_` (-1: not fitted)."""
        return self._job_index(frame)[frame.job_codes[0]]

    def _job_index(self, frame: Frame) -> np.ndarray:
        """Each of the frame's distinct jobs' index in `jobs_` (-1: not fitted), then -1 (rows
        without a job). Kept while the frame's distinct jobs and `jobs_` are the last call's
        (jobs are only appended to it, hence its length in the key; a drop makes a new list)."""
        self._ensure()
        uniques = frame.job_codes[1]

        def table() -> np.ndarray:
            index = self._positions()
            return np.array([index.get(u, -1) for u in uniques.tolist()] + [-1], dtype=np.int64)

        return self._table.get((uniques, self.jobs_, len(self.jobs_)), table)


def to_json(a: Any) -> Any:
    """An array as nested lists, NaN as None (JSON has no NaN)."""
    return _no_nan(a.tolist() if isinstance(a, np.ndarray) else a)


def _no_nan(v: Any) -> Any:
    if isinstance(v, list):
        if v and isinstance(v[0], list):
            return [_no_nan(x) for x in v]
        return [None if x != x else x for x in v]  # (only NaN differs from itself)
    return None if isinstance(v, float) and v != v else v


def from_json(v: Any) -> Any:
    if isinstance(v, list):
        return np.array([np.nan if x is None else from_json(x) for x in v], dtype=float)
    return np.nan if v is None else v

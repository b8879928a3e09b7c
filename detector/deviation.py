"""Per-job deviation: each GPU against its job's healthy baseline (`BaselineDeviation`), and
each node's change against the job's least-changed node (`NodeShift`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from detector import fields as F
from detector.base import (
    FLOORS,
    Detector,
    group_median,
    multi_instant,
    nanmax_rows,
    robust,
    rowmax,
    z_crit,
)
from detector.frame import Frame, JobRows, by_size
from detector.memo import Memo
from detector.perjob import PerJob

_POWER = F.GAUGE_NAMES.index("DCGM_FI_DEV_POWER_USAGE")
_UTIL = F.GAUGE_NAMES.index(F.UTIL)


class BaselineDeviation(PerJob):
    """Per-GPU deviation from the job's own healthy baseline, in two modes (busy / idle).

    Fit learns, per job, the robust median and MAD-sigma of each gauge over busy rows
    (util >= `busy_util`) and, if the job had idle phases (checkpoints, evals), over idle rows.
    A row is scored against its own mode; idle rows of a job with no idle baseline score 0
    (whole-job stalls are the progress detector's). Score = max robust z / z_crit(p, 12).

    >>> import numpy as np
    >>> from detector.synthetic import healthy_frame
    >>> train = healthy_frame(jobs=1, nodes=2, steps=60, seed=1)
    >>> det = BaselineDeviation().fit(train)
    >>> test = healthy_frame(jobs=1, nodes=2, steps=5, seed=2, start=600.0)
    >>> bool(det.score(test).max() < 1.0)
    True
    >>> power = test.fields.index("DCGM_FI_DEV_POWER_USAGE")
    >>> test.values[0, power] = 125.0  # a spin-waiting rank: util 100 %, power near idle
    >>> bool(det.score(test)[0] > 1.0)
    True
    """

    name = "deviation"
    params = ("p", "busy_util", "min_rows", "rel_floor")
    state_keys = ("busy_med_", "busy_scale_", "idle_med_", "idle_scale_")
    busy_med_: np.ndarray
    busy_scale_: np.ndarray
    idle_med_: np.ndarray
    idle_scale_: np.ndarray

    def __init__(
        self,
        p: float = 1e-4,
        busy_util: float = 50.0,
        min_rows: int = 20,
        rel_floor: float = 0.02,
    ) -> None:
        self.p = p
        self.busy_util = busy_util
        self.min_rows = min_rows
        self.rel_floor = rel_floor

    def _scale(self, med: np.ndarray, mad: np.ndarray) -> np.ndarray:
        return np.fmax(np.fmax(mad, FLOORS), self.rel_floor * np.abs(med))

    def _fit_jobs(self, rows: JobRows) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Each job's busy and idle (median, scale) per field, all jobs in one pass; a mode
        with fewer than `min_rows` rows has none (its scale the floors), a job without enough
        busy rows is not fitted."""
        x = rows.cols(F.GAUGE_NAMES)  # (fields, jobs, rows)
        with np.errstate(invalid="ignore"):
            busy = rows.col(F.UTIL) >= self.busy_util
        out = {}
        for mode, mask in (("busy", busy), ("idle", rows.present & ~busy)):
            few = mask.sum(axis=1) < self.min_rows
            med = mad = np.full((x.shape[0], len(few)), np.nan)
            if not few.all():  # (a mode no job has enough rows of is not sorted for nothing)
                med, mad = robust(np.where(mask, x, np.nan), axis=-1)
                med[:, few] = mad[:, few] = np.nan
            out[f"{mode}_med_"] = med.T
            out[f"{mode}_scale_"] = self._scale(med.T, mad.T)
        return busy.sum(axis=1) >= self.min_rows, out

    def _modes(self) -> tuple[np.ndarray, np.ndarray]:
        """(median, scale) as (fields, 2 x jobs) tables, a job's busy mode then its idle one:
        a row's reference is one column gather from a table this small; kept until the
        state changes."""
        self._ensure()

        def stack() -> tuple[np.ndarray, np.ndarray]:
            return tuple(  # type: ignore[return-value]
                np.ascontiguousarray(np.stack([b, i], axis=1).reshape(-1, len(F.GAUGES)).T)
                for b, i in ((self.busy_med_, self.idle_med_), (self.busy_scale_, self.idle_scale_))
            )

        return self._tables.get((self._changes,), stack)

    def _z(self, frame: Frame) -> np.ndarray:
        """(n, fields) |z| against each row's job and mode (NaN: job not fitted), computed
        as contiguous field planes."""
        codes = self._codes(frame)
        x = frame.cols(F.GAUGE_NAMES).T  # (fields, n): contiguous for column-major frames
        known = codes >= 0
        if not known.any():
            return np.full(x.shape, np.nan).T
        mode = codes * 2 + (frame.col(F.UTIL) < self.busy_util)
        med, scale = self._modes()
        if known.all():  # steady state: every job fitted, no masked gathers; in place
            z = med.take(mode, axis=1)
            z = np.abs(np.subtract(x, z, out=z), out=z)
            z /= scale.take(mode, axis=1)
            return z.T
        z = np.full(x.shape, np.nan)
        m = mode[known]
        z[:, known] = np.abs(x[:, known] - med.take(m, axis=1)) / scale.take(m, axis=1)
        return z.T

    def score(self, frame: Frame) -> np.ndarray:
        return rowmax(self._z(frame)) / z_crit(self.p, len(F.GAUGES))

    def spinning(self, frame: Frame, power_share: float = 0.35) -> np.ndarray:
        """Rows that look busy (util >= `busy_util`) while drawing under `power_share` of the
        job's busy power: a spin-wait (NCCL/collective hang), never a healthy phase."""
        codes = self._codes(frame)
        out = np.zeros(len(frame), dtype=bool)
        known = codes >= 0
        if known.any():
            util, power = frame.col(F.UTIL), frame.col("DCGM_FI_DEV_POWER_USAGE")
            if not known.all():
                codes, util, power = codes[known], util[known], power[known]
            ref = self._modes()[0][_POWER, 0::2][codes]  # each job's busy median power
            out[known] = (util >= self.busy_util) & (power < power_share * ref)
        return out

    def typical_busy(self, frame: Frame) -> dict[str, np.ndarray]:
        """{job_id, value}: each named job's learned GPU utilisation (%) while busy (its busy
        mode's median: its own calm rows, or its stored baseline by name). Exported for
        attribution: a restart that waits on its host from its first step has no busier part
        of its own to compare with."""
        return self.per_named_job(frame, "busy_med_", _UTIL)

    def explain(self, frame: Frame, rows: np.ndarray) -> list[str]:
        sub = frame.take(rows)
        top, arg = nanmax_rows(self._z(sub))
        x = sub.cols(F.GAUGE_NAMES)
        return [
            f"{F.GAUGE_NAMES[a]}={x[i, a]:.4g} is {top[i]:.1f} sigma from the job's baseline"
            for i, a in enumerate(arg)
        ]


ACTIVITY = (  # fields that move when a node does less work (not temperatures, clocks, memory)
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_SM_ACTIVE",
)
_ACT = np.array([F.GAUGE_NAMES.index(n) for n in ACTIVITY])


class NodeShift(BaselineDeviation):
    """Each node's change from the job's own baseline, against the job's least-changed node.

    Peer comparison cannot localise when half a job is slow (two nodes, one slow: the median
    sits between them). Here each node's median signed z (activity fields, busy baseline) is
    compared with the node of the same job whose z is closest to zero: a phase the whole job
    shares (evaluation, checkpoint) moves every node alike and scores 0; one slow host moves
    alone. Score = max over fields of the difference / z_crit(p, fields); jobs on one node
    score 0. Given `of`, a fitted `BaselineDeviation` (the engine's), it reads that detector's
    baselines and keeps none of its own (one fit, one stored state); alone, it fits its own.

    >>> from detector.synthetic import healthy_frame
    >>> det = NodeShift().fit(healthy_frame(jobs=1, nodes=2, steps=60, seed=1))
    >>> test = healthy_frame(jobs=1, nodes=2, steps=1, seed=2, start=600.0)
    >>> bool(det.score(test).max() < 1.0)
    True
    >>> test.values[test.node == "node2", test.fields.index("DCGM_FI_DEV_GPU_UTIL")] = 60.0
    >>> s = det.score(test)
    >>> bool(s[test.node == "node2"].min() > 1.0 and s[test.node == "node1"].max() < 1.0)
    True
    """

    name = "shift"

    def __init__(self, *args: Any, of: BaselineDeviation | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.of = of
        self._pair_memo: Memo[tuple[Any, ...]] = Memo()

    def fit(self, frame: Frame) -> Detector:
        return self if self.of is not None else super().fit(frame)

    def job_state(self, job: str) -> dict[str, Any] | None:
        return None if self.of is not None else super().job_state(job)

    def set_job_state(self, job: str, state: dict[str, Any]) -> None:
        if self.of is None:  # else the deviation's own state is its
            super().set_job_state(job, state)

    def drop_jobs(self, jobs: set[str]) -> None:
        if self.of is None:
            super().drop_jobs(jobs)

    def _pair_shift(self, frame: Frame) -> tuple[np.ndarray, np.ndarray] | None:
        """(each row's (job, node) pair code; per pair and field, |the node's median z - the
        reference node's|, NaN where not scored); None when no row's job is fitted. The
        median z of a node is its median value's z: z is monotone in the value within a job,
        so one sort of the node's values serves, and z is taken per pair, not per row."""
        fitted = self.of if self.of is not None else self
        codes = fitted._codes(frame)
        if not (codes >= 0).any():
            return None
        pair_codes, npairs, pair_groups, owner_groups = self._pairs(frame, codes)
        xn = group_median(frame.cols(ACTIVITY), pair_codes, npairs, pair_groups)
        job = np.full(npairs, -1)
        job[pair_codes] = codes  # a pair's rows share its job
        zn = np.full(xn.shape, np.nan)
        ok = job >= 0
        c = job[ok]
        med, scale = fitted._modes()  # a job's busy mode is its even column
        zn[ok] = (xn[ok] - med[_ACT][:, 2 * c].T) / scale[_ACT][:, 2 * c].T
        ref = np.full(zn.shape, np.nan)
        for _, rows in owner_groups:
            block = zn[rows]  # (g, nodes, fields)
            mag = np.where(np.isnan(block), np.inf, np.abs(block))
            nearest = np.take_along_axis(block, mag.argmin(axis=1)[:, None, :], axis=1)
            ref[rows] = nearest
        return pair_codes, np.abs(zn - ref)

    def _pairs(self, frame: Frame, codes: np.ndarray) -> tuple[Any, ...]:
        """Each row's (job, node) pair code, how many pairs, their `by_size` groups, and the
        pairs grouped by owner (the job, and instant for multi-instant frames; owners of 2+
        nodes only). Kept while the rows' jobs, nodes (and times) are the last call's (a
        cycle's usually are)."""
        nodes = frame.node_codes[0]
        multi = multi_instant(frame)

        def groups() -> tuple[Any, ...]:
            owner = codes.astype(np.int64)
            if multi:
                owner = pd.factorize(pd.MultiIndex.from_arrays([codes, frame.time]))[0]
            owner = np.where(codes >= 0, owner, -1)
            return _pair_groups(owner, nodes.astype(np.int64))

        return self._pair_memo.get((codes, nodes, frame.time if multi else None), groups)

    def _node_shift(self, frame: Frame) -> np.ndarray:
        """(n, fields) |node median z - reference node's z| (NaN where not scored)."""
        shift = self._pair_shift(frame)
        if shift is None:
            return np.full((len(frame), len(ACTIVITY)), np.nan)
        pair_codes, pair_z = shift
        return pair_z[pair_codes]

    def score(self, frame: Frame) -> np.ndarray:
        shift = self._pair_shift(frame)
        if shift is None:
            return np.zeros(len(frame))
        pair_codes, pair_z = shift
        return rowmax(pair_z)[pair_codes] / z_crit(self.p, len(ACTIVITY))

    def explain(self, frame: Frame, rows: np.ndarray) -> list[str]:
        top, arg = nanmax_rows(self._node_shift(frame)[rows])
        return [
            f"{ACTIVITY[a]} on this node moved {top[i]:.1f} sigma more than on the job's "
            "least-changed node"
            for i, a in enumerate(arg)
        ]


def _pair_groups(owner: np.ndarray, nodes: np.ndarray) -> tuple[Any, ...]:
    """`NodeShift._pairs` from each row's owner (-1: not scored) and node."""
    span = nodes.max() + 1
    pair_codes, pair_uniq = pd.factorize(owner * span + nodes)
    pair_owner = np.asarray(pair_uniq) // span
    n_owner = int(pair_owner.max()) + 1 if len(pair_owner) else 0
    by_owner = by_size(np.where(pair_owner >= 0, pair_owner, -1), n_owner)
    return (
        pair_codes,
        len(pair_uniq),
        by_size(pair_codes, len(pair_uniq)),
        [(g, rows) for g, rows in by_owner if rows.shape[1] >= 2],
    )

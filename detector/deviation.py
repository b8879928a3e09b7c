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
from detector.frame import Frame, by_size
from detector.memo import Memo
from detector.perjob import PerJob


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

    def _fit_job(self, frame: Frame) -> dict[str, Any] | None:
        x = frame.cols(F.GAUGE_NAMES)
        busy = frame.col(F.UTIL) >= self.busy_util
        if busy.sum() < self.min_rows:
            return None
        nan = np.full(x.shape[1], np.nan)
        bmed, bmad = robust(x[busy])
        imed, imad = (nan, nan)
        if (~busy).sum() >= self.min_rows:
            imed, imad = robust(x[~busy])
        return {
            "busy_med_": bmed,
            "busy_scale_": self._scale(bmed, bmad),
            "idle_med_": imed,
            "idle_scale_": self._scale(imed, imad),
        }

    def _z(self, frame: Frame) -> np.ndarray:
        codes = self._codes(frame)
        x = frame.cols(F.GAUGE_NAMES)
        known = codes >= 0
        if not known.any():
            return np.full(x.shape, np.nan)
        idle = (frame.col(F.UTIL) < self.busy_util).astype(np.int64)
        mode = codes * 2 + idle  # one gather from the stacked (busy, idle) tables
        med = np.stack([self.busy_med_, self.idle_med_], axis=1).reshape(-1, x.shape[1])
        scale = np.stack([self.busy_scale_, self.idle_scale_], axis=1).reshape(-1, x.shape[1])
        if known.all():  # steady state: every job fitted, no masked gathers
            return np.abs(x - med[mode]) / scale[mode]
        z = np.full(x.shape, np.nan)
        m = mode[known]
        z[known] = np.abs(x[known] - med[m]) / scale[m]
        return z

    def score(self, frame: Frame) -> np.ndarray:
        return rowmax(self._z(frame)) / z_crit(self.p, len(F.GAUGES))

    def spinning(self, frame: Frame, power_share: float = 0.35) -> np.ndarray:
        """Rows that look busy (util >= `busy_util`) while drawing under `power_share` of the
        job's busy power: a spin-wait (NCCL/collective hang), never a healthy phase."""
        codes = self._codes(frame)
        out = np.zeros(len(frame), dtype=bool)
        known = codes >= 0
        if known.any():
            p = F.GAUGE_NAMES.index("DCGM_FI_DEV_POWER_USAGE")
            ref = self.busy_med_[codes[known], p]
            busy = frame.col(F.UTIL)[known] >= self.busy_util
            out[known] = busy & (frame.col("DCGM_FI_DEV_POWER_USAGE")[known] < power_share * ref)
        return out

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

    def _node_shift(self, frame: Frame) -> np.ndarray:
        """(n, fields) |node median z - reference node's z| (NaN where not scored)."""
        fitted = self.of if self.of is not None else self
        codes = fitted._codes(frame)
        x = frame.cols(ACTIVITY)
        out = np.full(x.shape, np.nan)
        known = codes >= 0
        if not known.any():
            return out
        med, scale = fitted.busy_med_[:, _ACT], fitted.busy_scale_[:, _ACT]  # columns, rows
        if known.all():
            z = (x - med[codes]) / scale[codes]
        else:
            z = np.full(x.shape, np.nan)
            c = codes[known]
            z[known] = (x[known] - med[c]) / scale[c]
        pair_codes, npairs, pair_groups, owner_groups = self._pairs(frame, codes, known)
        zn = group_median(z, pair_codes, npairs, pair_groups)  # (pairs, fields)
        ref = np.full(zn.shape, np.nan)
        for _, rows in owner_groups:
            block = zn[rows]  # (g, nodes, fields)
            mag = np.where(np.isnan(block), np.inf, np.abs(block))
            pick = np.take_along_axis(block, mag.argmin(axis=1)[:, None, :], axis=1)
            ref[rows] = np.broadcast_to(pick, block.shape)
        pair_z = np.abs(zn - ref)
        if known.all():
            return pair_z[pair_codes]
        out[known] = pair_z[pair_codes[known]]
        return out

    def _pairs(self, frame: Frame, codes: np.ndarray, known: np.ndarray) -> tuple[Any, ...]:
        """Each row's (job, node) pair code, how many pairs, their `by_size` groups, and the
        pairs grouped by owner (the job, and instant for multi-instant frames; owners of 2+
        nodes only). Kept while the rows' owners and nodes are the last call's (a cycle's
        usually are)."""
        nodes = frame.node_codes[0].astype(np.int64)
        owner = codes.astype(np.int64)
        if multi_instant(frame):
            owner = pd.factorize(pd.MultiIndex.from_arrays([codes, frame.time]))[0]
        owner = np.where(known, owner, -1)
        return self._pair_memo.get((owner, nodes), lambda: _pair_groups(owner, nodes))

    def score(self, frame: Frame) -> np.ndarray:
        return rowmax(self._node_shift(frame)) / z_crit(self.p, len(ACTIVITY))

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

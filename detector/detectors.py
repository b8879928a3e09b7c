"""The detectors. Each scores every row of a frame; 1.0 is the nominal alarm level (see `base`)."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from detector import fields as F
from detector.base import Detector, by_size, group_median, job_codes, z_crit
from detector.frame import Frame

FLOORS = np.array([f.floor for f in F.GAUGES])
MAD_TO_SIGMA = 1.4826


def _robust(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Column median and MAD-sigma, NaN-aware (all-NaN columns give NaN)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        med = np.nanmedian(x, axis=0)
        mad = np.nanmedian(np.abs(x - med), axis=0) * MAD_TO_SIGMA
    return med, mad


def _rowmax(z: np.ndarray) -> np.ndarray:
    """Row max ignoring NaN (0 where all NaN): the scoring path, no argmax."""
    if not z.shape[1]:
        return np.zeros(len(z))
    return np.nan_to_num(np.fmax.reduce(z, axis=1), nan=0.0)


def _nanmax_rows(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row max ignoring NaN (0 where all NaN) and the column of the max."""
    filled = np.where(np.isnan(z), -np.inf, z)
    arg = filled.argmax(axis=1)
    top = filled[np.arange(len(z)), arg]
    return np.where(np.isfinite(top), top, 0.0), arg


class _PerJob(Detector):
    """Fitted state as stacked per-job arrays: `jobs_` and one array per name in `state_keys`."""

    state_keys: ClassVar[tuple[str, ...]] = ()

    def _ensure(self) -> None:
        if not hasattr(self, "jobs_"):
            self.jobs_: list[str] = []
            for k in self.state_keys:
                setattr(self, k, None)

    def job_state(self, job: str) -> dict[str, Any] | None:
        self._ensure()
        if job not in self.jobs_:
            return None
        i = self.jobs_.index(job)
        return {k: _to_json(getattr(self, k)[i]) for k in self.state_keys}

    def set_job_state(self, job: str, state: dict[str, Any]) -> None:
        self._ensure()
        rows = {k: np.asarray(_from_json(state[k]), dtype=float) for k in self.state_keys}
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
        self.jobs_ = [j for j, k in zip(self.jobs_, keep, strict=True) if k]
        for k in self.state_keys:
            setattr(self, k, getattr(self, k)[keep] if keep.any() else None)

    def fit(self, frame: Frame) -> Detector:
        self._ensure()
        codes, uniques = pd.factorize(frame.job)
        order = np.argsort(codes, kind="stable")
        bounds = np.searchsorted(codes[order], np.arange(len(uniques) + 1))
        new: dict[str, dict[str, Any]] = {}
        for ci, job in enumerate(uniques):
            if job:
                state = self._fit_job(frame.take(order[bounds[ci] : bounds[ci + 1]]))
                if state is not None:
                    new[job] = state
        fresh = [j for j in new if j not in self.jobs_]
        for j in [j for j in new if j in self.jobs_]:
            self.set_job_state(j, new[j])
        if fresh:  # stack all new jobs at once (not one concatenate per job)
            for k in self.state_keys:
                block = np.stack([np.asarray(new[j][k], dtype=float) for j in fresh])
                old = getattr(self, k)
                setattr(self, k, block if old is None else np.concatenate([old, block]))
            self.jobs_.extend(fresh)
        return self

    def _fit_job(self, frame: Frame) -> dict[str, Any] | None:
        raise NotImplementedError

    def _codes(self, frame: Frame) -> np.ndarray:
        self._ensure()
        return job_codes(frame, self.jobs_)


def _to_json(a: np.ndarray) -> Any:
    if isinstance(a, np.ndarray):
        return np.where(np.isnan(a), None, a.astype(object)).tolist()  # type: ignore[call-overload]
    return None if isinstance(a, float) and np.isnan(a) else a


def _from_json(v: Any) -> Any:
    if isinstance(v, list):
        return np.array([np.nan if x is None else _from_json(x) for x in v], dtype=float)
    return np.nan if v is None else v


class BaselineDeviation(_PerJob):
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
        bmed, bmad = _robust(x[busy])
        imed, imad = (nan, nan)
        if (~busy).sum() >= self.min_rows:
            imed, imad = _robust(x[~busy])
        return {
            "busy_med_": bmed,
            "busy_scale_": self._scale(bmed, bmad),
            "idle_med_": imed,
            "idle_scale_": self._scale(imed, imad),
        }

    def _z(self, frame: Frame) -> np.ndarray:
        codes = self._codes(frame)
        x = frame.cols(F.GAUGE_NAMES)
        z = np.full(x.shape, np.nan)
        known = codes >= 0
        if not known.any():
            return z
        idle = (frame.col(F.UTIL)[known] < self.busy_util).astype(np.int64)
        mode = codes[known] * 2 + idle  # one gather from the stacked (busy, idle) tables
        med = np.stack([self.busy_med_, self.idle_med_], axis=1).reshape(-1, x.shape[1])
        scale = np.stack([self.busy_scale_, self.idle_scale_], axis=1).reshape(-1, x.shape[1])
        z[known] = np.abs(x[known] - med[mode]) / scale[mode]
        return z

    def score(self, frame: Frame) -> np.ndarray:
        return _rowmax(self._z(frame)) / z_crit(self.p, len(F.GAUGES))

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
        top, arg = _nanmax_rows(self._z(sub))
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
    score 0. Shares the deviation detector's fit.

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

    def _node_shift(self, frame: Frame) -> np.ndarray:
        """(n, fields) |node median z - reference node's z| (NaN where not scored)."""
        codes = self._codes(frame)
        x = frame.cols(ACTIVITY)
        out = np.full(x.shape, np.nan)
        known = codes >= 0
        if not known.any():
            return out
        c = codes[known]
        z = np.full(x.shape, np.nan)
        z[known] = (x[known] - self.busy_med_[c][:, _ACT]) / self.busy_scale_[c][:, _ACT]
        nodes = frame.node_codes[0].astype(np.int64)
        owner = codes.astype(np.int64)  # the job (and instant, for multi-instant frames)
        if _multi(frame):
            owner = pd.factorize(pd.MultiIndex.from_arrays([codes, frame.time]))[0]
        owner = np.where(known, owner, -1)
        pair_codes, pair_uniq = pd.factorize(owner * (nodes.max() + 1) + nodes)
        zn = group_median(z, pair_codes, len(pair_uniq))  # (pairs, fields)
        pair_owner = np.asarray(pair_uniq) // (nodes.max() + 1)
        ref = np.full(zn.shape, np.nan)
        n_owner = int(pair_owner.max()) + 1 if len(pair_owner) else 0
        for _, rows in by_size(np.where(pair_owner >= 0, pair_owner, -1), n_owner):
            if rows.shape[1] < 2:
                continue
            block = zn[rows]  # (g, nodes, fields)
            mag = np.where(np.isnan(block), np.inf, np.abs(block))
            pick = np.take_along_axis(block, mag.argmin(axis=1)[:, None, :], axis=1)
            ref[rows] = np.broadcast_to(pick, block.shape)
        out[known] = np.abs(zn - ref)[pair_codes][known]
        return out

    def score(self, frame: Frame) -> np.ndarray:
        return _rowmax(self._node_shift(frame)) / z_crit(self.p, len(ACTIVITY))

    def explain(self, frame: Frame, rows: np.ndarray) -> list[str]:
        top, arg = _nanmax_rows(self._node_shift(frame)[rows])
        return [
            f"{ACTIVITY[a]} on this node moved {top[i]:.1f} sigma more than on the job's "
            "least-changed node"
            for i, a in enumerate(arg)
        ]


class PeerComparison(Detector):
    """Each GPU against the job's other GPUs at the same instant (ranks should look alike).

    Robust z of each gauge against the median of the job's GPUs at that time, with the field's
    scale floor (or `rel_floor` of the median) as sigma; jobs with fewer than `min_peers` GPUs
    score 0. Needs no baseline, so it works from a job's first minute; it localises the culprit.

    >>> from detector.synthetic import healthy_frame
    >>> frame = healthy_frame(jobs=1, nodes=2, steps=3, seed=3)
    >>> det = PeerComparison().fit(frame)
    >>> bool(det.score(frame).max() < 1.0)
    True
    >>> util = frame.fields.index("DCGM_FI_DEV_GPU_UTIL")
    >>> frame.values[0, util] = 0.0  # the rank stuck on the host while its peers spin
    >>> bool(det.score(frame)[0] > 1.0)
    True
    """

    name = "peer"
    params = ("p", "rel_floor", "min_peers")

    def __init__(self, p: float = 1e-4, rel_floor: float = 0.05, min_peers: int = 3) -> None:
        self.p = p
        self.rel_floor = rel_floor
        self.min_peers = min_peers

    def fit(self, frame: Frame) -> Detector:
        self.n_features_in_ = len(F.GAUGES)
        return self

    def _z(self, frame: Frame) -> np.ndarray:
        x = frame.cols(F.GAUGE_NAMES)
        z = np.full(x.shape, np.nan)
        if not len(frame):
            return z
        if _multi(frame):
            codes, uniques = pd.factorize(pd.MultiIndex.from_arrays([frame.job, frame.time]))
        else:
            codes, uniques = frame.job_codes
        n = len(uniques)
        size = np.bincount(codes, minlength=n)
        med = group_median(x, codes, n)[codes]
        scale = np.fmax(FLOORS, self.rel_floor * np.abs(med))
        ok = (size[codes] >= self.min_peers) & (frame.job != "")
        z[ok] = np.abs(x[ok] - med[ok]) / scale[ok]
        return z

    def score(self, frame: Frame) -> np.ndarray:
        return _rowmax(self._z(frame)) / z_crit(self.p, len(F.GAUGES))

    def explain(self, frame: Frame, rows: np.ndarray) -> list[str]:
        top, arg = _nanmax_rows(self._z(frame)[rows])
        x = frame.cols(F.GAUGE_NAMES)[rows]
        return [
            f"{F.GAUGE_NAMES[a]}={x[i, a]:.4g} is {top[i]:.1f} sigma from the job's other GPUs"
            for i, a in enumerate(arg)
        ]


def _multi(frame: Frame) -> bool:
    return len(frame) > 0 and frame.time[0] != frame.time[-1]


class Progress(_PerJob):
    """The job's own progress: stall (time since last progress) and step-time slowdown.

    Fit learns the job's median step time, its robust spread (log scale), and the longest
    progress gap seen while healthy (checkpoints, evals). Stall score = stall / allowance, with
    allowance = max(`stall_factor` x step, 1.5 x longest healthy gap, `min_stall_s`) (or
    `unfitted_stall_s` before a baseline exists); slowdown score = robust z of log step time /
    z_crit(p), 0 for 1.5 x the job's usual pause length (p99 fitted; `unknown_pause_s` before
    one was seen) + max(`after_pause_s`, 30 steps)
    after a pause began (the first steps after a checkpoint or a restart run slow). Catches
    hangs that GPU metrics disguise (spin-wait at 100 % util).

    >>> import numpy as np
    >>> from detector.synthetic import healthy_frame
    >>> det = Progress().fit(healthy_frame(jobs=1, nodes=1, steps=60, seed=4))
    >>> test = healthy_frame(jobs=1, nodes=1, steps=2, seed=5, start=900.0)
    >>> bool(det.score(test).max() < 1.0)
    True
    >>> test.values[:, test.fields.index("goodput_job_stall_seconds")] = 600.0  # no progress
    >>> bool(det.score(test).min() > 1.0)
    True
    """

    name = "progress"
    params = (
        "p",
        "stall_factor",
        "min_stall_s",
        "unfitted_stall_s",
        "rel_floor",
        "after_pause_s",
        "unknown_pause_s",
    )
    state_keys = ("step_", "step_scale_", "gap_", "pause_")
    pause_: np.ndarray
    step_: np.ndarray
    step_scale_: np.ndarray
    gap_: np.ndarray

    def __init__(
        self,
        p: float = 1e-4,
        stall_factor: float = 10.0,
        min_stall_s: float = 180.0,
        unfitted_stall_s: float = 300.0,
        rel_floor: float = 0.05,
        after_pause_s: float = 10.0,
        unknown_pause_s: float = 30.0,
    ) -> None:
        self.p = p
        self.stall_factor = stall_factor
        self.min_stall_s = min_stall_s
        self.unfitted_stall_s = unfitted_stall_s
        self.rel_floor = rel_floor
        self.after_pause_s = after_pause_s
        self.unknown_pause_s = unknown_pause_s

    def _fit_job(self, frame: Frame) -> dict[str, Any] | None:
        it = frame.col(F.ITER_SECONDS)
        it = it[np.isfinite(it) & (it > 0)]
        if len(it) < 3:
            return None
        logs = np.log(it)
        med = float(np.median(logs))
        mad = float(np.median(np.abs(logs - med))) * MAD_TO_SIGMA
        stall = frame.col(F.STALL_SECONDS)
        gap = float(np.nanmax(stall)) if np.isfinite(stall).any() else 0.0
        since = frame.col(F.SINCE_PAUSE)
        with np.errstate(invalid="ignore"):
            paused = stall[np.isfinite(since) & (since <= stall)]  # samples inside a pause
        pause = float(np.percentile(paused, 99)) if len(paused) else 0.0
        return {
            "step_": np.exp(med),
            "step_scale_": max(mad, self.rel_floor),
            "gap_": gap,
            "pause_": pause,
        }

    def _parts(self, frame: Frame) -> tuple[np.ndarray, np.ndarray]:
        codes = self._codes(frame)
        stall = frame.col(F.STALL_SECONDS)
        it = frame.col(F.ITER_SECONDS)
        allow = np.full(len(frame), self.unfitted_stall_s)
        slow = np.zeros(len(frame))
        known = codes >= 0
        if known.any():
            c = codes[known]
            allow[known] = np.fmax(
                np.fmax(self.stall_factor * self.step_[c], 1.5 * self.gap_[c]), self.min_stall_s
            )
            with np.errstate(all="ignore"):
                z = (np.log(it[known]) - np.log(self.step_[c])) / self.step_scale_[c]
                # the first iterations after a pause (a save, a restart) run slow: measured
                # ~18 % for ~10 iterations on an H200; not a straggler
                since = frame.col(F.SINCE_PAUSE)[known]
                usual = np.where(self.pause_[c] > 0, self.pause_[c], self.unknown_pause_s)
                settle = 1.5 * usual + np.fmax(self.after_pause_s, 30.0 * self.step_[c])
                settling = since <= settle
            slow[known] = np.where(settling, 0.0, np.nan_to_num(np.fmax(z, 0.0)) / z_crit(self.p))
        return np.nan_to_num(stall / allow), slow

    def score(self, frame: Frame) -> np.ndarray:
        stall, slow = self._parts(frame)
        return np.fmax(stall, slow)

    def explain(self, frame: Frame, rows: np.ndarray) -> list[str]:
        stall, slow = self._parts(frame.take(rows))
        st = frame.col(F.STALL_SECONDS)[rows]
        it = frame.col(F.ITER_SECONDS)[rows]
        return [
            f"no progress for {st[i]:.0f} s"
            if stall[i] >= slow[i]
            else f"step time {it[i]:.3g} s is slower than the job's baseline"
            for i in range(len(rows))
        ]


_XID_TABLE = np.zeros(1024)
for _x, _s in F.XID_SCORES.items():
    _XID_TABLE[_x] = _s
_COUNTERS = tuple(F.COUNTERS)
_ALLOW = np.array([F.COUNTERS[c] for c in _COUNTERS])
_SEVERE = np.array([F.COUNTERS[c] < 1.0 for c in _COUNTERS])  # any count at all is evidence


class HardwareEvents(Detector):
    """Direct hardware evidence: the last XID (NVIDIA's table) and error counters.

    Counter score = increase over the GPU's baseline (the lowest value fitted for that GPU;
    the engine fits a GPU when it first sees it) / the allowance in `fields.COUNTERS` (DBE,
    uncorrectable rows and remap failures: any count scores 2). A GPU with no baseline is scored
    on its severe counters' absolute values only. State is per GPU (node/gpu), not per job,
    held as a sorted integer key array so scoring is a searchsorted and a gather.

    >>> from detector.synthetic import healthy_frame
    >>> frame = healthy_frame(jobs=1, nodes=1, steps=2, seed=6)
    >>> det = HardwareEvents().fit(frame)
    >>> float(det.score(frame).max())
    0.0
    >>> frame.values[3, frame.fields.index("DCGM_FI_DEV_XID_ERRORS")] = 79  # fell off the bus
    >>> float(det.score(frame)[3])
    2.0
    """

    name = "hardware"
    params = ()

    def _ensure(self) -> None:
        if not hasattr(self, "keys_"):
            self.nodes_: dict[str, int] = {}
            self.keys_ = np.zeros(0, dtype=np.int64)
            self.base_ = np.zeros((0, len(_COUNTERS)))

    def _keys(self, frame: Frame, add: bool) -> np.ndarray:
        codes, uniques = frame.node_codes
        if add:
            for u in uniques:
                self.nodes_.setdefault(str(u), len(self.nodes_))
        ids = np.array([self.nodes_.get(str(u), -1) for u in uniques] + [-1], dtype=np.int64)
        node = ids[codes] if len(codes) else np.zeros(0, dtype=np.int64)
        return np.where(node >= 0, node * 1024 + frame.gpu, -1)

    def _lookup(self, keys: np.ndarray) -> np.ndarray:
        """Row of each key in the baseline table (-1 if unknown)."""
        if not len(self.keys_):
            return np.full(len(keys), -1)
        pos = np.minimum(np.searchsorted(self.keys_, keys), len(self.keys_) - 1)
        return np.where(self.keys_[pos] == keys, pos, -1)

    def fit(self, frame: Frame) -> Detector:
        self._ensure()
        if not len(frame):
            return self
        keys = self._keys(frame, add=True)
        x = frame.cols(_COUNTERS)
        uk, inv = np.unique(keys, return_inverse=True)
        low = np.full((len(uk), len(_COUNTERS)), np.inf)
        np.fmin.at(low, inv, np.where(np.isnan(x), np.inf, x))
        low[np.isinf(low)] = np.nan
        pos = self._lookup(uk)
        known = pos >= 0
        self.base_[pos[known]] = np.fmin(self.base_[pos[known]], low[known])
        if (~known).any():
            keys_all = np.concatenate([self.keys_, uk[~known]])
            base_all = np.concatenate([self.base_, low[~known]])
            order = np.argsort(keys_all, kind="stable")
            self.keys_, self.base_ = keys_all[order], base_all[order]
        return self

    def known(self, frame: Frame) -> np.ndarray:
        """Which rows' GPUs have a counter baseline."""
        self._ensure()
        return self._lookup(self._keys(frame, add=False)) >= 0

    def _parts(self, frame: Frame) -> tuple[np.ndarray, np.ndarray]:
        self._ensure()
        xid = np.nan_to_num(frame.col(F.XID_FIELD)).astype(np.int64)
        xid_score = _XID_TABLE[np.clip(xid, 0, len(_XID_TABLE) - 1)]
        x = frame.cols(_COUNTERS)
        pos = self._lookup(self._keys(frame, add=False))
        base = np.full(x.shape, np.nan)
        base[pos >= 0] = self.base_[pos[pos >= 0]]
        severe_abs = np.where(_SEVERE, x, np.nan)
        inc = np.where(np.isnan(base), severe_abs, x - base)
        with np.errstate(all="ignore"):
            c = np.nan_to_num(np.fmax(inc, 0.0) / _ALLOW)
        return xid_score, c

    def score(self, frame: Frame) -> np.ndarray:
        xid, c = self._parts(frame)
        return np.fmax(xid, np.minimum(c.max(axis=1, initial=0.0), 10.0))

    def explain(self, frame: Frame, rows: np.ndarray) -> list[str]:
        sub = frame.take(rows)
        xid, c = self._parts(sub)
        out = []
        for i in range(len(rows)):
            a = int(c[i].argmax())
            code = sub.col(F.XID_FIELD)[i]
            if xid[i] >= c[i, a] and np.isfinite(code):
                out.append(f"XID {int(code)}")
            elif not c[i, a] > 0:
                out.append("no XID and no error counter rise")
            else:
                value = sub.col(_COUNTERS[a])[i]
                out.append(f"{_COUNTERS[a]} rose to {value:g}")
        return out

    def to_dict(self) -> dict[str, Any]:
        self._ensure()
        d = super().to_dict()
        names = {v: k for k, v in self.nodes_.items()}
        d["gpus"] = {
            f"{names[int(k) // 1024]}/{int(k) % 1024}": _to_json(b)
            for k, b in zip(self.keys_, self.base_, strict=True)
        }
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Detector:
        det = super().from_dict(data)
        assert isinstance(det, HardwareEvents)
        det._ensure()
        gpus = data.get("gpus", {})
        if gpus:
            node = np.array([str(k).rsplit("/", 1)[0] for k in gpus], dtype=object)
            gpu = np.array([int(str(k).rsplit("/", 1)[1]) for k in gpus], dtype=np.int64)
            rows = np.array([_from_json(list(v)) for v in gpus.values()], dtype=float)
            n = len(gpus)
            values = np.full((n, len(F.ALL_FIELDS)), np.nan)
            values[:, [F.ALL_FIELDS.index(c) for c in _COUNTERS]] = rows
            det.fit(Frame(np.zeros(n), np.full(n, "", dtype=object), node, gpu, values))
        return det


class RobustCovariance(_PerJob):
    """Multivariate view: robust Mahalanobis distance of each GPU from its job's busy baseline.

    Fit (per job, outside the scoring loop) standardises the gauges by the robust median and
    the floored MAD-sigma, then fits scikit-learn's MinCovDet (seeded) and keeps its location
    and the whitening matrix W of a regularised precision (covariance + `ridge` x I: one floor
    is one sigma at most; precision = W W^T). Correlations matter: power, clocks and activity
    move together in healthy training, so a spin-wait (util high, power low) is far even
    when each field alone is borderline.
    Score = sqrt(d^2 / chi2.isf(p, k)), k = fields present, d^2 = |W^T (z - loc)|^2: one batched
    matmul per distinct job size, over all jobs at once.
    Idle rows score 0 (whole-job stalls are the progress detector's).

    >>> from detector.synthetic import healthy_frame
    >>> det = RobustCovariance(seed=0).fit(healthy_frame(jobs=1, nodes=1, steps=60, seed=7))
    >>> test = healthy_frame(jobs=1, nodes=1, steps=1, seed=8, start=900.0)
    >>> bool(det.score(test).max() < 1.0)
    True
    >>> test.values[0, test.fields.index("DCGM_FI_DEV_POWER_USAGE")] = 125.0
    >>> bool(det.score(test)[0] > 1.0)
    True
    """

    name = "multivariate"
    params = ("seed", "p", "ridge", "busy_util", "min_rows")
    state_keys = ("med_", "scale_", "loc_", "white_", "k_")
    med_: np.ndarray
    scale_: np.ndarray
    loc_: np.ndarray
    white_: np.ndarray
    k_: np.ndarray

    def __init__(
        self,
        seed: int = 0,
        p: float = 1e-4,
        ridge: float = 0.5,
        busy_util: float = 50.0,
        min_rows: int = 30,
    ) -> None:
        self.seed = seed
        self.p = p
        self.ridge = ridge
        self.busy_util = busy_util
        self.min_rows = min_rows

    def _fit_job(self, frame: Frame) -> dict[str, Any] | None:
        from sklearn.covariance import MinCovDet

        x = frame.cols(F.GAUGE_NAMES)[frame.col(F.UTIL) >= self.busy_util]
        if len(x) < self.min_rows:
            return None
        med, mad = _robust(x)
        present = np.isfinite(med)
        scale = np.where(present, np.fmax(np.nan_to_num(mad), FLOORS), 1.0)
        z = np.nan_to_num((x - np.nan_to_num(med)) / scale)[:, present]
        with warnings.catch_warnings():  # constant fields (e.g. memory clock) are expected
            warnings.simplefilter("ignore")
            mcd = MinCovDet(random_state=self.seed, support_fraction=0.75).fit(z)
        k = int(present.sum())
        loc = np.zeros(len(F.GAUGES))
        loc[present] = mcd.location_
        white = np.zeros((len(F.GAUGES), len(F.GAUGES)))
        prec = np.linalg.inv(mcd.covariance_ + self.ridge * np.eye(k))
        white[np.ix_(present, present)] = np.linalg.cholesky((prec + prec.T) / 2)
        return {"med_": med, "scale_": scale, "loc_": loc, "white_": white, "k_": np.array(k)}

    def score(self, frame: Frame) -> np.ndarray:
        from scipy.stats import chi2

        codes = self._codes(frame)
        out = np.zeros(len(frame))
        ok = (codes >= 0) & (frame.col(F.UTIL) >= self.busy_util)
        if not ok.any():
            return out
        c = codes[ok]
        d = np.zeros((len(frame), len(F.GAUGES)))
        z = np.nan_to_num((frame.cols(F.GAUGE_NAMES)[ok] - self.med_[c]) / self.scale_[c])
        d[ok] = z - self.loc_[c]
        d2 = np.zeros(len(frame))
        for g, rows in by_size(np.where(ok, codes, -1), len(self.jobs_)):
            w = np.matmul(d[rows], self.white_[g])  # (g, s, k) @ (g, k, k)
            d2[rows] = np.einsum("gsk,gsk->gs", w, w)
        crit = chi2.isf(self.p, np.maximum(self.k_, 1))
        out[ok] = np.sqrt(np.fmax(d2[ok], 0.0) / crit[c])
        return out


ALL: tuple[type[Detector], ...] = (
    BaselineDeviation,
    NodeShift,
    PeerComparison,
    Progress,
    HardwareEvents,
    RobustCovariance,
)

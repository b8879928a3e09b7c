"""Hardware events: XIDs (NVIDIA's table, weights from the catalogue) and error counters per GPU."""

from __future__ import annotations

from typing import Any

import numpy as np

from detector import fields as F
from detector.base import Detector
from detector.frame import Frame
from detector.memo import Memo

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
    _fits = 0  # how many times `fit` changed the table (the row memo's check)

    def __init__(self) -> None:
        self._memo: dict[str, Memo[Any]] = {k: Memo() for k in ("ids", "pos", "rows")}

    def _ensure(self) -> None:
        if not hasattr(self, "keys_"):
            self.nodes_: dict[str, int] = {}
            self.keys_ = np.zeros(0, dtype=np.int64)
            self.base_ = np.zeros((0, len(_COUNTERS)))

    def _keys(self, frame: Frame, add: bool) -> np.ndarray:
        codes, uniques = frame.node_codes
        names = uniques.tolist()
        if add:
            for u in names:
                self.nodes_.setdefault(str(u), len(self.nodes_))
        get = self.nodes_.get
        ids = self._memo["ids"].get(  # kept while the nodes and the table are the same
            (names, len(self.nodes_)),
            lambda: np.array([get(str(u), -1) for u in names] + [-1], dtype=np.int64),
        )
        node = ids[codes] if len(codes) else np.zeros(0, dtype=np.int64)
        return np.where(node >= 0, node * 1024 + frame.gpu, -1)

    def _lookup(self, keys: np.ndarray) -> np.ndarray:
        """Row of each key in the baseline table (-1 if unknown); kept while the keys and
        the table are the last call's (a cycle's GPUs are the last one's)."""
        if not len(self.keys_):
            return np.full(len(keys), -1)
        table = self.keys_

        def lookup() -> np.ndarray:
            pos = np.minimum(np.searchsorted(table, keys), len(table) - 1)
            return np.where(table[pos] == keys, pos, -1)

        return self._memo["pos"].get((table, keys), lookup)

    def _base_rows(self, frame: Frame) -> tuple[np.ndarray, bool]:
        """Each row's counter baseline as (counters, n) planes (NaN where none) and whether
        any is NaN; kept while the frame's GPUs and the table are the last call's (a cycle's
        GPUs are the last one's; `fit` changes the table, counted in `_fits`)."""

        def gather() -> tuple[np.ndarray, bool]:
            pos = self._lookup(self._keys(frame, add=False))
            base = np.full((len(_COUNTERS), len(pos)), np.nan)
            base[:, pos >= 0] = self.base_[pos[pos >= 0]].T
            return base, bool(np.isnan(base).any())

        key = (*frame.node_codes, frame.gpu, self._fits)
        return self._memo["rows"].get(key, gather)

    def fit(self, frame: Frame) -> Detector:
        self._ensure()
        self._fits += 1
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

    def fell(self, frame: Frame) -> np.ndarray:
        """Rows whose counter fell below its baseline: reset (a reboot, a GPU reset, a board
        swapped), so the baseline must follow it down or new errors stay under the old count."""
        self._ensure()
        base, _ = self._base_rows(frame)
        with np.errstate(invalid="ignore"):
            below: np.ndarray = np.asarray(frame.cols(_COUNTERS).T < base)
        return np.asarray(below.any(axis=0), dtype=bool)

    def known(self, frame: Frame) -> np.ndarray:
        """Which rows' GPUs have a counter baseline."""
        self._ensure()
        return self._lookup(self._keys(frame, add=False)) >= 0

    def _parts(self, frame: Frame) -> tuple[np.ndarray, np.ndarray]:
        """(each row's XID score; (counters, n) planes of each counter's rise over the GPU's
        baseline / its allowance, NaN where not reported)."""
        self._ensure()
        code = frame.col(F.XID_FIELD)
        if (code >= 1).any():  # (the usual cycle has no XID at all: every score 0)
            xid = np.nan_to_num(code).astype(np.int64)
            xid_score = _XID_TABLE[np.clip(xid, 0, len(_XID_TABLE) - 1)]
        else:
            xid_score = np.zeros(len(code))
        x = frame.cols(_COUNTERS).T  # contiguous planes for the frames' column-major values
        base, gaps = self._base_rows(frame)
        with np.errstate(all="ignore"):
            rise = x - base
            if gaps:  # no baseline yet: only the severe counters count, from zero
                rise = np.where(np.isnan(base), np.where(_SEVERE[:, None], x, np.nan), rise)
            rise /= _ALLOW[:, None]
        return xid_score, rise

    def score(self, frame: Frame) -> np.ndarray:
        xid, rise = self._parts(frame)
        if not len(rise):
            return xid
        top = np.nan_to_num(np.fmax.reduce(rise, axis=0), nan=0.0)  # a fall scores 0
        return np.fmax(xid, np.clip(top, 0.0, 10.0))

    def explain(self, frame: Frame, rows: np.ndarray) -> list[str]:
        sub = frame.take(rows)
        xid, rise = self._parts(sub)
        c = np.nan_to_num(np.fmax(rise, 0.0)).T
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

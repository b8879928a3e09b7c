"""Peer comparison: each GPU against the job's other GPUs at the same instant."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd

from detector import fields as F
from detector.base import (
    FLOORS,
    Detector,
    group_blocks,
    line_median,
    multi_instant,
    nanmax_rows,
    share_job_medians,
    z_crit,
)
from detector.frame import Frame


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

    def _blocks(self, frame: Frame) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(row index (g, s), their z as (fields, g, s)) for each size of scored group (a job,
        or a job at one instant in a recording) with `min_peers` or more GPUs."""
        if not len(frame):
            return
        groups, table = None, None
        if multi_instant(frame):
            codes, uniques = pd.factorize(pd.MultiIndex.from_arrays([frame.job, frame.time]))
            named = np.asarray(uniques.get_level_values(0), dtype=object) != ""
        else:  # one instant: every job's medians, kept for the others (`share_job_medians`)
            (codes, uniques), groups, named = frame.job_codes, frame.job_groups, frame.job_named
            table = np.full((len(uniques), len(F.GAUGES)), np.nan)
        floors = FLOORS[:, None, None]
        for g, rows, x in group_blocks(frame.cols(F.GAUGE_NAMES), codes, len(uniques), groups):
            med = line_median(x)  # (fields, g)
            if table is not None:
                table[g] = med.T
            scored = named[g] & (rows.shape[1] >= self.min_peers)
            if not scored.any():
                continue
            if not scored.all():
                rows, x, med = rows[scored], x[:, scored], med[:, scored]
            med = med[..., None]
            z = np.abs(np.subtract(x, med, out=x), out=x)  # in place: x is the blocks' copy
            yield rows, np.divide(z, np.fmax(floors, self.rel_floor * np.abs(med)), out=z)
        if table is not None:
            share_job_medians(frame, dict(zip(F.GAUGE_NAMES, table.T, strict=True)))

    def _z(self, frame: Frame) -> np.ndarray:
        z = np.full((len(frame), len(F.GAUGES)), np.nan)
        for rows, zb in self._blocks(frame):
            z[rows] = np.moveaxis(zb, 0, -1)
        return z

    def score(self, frame: Frame) -> np.ndarray:
        out = np.zeros(len(frame))
        for rows, zb in self._blocks(frame):  # a max over field planes, NaN ignored
            out[rows] = np.nan_to_num(np.fmax.reduce(zb, axis=0), nan=0.0)
        return out / z_crit(self.p, len(F.GAUGES))

    def explain(self, frame: Frame, rows: np.ndarray) -> list[str]:
        top, arg = nanmax_rows(self._z(frame)[rows])
        x = frame.cols(F.GAUGE_NAMES)[rows]
        return [
            f"{F.GAUGE_NAMES[a]}={x[i, a]:.4g} is {top[i]:.1f} sigma from the job's other GPUs"
            for i, a in enumerate(arg)
        ]

"""The one small interface every detector shares, and the calibration every score follows.

Calibration: each detector turns its evidence into a deviation `d` in robust sigmas (or an
event weight) and divides by the critical value `z_crit(p, k)`: the two-sided normal quantile
at false-alarm probability `p` per series and sample, Bonferroni-corrected for the `k` fields
taken as a max. So **score 1.0 = every detector's nominal alarm level** (the alerts start
there), and healthy (normal-noise) data exceeds it with probability about `p`; persistence
(`persist_s` in the pipeline) cuts the rate further.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Any, ClassVar

import numpy as np
from scipy.stats import norm

from detector import fields as F
from detector.frame import Frame, Groups, by_size

FLOORS = np.array([f.floor for f in F.GAUGES])  # each gauge's scale floor (its own unit)
MAD_TO_SIGMA = 1.4826


@lru_cache(maxsize=256)
def z_crit(p: float, k: int = 1) -> float:
    """Two-sided normal critical value at false-alarm probability p over k fields (max)."""
    if not 0 < p < 1:
        raise ValueError(f"false-alarm probability must be in (0, 1), got {p}")
    return float(norm.isf(p / (2 * max(k, 1))))


def group_blocks(
    values: np.ndarray, codes: np.ndarray, ngroups: int, groups: Groups | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Rows of `values` (n, m) grouped by code, one group size at a time: (group ids (g,),
    row index (g, s), their values as (m, g, s)): field planes, so that a median or a z is
    taken along a contiguous last axis and a max over the fields is a reduction of planes.
    `groups`: `by_size` of the codes when the caller has it (e.g. `Frame.job_groups`)."""
    columns = values.T  # contiguous for the frames' column-major values
    for g, rows in by_size(codes, ngroups) if groups is None else groups:
        yield g, rows, np.take(columns, rows, axis=1)  # C-ordered (`[:, rows]` is not)


def line_median(block: np.ndarray) -> np.ndarray:
    """Medians along the last axis of `block`, NaN-aware (NaN where a line has no value):
    one sort, NaN last, so the sorted last value says which lines miss one; only those with
    any value take the counting path (numpy's nanmedian took 4-9 ms per call at 10,000 GPUs
    when one value was missing)."""
    srt = np.sort(block, axis=-1)
    size = srt.shape[-1]
    if not size:
        return np.full(srt.shape[:-1], np.nan)
    if size % 2:
        med = srt[..., size // 2].copy()
    else:
        med = (srt[..., size // 2 - 1] + srt[..., size // 2]) / 2
    gaps = np.isnan(srt[..., -1]) & ~np.isnan(srt[..., 0])  # some values (none: NaN already)
    if gaps.any():
        part = srt[gaps]  # (lines, size), each with 1 to size - 1 values, NaN last
        med[gaps] = sorted_median(part, np.count_nonzero(~np.isnan(part), axis=-1), axis=-1)
    return med


def group_median(
    values: np.ndarray, codes: np.ndarray, ngroups: int, groups: Groups | None = None
) -> np.ndarray:
    """Column medians of `values` (n, m) per group code (n,) -> (ngroups, m), NaN-aware."""
    out = np.full((ngroups, values.shape[1]), np.nan)
    for g, _, block in group_blocks(values, codes, ngroups, groups):
        out[g] = line_median(block).T
    return out


def share_job_medians(frame: Frame, known: dict[str, np.ndarray]) -> None:
    """Keep jobs' medians a detector worked out (column -> per job of `frame.job_codes`) for
    `job_medians` while the frame is `unchanged` (peer gives the gauges', level takes three)."""
    kept: dict[str, np.ndarray] = frame.derived("job_medians", dict)
    kept.update(known)


def job_medians(frame: Frame, names: Sequence[str]) -> np.ndarray:
    """(jobs of `frame.job_codes`, len(names)): each job's median of each column over its rows
    in a frame of one instant, NaN-aware; each column worked out once while the frame is
    `unchanged` (or taken from `share_job_medians`). A progress column holding one value per
    job (as a cycle's does) gives that value, without a sort."""
    codes, uniq = frame.job_codes
    kept: dict[str, np.ndarray] = frame.derived("job_medians", dict)
    todo = []
    for name in (n for n in dict.fromkeys(names) if n not in kept):
        one = frame.one_per_job([name]) if name in F.PROGRESS else None
        if one is not None:
            kept[name] = frame.col(name)[one[0]]
        else:
            todo.append(name)
    if todo:
        meds = group_median(frame.cols(todo), codes, len(uniq), frame.job_groups)
        kept.update(zip(todo, meds.T, strict=True))
    return np.column_stack([kept[n] for n in names])


def pause_open(stall: np.ndarray, since_pause: np.ndarray) -> np.ndarray:
    """Rows whose job's log has a pause open: one began at or after the last progress (or
    before any). `stall` and `since_pause` are seconds since each."""
    with np.errstate(invalid="ignore"):
        return np.isfinite(since_pause) & (~np.isfinite(stall) | (since_pause <= stall))


def nanmedian(x: np.ndarray, axis: int) -> np.ndarray:
    """`np.nanmedian(x, axis)` by one sort (NaN where a line has no value): numpy takes its
    masked-array path below 600 rows, 1.5 ms for a job's 256-row reservoir against 0.03 ms
    here (each fit computes four)."""
    srt = np.sort(x, axis=axis)  # NaN sorts last
    return sorted_median(srt, np.count_nonzero(~np.isnan(x), axis=axis), axis)


def sorted_median(srt: np.ndarray, n: np.ndarray, axis: int) -> np.ndarray:
    """Medians along `axis` of `srt`, sorted along it with NaN last, `n` values (not NaN) in
    each line: NaN where a line has none. An odd count's middle value is returned as it is
    (numpy averages it with itself, which overflows above half the float range)."""
    size = srt.shape[axis]
    if not size:
        return np.full(n.shape, np.nan)
    lines = np.moveaxis(srt, axis, -1)
    line = np.ix_(*map(np.arange, n.shape))  # every line, by open index grids
    a = lines[(*line, np.maximum((n - 1) // 2, 0))]
    b = lines[(*line, np.minimum(n // 2, size - 1))]
    with np.errstate(all="ignore"):
        med = np.where(n % 2 == 1, a, (a + b) / 2)
    return np.where(n > 0, med, np.nan)


def robust(x: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Median and MAD-sigma along `axis`, NaN-aware (lines without a value give NaN): one
    sort serves both (`sorted_distance_median`)."""
    srt = np.moveaxis(np.sort(x, axis=axis), axis, -1)  # NaN last
    n = np.count_nonzero(~np.isnan(srt), axis=-1)
    med = sorted_median(srt, n, -1)
    return med, sorted_distance_median(srt, n, med) * MAD_TO_SIGMA


def sorted_distance_median(srt: np.ndarray, n: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """`nanmedian(|x - centre|)` along the last axis, from `srt` (x sorted along it, NaN last,
    `n` values per line), bit for bit. Full lines (a full window) need no second sort: along
    a sorted line the distances fall, then rise, so the k + 1 nearest values are a run of it,
    and the k-th smallest distance is the least, over the runs of k + 1 values, of the larger
    distance at the run's two ends. Other lines (gaps, a distance not a number) are sorted."""
    size = srt.shape[-1]
    with np.errstate(all="ignore"):
        near = np.abs(srt - centre[..., None])  # the distances, in the line's order
    other = (n < size) | ~np.isfinite(centre)  # (only an infinite centre gives NaN distances)
    if not size or other.all():
        return nanmedian(near, -1)

    def least(k: int) -> np.ndarray:  # the k-th smallest distance (k from 1) of every line
        return np.maximum(near[..., : size - k + 1], near[..., k - 1 :]).min(axis=-1)

    with np.errstate(all="ignore"):
        a = least((size - 1) // 2 + 1)
        out = a if size % 2 else (a + least(size // 2 + 1)) / 2
    if other.any():
        out[other] = nanmedian(near[other], -1)
    return out


def nanpercentile(x: np.ndarray, q: float, axis: int = -1) -> np.ndarray:
    """`np.nanpercentile(x, q, axis)` (linear interpolation, NaN where a line has no value) by
    one sort: numpy's takes a Python loop over lines, and its plain percentile costs ~30 us of
    overhead per call, more than a refit's whole sort."""
    srt = np.moveaxis(np.sort(x, axis=axis), axis, -1)  # NaN last
    return sorted_percentile(srt, np.count_nonzero(~np.isnan(srt), axis=-1), q)


def sorted_percentile(srt: np.ndarray, n: np.ndarray, q: float) -> np.ndarray:
    """Percentile `q` along the last axis of `srt`, sorted with NaN last, `n` values in each
    line, as numpy's linear method gives it (its lerp from the nearer end); NaN where none."""
    if not srt.shape[-1]:
        return np.full(n.shape, np.nan)
    last = np.maximum(n - 1, 0)
    pos = last * (q / 100.0)
    lo = np.minimum(np.floor(pos).astype(np.int64), last)
    line = np.ix_(*map(np.arange, n.shape))
    a, b = srt[(*line, lo)], srt[(*line, np.minimum(lo + 1, last))]
    t = pos - lo
    with np.errstate(all="ignore"):
        out = np.where(t >= 0.5, b - (b - a) * (1 - t), a + (b - a) * t)
    return np.where(n > 0, out, np.nan)


def row_max(z: np.ndarray) -> np.ndarray:
    """`z.max(axis=1)` (NaN propagates; `rowmax` ignores it) over a column-major copy:
    numpy reduces a C-order (n, m) array along its rows with an m-long inner loop per row,
    ~10x slower than the copy and a column-wise pass for the 4 to 12 columns the detectors
    have (10,000 rows: 0.40 vs 0.04 ms)."""
    return np.asfortranarray(z).max(axis=1)


def rowmax(z: np.ndarray) -> np.ndarray:
    """Row max ignoring NaN (0 where all NaN): the scoring path, no argmax (column-major, as
    `row_max`)."""
    if not z.shape[1]:
        return np.zeros(len(z))
    return np.nan_to_num(np.fmax.reduce(np.asfortranarray(z), axis=1), nan=0.0)


def nanmax_rows(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row max ignoring NaN (0 where all NaN) and the column of the max."""
    filled = np.where(np.isnan(z), -np.inf, z)
    arg = filled.argmax(axis=1)
    top = filled[np.arange(len(z)), arg]
    return np.where(np.isfinite(top), top, 0.0), arg


def multi_instant(frame: Frame) -> bool:
    """Whether the frame holds more than one instant (a recording, not a cycle)."""
    return len(frame) > 0 and frame.time[0] != frame.time[-1]


class Detector:
    """Base: `fit(frame) -> self`, `score(frame) -> (n,) scores >= 0`, 1.0 = nominal alarm level.

    The constructor stores parameters only; `fit` learns per job (keyed by the frame's job
    column) and sets attributes ending in `_`; scoring never mutates. `job_state`/`set_job_state`
    carry one job's fitted state as JSON data (the baseline store keeps it by job name).
    """

    name: ClassVar[str] = "base"
    params: ClassVar[tuple[str, ...]] = ()

    def fit(self, frame: Frame) -> Detector:
        raise NotImplementedError

    def score(self, frame: Frame) -> np.ndarray:
        raise NotImplementedError

    def explain(self, frame: Frame, rows: np.ndarray) -> list[str]:
        """One short human reason per selected row."""
        return [self.name] * len(rows)

    # --- per-job state, so baselines can be stored and restored by job name -----------------
    def job_state(self, job: str) -> dict[str, Any] | None:
        """The fitted state of one job as plain JSON data (None if unknown)."""
        return None

    def set_job_state(self, job: str, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def jobs(self) -> list[str]:
        return list(getattr(self, "jobs_", []))

    def drop_jobs(self, jobs: set[str]) -> None:
        """Forget the fitted state of `jobs` (ended; their baselines live on in the store)."""

    def __repr__(self) -> str:
        args = ", ".join(f"{p}={getattr(self, p)!r}" for p in self.params)
        return f"{type(self).__name__}({args})"

"""`Frame`: GPU rows (time, job, node, gpu) x metric columns as numpy arrays, and its loaders.

A frame holds one instant (the service) or many (replay). Columns are `fields.ALL_FIELDS`;
a field nobody reported is all-NaN, so every detector works with dcgm-exporter's defaults alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from catalogue import names
from detector import fields as F

JOB_RE = names.JOB_ID
NODE_RE = names.NODE

# Column spellings accepted on input -> the frame's names.
ALIASES = {
    "timestamp": "time",
    "Timestamp": "time",
    "time": "time",
    "Hostname": "node",
    "hostname": "node",
    "node": "node",
    "hpc_job": "job_id",
    "job_id": "job_id",
    "gpu": "gpu",
}


Groups = list[tuple[np.ndarray, np.ndarray]]
T = TypeVar("T")


def repeated(value: object, n: int) -> np.ndarray:
    """An object array of `n` times `value` (np.full of objects is ~8x slower: 230 us for
    8,192 rows)."""
    return np.repeat(np.array([value], dtype=object), n)


def by_size(codes: np.ndarray, ngroups: int) -> Groups:
    """Rows grouped by code, bucketed by group size: [(group ids (g,), row index (g, s))].

    Lets per-group work run as a few batched numpy calls (one per distinct size) instead of a
    loop over groups. Codes < 0 are left out.
    """
    ok = np.flatnonzero(codes >= 0)
    order = ok[np.argsort(codes[ok], kind="stable")]
    size = np.bincount(codes[ok], minlength=ngroups)
    start = np.concatenate([[0], np.cumsum(size)[:-1]])
    out = []
    for s in np.unique(size[size > 0]):
        g = np.flatnonzero(size == s)
        out.append((g, order[start[g][:, None] + np.arange(s)]))
    return out


# DCGM's blank values (dcgm_structs.h: DCGM_INT32_BLANK 0x7ffffff0, DCGM_INT64_BLANK
# 0x7ffffffffffffff0 and DCGM_FP64_BLANK 2**47, each the base of a small range of blanks:
# not found, not supported, not permissioned; dcgm-exporter writes them as numbers, e.g.
# DCGM_FI_DEV_MEMORY_TEMP 9223372036854775794 on a GPU without that sensor)
INT32_BLANK = float(0x7FFFFFF0)
INT32_MAX = float(0x7FFFFFFF)
FP64_BLANK = 140737488355328.0  # 2**47; every int64 blank is above it too


def blank(values: np.ndarray) -> np.ndarray:
    """Where `values` hold no reading: not finite, at or above DCGM's FP64 blank (which every
    INT64 blank is too), or in the INT32 blank range (0x7ffffff0..0x7fffffff); no field the
    detector reads comes near either as a real reading."""
    with np.errstate(invalid="ignore"):
        return (
            ~np.isfinite(values)
            | (values >= FP64_BLANK)
            | ((values >= INT32_BLANK) & (values <= INT32_MAX))
        )


class FrameError(ValueError):
    """Input that cannot become a frame (missing columns, bad labels)."""


@dataclass(frozen=True)
class Frame:
    time: np.ndarray  # float64 (n,), unix seconds
    job: np.ndarray  # object (n,), job_id ("" when idle)
    node: np.ndarray  # object (n,)
    gpu: np.ndarray  # int64 (n,)
    values: np.ndarray  # float64 (n, len(fields))
    fields: tuple[str, ...] = F.ALL_FIELDS
    model: np.ndarray | None = None  # object (n,): dcgm's modelName ("" unknown), for priors

    def __len__(self) -> int:
        return len(self.time)

    @cached_property
    def job_codes(self) -> tuple[np.ndarray, np.ndarray]:
        """(code per row, unique job ids): computed once per frame, shared by the detectors."""
        codes, uniques = pd.factorize(self.job)
        return codes, np.asarray(uniques, dtype=object)

    @cached_property
    def job_named(self) -> np.ndarray:
        """Per unique job id of `job_codes`, whether it names a job ("" is none)."""
        return self.job_codes[1] != ""

    @cached_property
    def job_groups(self) -> Groups:
        """`by_size` of `job_codes`: the rows of each job, computed once per frame."""
        codes, uniques = self.job_codes
        return by_size(codes, len(uniques))

    @cached_property
    def job_first(self) -> np.ndarray:
        """Each job code's first row."""
        first = np.zeros(len(self.job_codes[1]), dtype=np.int64)
        for g, rows in self.job_groups:
            first[g] = rows[:, 0]
        return first

    def one_per_job(self, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray] | None:
        """(each job's first row, each row's job code) when the columns `names` hold one
        value per job (bit for bit) at one instant, else None. A service cycle's frame has
        the progress fields per job, so what follows from them alone is worked out once per
        job, not per GPU."""
        if not len(self) or self.time[0] != self.time[-1]:
            return None
        codes, first = self.job_codes[0], self.job_first
        for name in names:
            bits = self.col(name).view(np.int64)  # NaN equals NaN (ingest copies each job's)
            if not np.array_equal(bits, bits[first][codes]):
                return None
        return first, codes

    @contextmanager
    def unchanged(self) -> Iterator[None]:
        """While the caller does not change the frame (an engine step), what detectors derive
        from it is kept for one another (`derived`); outside, each computes its own (a frame
        may be changed in place between two scorings)."""
        self.__dict__["_derived"] = {}
        try:
            yield
        finally:
            del self.__dict__["_derived"]

    def derived(self, key: Any, compute: Callable[[], T]) -> T:
        """`compute()`, kept under `key` while the frame is `unchanged`."""
        kept = self.__dict__.get("_derived")
        if kept is None:
            return compute()
        if key not in kept:
            kept[key] = compute()
        value: T = kept[key]
        return value

    @cached_property
    def job_rows(self) -> JobRows:
        """The rows by job, padded (`JobRows`): one table for every detector fitting the frame."""
        return JobRows.of(self)

    @cached_property
    def node_codes(self) -> tuple[np.ndarray, np.ndarray]:
        codes, uniques = pd.factorize(self.node)
        return codes, np.asarray(uniques, dtype=object)

    @cached_property
    def model_codes(self) -> tuple[np.ndarray, np.ndarray]:
        """(code per row, unique modelName values), for the per-model priors."""
        codes, uniques = pd.factorize(self.models)
        return codes, np.asarray(uniques, dtype=object)

    def col(self, name: str) -> np.ndarray:
        """One metric column (NaN where not reported)."""
        return self.values[:, self.fields.index(name)]

    def cols(self, names: Sequence[str]) -> np.ndarray:
        return self.values[:, [self.fields.index(n) for n in names]]

    def with_values(self, time: np.ndarray, values: np.ndarray) -> Frame:
        """The same rows with other times and values (`values` follows this frame's rows);
        the label codes and groups computed on this frame are shared, not computed again."""
        out = Frame(time, self.job, self.node, self.gpu, values, self.fields, self.model)
        for k in ("job_codes", "node_codes", "job_groups", "job_first", "model_codes"):
            if k in self.__dict__:
                out.__dict__[k] = self.__dict__[k]
        return out

    def take(self, idx: np.ndarray) -> Frame:
        return Frame(
            self.time[idx],
            self.job[idx],
            self.node[idx],
            self.gpu[idx],
            self.values[idx],
            self.fields,
            None if self.model is None else self.model[idx],
        )

    @property
    def models(self) -> np.ndarray:
        """modelName per row ("" where unknown)."""
        if self.model is None:
            return repeated("", len(self))
        return self.model

    @staticmethod
    def from_columns(
        time: np.ndarray,
        node: np.ndarray,
        gpu: np.ndarray,
        job: np.ndarray,
        values: np.ndarray,
        host_map: dict[str, str] | None = None,
        model: np.ndarray | None = None,
    ) -> Frame:
        """Validated, sorted frame from columns (`values` follows `fields.ALL_FIELDS`): label
        values are checked once per distinct value, not per row."""
        n = len(time)
        time = np.asarray(time, dtype=float)
        if n and np.isnan(time).any():
            raise FrameError("column 'timestamp' has non-numeric values (want unix seconds)")
        ncodes, nuniq = pd.factorize(np.asarray(node, dtype=object))
        nuniq = np.array([str(h) for h in nuniq], dtype=object)
        if host_map:
            nuniq = np.array([host_map.get(h, h) for h in nuniq], dtype=object)
        bad = [h for h in nuniq if not NODE_RE.match(h)]
        if bad:
            raise FrameError(f"invalid node name(s): {bad[:5]}")
        gpu = np.asarray(gpu, dtype=float)
        if n and (np.isnan(gpu).any() or (gpu < 0).any() or (gpu > 999).any()):
            raise FrameError("column 'gpu' must hold GPU indexes 0..999")
        jcodes, juniq = pd.factorize(np.asarray(job, dtype=object))
        bad = [j for j in juniq if j and not JOB_RE.match(j)]
        if bad:
            raise FrameError(f"invalid job_id value(s): {bad[:5]}")
        node = nuniq[ncodes] if n else np.zeros(0, dtype=object)
        job = np.asarray(juniq, dtype=object)[jcodes] if n else np.zeros(0, dtype=object)
        rank = np.argsort(np.argsort(nuniq, kind="stable"))  # sort nodes by name, on codes
        order = np.lexsort((gpu, rank[ncodes] if n else ncodes, time))
        return Frame(
            time[order],
            job[order],
            node[order],
            gpu.astype(np.int64)[order],
            values[order],
            model=None if model is None else np.asarray(model, dtype=object)[order],
        )

    @staticmethod
    def from_dataframe(df: pd.DataFrame, host_map: dict[str, str] | None = None) -> Frame:
        """Wide table: a time column, node (Hostname/hostname), gpu, job (hpc_job/job_id),
        then metric columns named as dcgm-exporter / the log exporter name them."""
        df = df.rename(columns={c: ALIASES[c] for c in df.columns if c in ALIASES})
        missing = [c for c in ("time", "node", "gpu") if c not in df.columns]
        if missing:
            raise FrameError(f"missing column(s) {missing}; have {list(df.columns)[:20]}")
        n = len(df)
        time = pd.to_numeric(df["time"], errors="coerce").to_numpy(dtype=float)
        if n and np.isnan(time).any():
            raise FrameError("column 'timestamp' has non-numeric values (want unix seconds)")
        gpu = pd.to_numeric(df["gpu"], errors="coerce").to_numpy(dtype=float)
        if "job_id" in df.columns:
            job = df["job_id"].fillna("").astype(str).str.replace(r"\.0$", "", regex=True)
            job = job.to_numpy(dtype=object)
        else:
            job = np.full(n, "", dtype=object)
        for alias, name in F.ALIASES.items():
            if alias in df.columns and name not in df.columns:
                df = df.rename(columns={alias: name})
        values = np.full((n, len(F.ALL_FIELDS)), np.nan)
        for i, name in enumerate(F.ALL_FIELDS):
            if name in df.columns:
                values[:, i] = pd.to_numeric(df[name], errors="coerce").to_numpy(dtype=float)
        dcgm = values[:, : len(F.DCGM_FIELDS)]  # (the first fields: a view)
        dcgm[blank(dcgm)] = np.nan  # no reading, as the service reads it (`blank`)
        if F.LAST_PROGRESS in df.columns:  # derived: seconds since the job's last progress
            last = pd.to_numeric(df[F.LAST_PROGRESS], errors="coerce").to_numpy(dtype=float)
            values[:, F.ALL_FIELDS.index(F.STALL_SECONDS)] = np.maximum(time - last, 0.0)
        if F.LAST_PAUSE in df.columns:  # derived: seconds since the job's last pause began
            pause = pd.to_numeric(df[F.LAST_PAUSE], errors="coerce").to_numpy(dtype=float)
            with np.errstate(invalid="ignore"):
                since = np.where(pause <= time, time - pause, np.nan)
            values[:, F.ALL_FIELDS.index(F.SINCE_PAUSE)] = since
        node = df["node"].astype(str).to_numpy(dtype=object)
        if F.HOST_CPU_COUNTER in df.columns and F.HOST_CPU not in df.columns:
            cpu = pd.to_numeric(df[F.HOST_CPU_COUNTER], errors="coerce").to_numpy(dtype=float)
            values[:, F.ALL_FIELDS.index(F.HOST_CPU)] = counter_rate(time, node, gpu, cpu)
        model = None
        if "modelName" in df.columns:
            model = df["modelName"].fillna("").astype(str).to_numpy(dtype=object)
        return Frame.from_columns(time, node, gpu, job, values, host_map, model=model)

    def instants(self) -> list[np.ndarray]:
        """Row indexes of each distinct time, in order (frames are sorted by time)."""
        if not len(self):
            return []
        cuts = np.flatnonzero(np.diff(self.time)) + 1
        return np.split(np.arange(len(self)), cuts)


def counter_rate(
    time: np.ndarray,
    node: np.ndarray,
    gpu: np.ndarray,
    counter: np.ndarray,
    window_s: float = F.HOST_CPU_WINDOW_S,
) -> np.ndarray:
    """Per-second increase of a per-GPU counter between the GPU's previous sample (at most
    `window_s` earlier) and this one, as Prometheus' irate() reads it; NaN for a GPU's first
    sample, after a gap, across a reset, or where a value is missing; in the rows' order.

    >>> counter_rate(np.array([0, 5, 0, 5, 70.0]), np.array(["a", "a", "b", "b", "b"]),
    ...              np.zeros(5), np.array([1, 6, 3, 3.5, 9.5]), window_s=60).tolist()
    [nan, 1.0, nan, 0.1, nan]
    """
    out = np.full(len(time), np.nan)
    rows = np.flatnonzero(np.isfinite(counter) & np.isfinite(time))
    if not len(rows):
        return out
    ncodes = pd.factorize(np.asarray(node, dtype=object))[0]
    key = ncodes * 1000 + np.asarray(gpu, dtype=np.int64)  # GPU indexes are 0..999
    order = rows[np.lexsort((time[rows], key[rows]))]
    k, t, c = key[order], time[order], counter[order]
    dt, dc = np.diff(t), np.diff(c)
    ok = (k[1:] == k[:-1]) & (dt > 0) & (dt <= window_s) & (dc >= 0)
    out[order[1:][ok]] = dc[ok] / dt[ok]
    return out


def _last_progress(jobs: pd.DataFrame) -> pd.DataFrame:
    """Make the last-progress time trustworthy: a stamp later than the sample is dropped, and
    the iteration counter is a second witness (recordings may round or lose the stamp; the
    counter is what the exporter saw): it advanced after the job's previous sample, so a stamp
    since then is the time, and otherwise the sample's time is (a stamp kept exact: a
    restart's start-up pause opens with it, and a later one would close that pause)."""
    t = jobs["time"].to_numpy(dtype=float)
    last = np.full(len(jobs), np.nan)
    if F.LAST_PROGRESS in jobs:
        lp = pd.to_numeric(jobs[F.LAST_PROGRESS], errors="coerce").to_numpy(dtype=float)
        last = np.where(lp <= t, lp, np.nan)
    if F.ITERATION in jobs:
        by = jobs["job_id"].to_numpy()
        it = pd.to_numeric(jobs[F.ITERATION], errors="coerce")
        moved = (it > it.groupby(by).shift()).to_numpy()
        before = pd.Series(t).groupby(by).shift().to_numpy()
        with np.errstate(invalid="ignore"):
            when = np.where(last > before, last, t)
        seen = pd.Series(np.where(moved, when, np.nan)).groupby(by).ffill()
        last = np.fmax(last, seen.to_numpy())
    jobs = jobs.drop(columns=[c for c in (F.ITERATION,) if c in jobs])
    jobs[F.LAST_PROGRESS] = last
    return jobs


def join_progress(gpu: pd.DataFrame, jobs: pd.DataFrame) -> pd.DataFrame:
    """Attach each job's log-derived progress (the latest at or before each GPU row) to its rows.

    `jobs` is long per job: `time`/`timestamp`, `job_id`, and `goodput_job_*` columns.
    """
    if jobs is None or jobs.empty or "job_id" not in gpu.columns:
        return gpu
    jobs = jobs.rename(columns={"timestamp": "time"})
    keep = ["time", "job_id"] + [
        c for c in (F.ITER_SECONDS, F.LAST_PROGRESS, F.ITERATION, F.LAST_PAUSE) if c in jobs
    ]
    jobs = jobs[keep].copy()
    jobs["job_id"] = jobs["job_id"].astype(str).str.replace(r"\.0$", "", regex=True)
    jobs["time"] = jobs["time"].astype(float)
    jobs = _last_progress(jobs.sort_values(["job_id", "time"], kind="stable"))
    g = gpu.rename(columns={"timestamp": "time"}).copy()
    g["time"] = g["time"].astype(float)
    g["job_id"] = g["job_id"].fillna("").astype(str).str.replace(r"\.0$", "", regex=True)
    g = g.drop(
        columns=[c for c in (F.ITER_SECONDS, F.LAST_PROGRESS, F.LAST_PAUSE) if c in g.columns]
    )
    g["_row"] = np.arange(len(g))
    merged = pd.merge_asof(
        g.sort_values("time"),
        jobs.sort_values("time"),
        on="time",
        by="job_id",
        direction="backward",
    )
    return merged.sort_values("_row").drop(columns="_row").reset_index(drop=True)


@dataclass(frozen=True)
class JobRows:
    """A frame's rows by job, padded: job j's rows are `index[j, :count[j]]` (-1 after)."""

    frame: Frame
    jobs: list[str]
    index: np.ndarray  # (J, R) row numbers, -1 past each job's rows
    count: np.ndarray  # (J,)

    @classmethod
    def of(cls, frame: Frame) -> JobRows:
        codes, uniques = frame.job_codes
        known = np.flatnonzero(codes >= 0)  # pandas codes a missing label -1: no job
        order = known[np.argsort(codes[known], kind="stable")]
        count = np.bincount(codes[known], minlength=len(uniques))
        start = np.cumsum(count) - count
        index = np.full((len(uniques), int(count.max(initial=0))), -1, dtype=np.int64)
        index[codes[order], np.arange(len(order)) - start[codes[order]]] = order
        return cls(frame, uniques.tolist(), index, count)

    @property
    def present(self) -> np.ndarray:
        """(J, R): which places hold a row."""
        return self.index >= 0

    def col(self, name: str) -> np.ndarray:
        """(J, R) values of one column, NaN past each job's rows."""
        return np.where(self.present, self.frame.col(name)[self.index], np.nan)

    def cols(self, names: Sequence[str]) -> np.ndarray:
        """(len(names), J, R) field planes, NaN past each job's rows."""
        planes = np.take(self.frame.cols(names).T, self.index, axis=1)
        return np.where(self.present, planes, np.nan)

    def frames(self) -> Iterator[tuple[str, Frame]]:
        """Each job and its rows as a frame; a frame whose rows are all one job's (a refit's
        reservoir) as it is."""
        if len(self.jobs) == 1 and self.count[0] == len(self.frame):
            yield self.jobs[0], self.frame
            return
        for job, idx, n in zip(self.jobs, self.index, self.count.tolist(), strict=True):
            yield job, self.frame.take(idx[:n])

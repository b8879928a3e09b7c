"""What the detector service reads each cycle: a FIXED set of Prometheus queries (independent
of the number of jobs and GPUs) and the frame built from their answers.

Queries per cycle: one per DCGM field the engine reads, aggregated by Prometheus down to one
label (`max by` of node, gpu and job joined: the answer holds only what the engine reads),
`goodput_slurm_job_node_info` (job -> node where dcgm has no `hpc_job`), and the jobs' last
progress, iteration seconds and last pause (checkpoint save, start-up), and when each GPU was
last scraped (`SAMPLED`: which of two series of one GPU is the newest). With `--shard K/N`
every query selects `goodput_shard="K"`, the label Prometheus computes at scrape time (hashmod
of `hpc_job` / `job_id`), so a job's GPUs are always scored together and each replica's work is
O(its GPUs). The per-GPU and per-job answers are decoded straight into columns
(`clients.prometheus.decode_column`); what depends only on the answers' labels (split,
validation, the frame's order) is computed once per label set.

What is read as no reading (NaN): a value that is not finite (+Inf, -Inf, NaN) and DCGM's
blanks (`blank`: a field the GPU does not support, not found, not watched), so that no
detector scores them as readings. One GPU of one job answered by two series (the host label
spelled `Hostname` by older dcgm-exporter releases and `hostname` by newer ones, two exporters)
is one row: the newest series' (`_Split.twins`).
"""

from __future__ import annotations

import gc
import hashlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any

import numpy as np
import pandas as pd

from catalogue import names, promql
from clients.prometheus import Column, PromClient, samples
from detector import fields as F
from detector.frame import JOB_RE, NODE_RE, Frame, blank

NODE_INFO = "goodput_slurm_job_node_info"
KEY = "gpukey"  # the one label of the per-GPU answers: Hostname,hostname,gpu,hpc_job,modelName
PER_JOB = (F.LAST_PROGRESS, F.ITER_SECONDS, F.LAST_PAUSE)  # log-derived, one value per job
GPU_COLUMNS = (*F.DCGM_FIELDS, F.HOST_CPU)  # per-GPU answers
SAMPLED = "sampled"  # per GPU: when its power reading was scraped (Prometheus' sample time)


def host_cores(selector: str) -> str:
    """PromQL: the host-side counter of `selector`'s series in cores, as the detector reads it
    (irate over `fields.HOST_CPU_WINDOW_S`); the service's query and export-recording's."""
    return f"irate({selector}[{F.HOST_CPU_WINDOW_S:.0f}s])"


@dataclass(frozen=True)
class Shard:
    """This replica's share: jobs whose `goodput_shard` label is `index` (of `count`)."""

    index: int
    count: int

    @staticmethod
    def parse(text: str) -> Shard:
        k, sep, n = text.partition("/")
        if not (sep and k.isdigit() and n.isdigit() and 0 <= int(k) < int(n) <= 4096):
            raise ValueError(f"shard {text!r}: want K/N with 0 <= K < N <= 4096")
        return Shard(int(k), int(n))

    def owns(self, job_id: str) -> bool:
        """Prometheus' hashmod: md5 of the value, its low 8 bytes big-endian, mod N."""
        digest = hashlib.md5(job_id.encode(), usedforsecurity=False).digest()
        return int.from_bytes(digest[8:], "big") % self.count == self.index


def queries(shard: Shard | None = None) -> dict[str, str]:
    """field -> PromQL, for this cycle's fixed set (the DCGM fields, the GPUs' processes on
    the host, node info, progress)."""
    # a shard reads its jobs' GPUs and the GPUs with no job (no label: matched by "")
    gpu_sel: dict[str, Any] = {"goodput_shard": [str(shard.index), ""]} if shard else {}
    job_sel = {"goodput_shard": str(shard.index)} if shard else {}
    labels = ", ".join(promql.quote(n) for n in ("Hostname", "hostname", "gpu", "hpc_job"))
    spelled = {name: [name] for name in F.DCGM_FIELDS}  # a field and its other names
    for alias, name in F.ALIASES.items():
        spelled[name].append(alias)
    out = {
        name: f"max by ({KEY}) (label_join({promql.selector(__name__=names, **gpu_sel)}, "
        f'"{KEY}", ",", {labels}, "modelName"))'
        for name, names in spelled.items()
    }
    # the GPU's processes on the host, in cores (the NVML exporter's counter; absent: NaN)
    cpu = promql.selector(F.HOST_CPU_COUNTER, **gpu_sel)
    own = ", ".join(promql.quote(n) for n in ("node", "none", "gpu", "job_id", "model_name"))
    out[F.HOST_CPU] = (  # its labels are Goodput's: the same key as the fields' for the GPU
        f'max by ({KEY}) (label_join({host_cores(cpu)}, "{KEY}", ",", {own}))'
    )
    # one field's sample times: a GPU's fields are scraped together
    power = promql.selector("DCGM_FI_DEV_POWER_USAGE", **gpu_sel)
    out[SAMPLED] = (
        f'max by ({KEY}) (label_join(timestamp({power}), "{KEY}", ",", {labels}, "modelName"))'
    )
    out[NODE_INFO] = promql.selector(NODE_INFO, **job_sel)
    for name in PER_JOB:
        out[name] = f"max by (job_id) ({promql.selector(name, **job_sel)})"
    return out


def _per_job(col: Column) -> dict[str, float]:
    jobs, vals = col
    return dict(zip(jobs, vals.tolist(), strict=True))


def fetch(
    client: PromClient,
    host_map: dict[str, str] | None = None,
    now: float | None = None,
    shard: Shard | None = None,
) -> tuple[Frame, dict[str, str]]:
    """Query Prometheus (fixed query count) and build this instant's frame + job names."""
    now = time.time() if now is None else now
    qs = queries(shard)
    rows = _Rows(_LAST_SPLIT[0][0] if _LAST_SPLIT[0] is not None else [])
    # the small answers are asked first: they wait while the fields decode
    calls: list[Callable[[], Any]] = [partial(client.raw, qs[NODE_INFO])]
    calls += [partial(client.column, qs[n], "job_id") for n in PER_JOB]
    calls += [partial(client.column, qs[n], KEY) for n in GPU_COLUMNS]
    calls.append(partial(client.column, qs[SAMPLED], KEY))
    answers = client.many(calls)
    info, *per_job_raw = [next(answers) for _ in range(1 + len(PER_JOB))]
    for name in GPU_COLUMNS:  # each as it decodes
        col = F.ALL_FIELDS.index(name), *next(answers)
        if name == F.HOST_CPU:  # the NVML exporter's: onto the GPUs dcgm found
            rows.join(*col)
        else:
            rows.add(*col)
    rows.sampled(*next(answers))
    node_jobs: dict[str, set[str]] = {}
    names: dict[str, str] = {}
    for labels, _ in samples(info):
        j, h = labels.get("job_id", ""), labels.get("node", "")
        if JOB_RE.match(j) and NODE_RE.match(h):
            node_jobs.setdefault(h, set()).add(j)
            names[j] = labels.get("job_name") or j
    per_job = {name: _per_job(r) for name, r in zip(PER_JOB, per_job_raw, strict=True)}
    values = rows.values()
    lab = _split(rows.keys, host_map, node_jobs)
    jcodes, juniq = lab.jobs

    def by_job(name: str) -> np.ndarray:
        return np.array([per_job[name].get(j, np.nan) for j in juniq], dtype=float)[jcodes]

    last, pause = by_job(F.LAST_PROGRESS), by_job(F.LAST_PAUSE)
    values[:, F.ALL_FIELDS.index(F.ITER_SECONDS)] = by_job(F.ITER_SECONDS)
    values[:, F.ALL_FIELDS.index(F.STALL_SECONDS)] = np.maximum(now - last, 0.0)
    with np.errstate(invalid="ignore"):  # seconds since the job's last pause (save, start-up)
        values[:, F.ALL_FIELDS.index(F.SINCE_PAUSE)] = np.where(pause <= now, now - pause, np.nan)
    lab.keep_newest(values, rows.stamps)
    rows_of, template = lab.frame
    # column-major: the detectors read whole fields (contiguous) and reduce across a row's
    # fields (fast on this layout, see base.row_max); the same values either way
    values = np.asfortranarray(values[rows_of])
    return template.with_values(np.full(len(template), now), values), names


def _node_gpu(key: str) -> tuple[str, str]:
    """(node, GPU) of a per-GPU key `Hostname,hostname,gpu,hpc_job,modelName`."""
    parts = key.split(",", 3)
    return (parts[0] or parts[1], parts[2]) if len(parts) > 2 else ("", "")


class _Rows:
    """One row per distinct key over the fields' answers. Prometheus answers every field in
    the same series order, so a field whose keys equal the last one's reuses its codes (one
    list comparison); any other order is indexed."""

    def __init__(self, last: list[Any]) -> None:
        self.keys: list[Any] = []
        self.index = pd.Index([], dtype=object)
        self.parts: list[tuple[int, np.ndarray, np.ndarray]] = []
        self.last = last  # the last cycle's keys: a first answer in that order keeps them
        self._last: tuple[list[Any], np.ndarray] = ([], np.zeros(0, dtype=np.int64))
        self.stamps = np.zeros(0)  # per key: when the GPU was last scraped (`sampled`), or NaN

    def add(self, col: int, keys: list[Any], vals: np.ndarray) -> None:
        if not self.keys and self.last and keys == self.last:
            self.keys = self.last
            self.index = pd.Index(self.keys, dtype=object)
            self._last = (keys, np.arange(len(keys)))
        if keys == self._last[0]:
            codes = self._last[1]
        else:
            codes = self.index.get_indexer(keys) if len(self.index) else np.full(len(keys), -1)
            new = np.flatnonzero(codes < 0)
            if len(new):
                inv, fresh = pd.factorize(np.array(keys, dtype=object)[new])
                codes[new] = len(self.keys) + inv
                self.keys += fresh.tolist()
                self.index = pd.Index(self.keys, dtype=object)
            self._last = (keys, codes)
        self.parts.append((col, codes, vals))

    def join(self, col: int, keys: list[Any], vals: np.ndarray) -> None:
        """An answer from another exporter joined onto the GPUs the fields found: by its key,
        else by (node, GPU) (its other labels may differ: `hostname`'s spelling, no
        `hpc_job`); a GPU no field found is dropped, not made a row of its own."""
        codes = self.index.get_indexer(keys) if len(self.index) else np.full(len(keys), -1)
        if (codes < 0).any() and len(self.keys):
            by_gpu: dict[tuple[str, str], int] = {}
            for code, key in enumerate(self.keys):
                by_gpu.setdefault(_node_gpu(key), code)
            for i in np.flatnonzero(codes < 0).tolist():
                codes[i] = by_gpu.get(_node_gpu(keys[i]), -1)
        ok = codes >= 0
        self.parts.append((col, codes[ok], vals[ok]))

    def sampled(self, keys: list[Any], vals: np.ndarray) -> None:
        """The sample times (`SAMPLED`) of the keys the fields found; others are dropped."""
        self.stamps = np.full(len(self.keys), np.nan)
        codes = self.index.get_indexer(keys) if len(self.index) else np.full(len(keys), -1)
        ok = codes >= 0
        self.stamps[codes[ok]] = vals[ok]

    def values(self) -> np.ndarray:
        """(keys, fields): each answer's values, NaN where none or where no reading (`blank`)."""
        out = np.full((len(self.keys), len(F.ALL_FIELDS)), np.nan)
        for col, codes, vals in self.parts:
            out[codes, col] = vals
        out[blank(out)] = np.nan
        return out


class _Split:
    """The answers' rows split into labels (`_labels`), with what depends on them alone: the
    jobs' codes and the frame's validated, sorted rows (`frame`)."""

    def __init__(self, keys: list[Any], host_map: dict[str, str] | None, node_jobs) -> None:
        self.node, self.gpu, self.job, self.model = _labels(
            np.array(keys, dtype=object), host_map, node_jobs
        )
        self.twins = _twins(self.node, self.gpu, self.job, np.array(keys, dtype=object))
        for rows in self.twins:  # one row per GPU of a job: the first of each set stands in
            self.node[rows[1:]] = ""
        for a in (self.node, self.gpu, self.job, self.model):
            a.setflags(write=False)

    def keep_newest(self, values: np.ndarray, stamps: np.ndarray) -> None:
        """Each set of `twins`' row (the one the frame takes) gets the values of the series
        scraped last (its own where no series has a sample time, or where they tie)."""
        for rows in self.twins:
            t = stamps[rows] if len(stamps) else np.full(len(rows), np.nan)
            if np.isfinite(t).any():
                newest = int(rows[np.nanargmax(t)])  # the first of the newest
                if newest != rows[0]:
                    values[rows[0]] = values[newest]

    @cached_property
    def jobs(self) -> tuple[np.ndarray, np.ndarray]:
        return pd.factorize(self.job)

    @cached_property
    def frame(self) -> tuple[np.ndarray, Frame]:
        """(the answer rows the frame takes, in its order; the frame with no values yet)."""
        ok = np.flatnonzero(self.node != "")
        n = len(ok)
        probe = Frame.from_columns(  # the row numbers ride along as values to learn the order
            np.zeros(n), self.node[ok], self.gpu[ok].astype(float), self.job[ok],
            ok[:, None].astype(float), model=self.model[ok],
        )  # fmt: skip
        rows = probe.values[:, 0].astype(np.int64)
        template = probe.with_values(probe.time, np.zeros((n, len(F.ALL_FIELDS))))
        template.job_codes, template.node_codes, template.job_groups, template.model_codes  # noqa: B018
        return rows, template


def _twins(
    node: np.ndarray, gpu: np.ndarray, job: np.ndarray, keys: np.ndarray
) -> list[np.ndarray]:
    """Sets of rows (2 or more) that name the same GPU of the same job (node, gpu, job): its
    series under two host label spellings or from two exporters. Each set in order of
    preference where nothing says which series is newer: the `hostname` spelling (newer
    dcgm-exporter releases: after an upgrade the old series go stale) before `Hostname`, then
    the answer's order. Rows of two jobs on one GPU stay apart (each job's series)."""
    ok = np.flatnonzero(node != "")
    if len(ok) < 2:
        return []
    key = pd.MultiIndex.from_arrays([node[ok], gpu[ok], job[ok]])
    dup = key.duplicated(keep=False)
    if not dup.any():
        return []
    rows = ok[dup]
    codes, _ = pd.factorize(key[dup])
    old = np.array([not str(k).startswith(",") for k in keys[rows]])  # `Hostname` set
    order = np.lexsort((rows, old, codes))
    rows, codes = rows[order], codes[order]
    return np.split(rows, np.flatnonzero(np.diff(codes)) + 1)


_LAST_SPLIT: list[Any] = [None]  # (keys, host map, node jobs, split): the last `_split`


def _split(
    keys: list[Any], host_map: dict[str, str] | None, node_jobs: dict[str, set[str]]
) -> _Split:
    """`_Split` of the keys, reused while the keys, the host map and the job -> node join are
    those of the last call (as from one cycle to the next in steady state: the split and the
    frame's sort were a fifth of a cycle at 10,000 GPUs). Its arrays are read-only."""
    last = _LAST_SPLIT[0]
    if last is not None and last[0] == keys and last[1] == host_map and last[2] == node_jobs:
        return last[3]
    out = _Split(keys, host_map, node_jobs)
    _LAST_SPLIT[0] = (keys, dict(host_map) if host_map else host_map, node_jobs, out)
    return out


def _labels(
    keys: np.ndarray, host_map: dict[str, str] | None, node_jobs: dict[str, set[str]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Split the joined keys (one per GPU row) into node, gpu, job, model; an invalid row gets
    node "" (dropped: invalid labels never reach the engine). A row without `hpc_job` takes its
    node's job when the node runs exactly one and has no job mapping (with mapping on, an
    unlabelled GPU is one no job uses: a 1-GPU job leaves the node's other GPUs idle)."""
    blank = ["", "", "", "", ""]
    split = [
        p if len(p) == 5 else blank
        for p in (k.split(",", 4) if isinstance(k, str) else blank for k in keys.tolist())
    ]
    host = np.array([p[0] or p[1] for p in split], dtype=object)
    gpu_s = np.array([p[2] for p in split], dtype=object)
    job = np.array([p[3] for p in split], dtype=object)
    model = np.array([p[4][: names.MODEL_NAME_MAX] for p in split], dtype=object)
    hcodes, huniq = pd.factorize(host)
    mapped_hosts = np.zeros(len(huniq) + 1, dtype=bool)
    mapped_hosts[hcodes[job != ""]] = True
    mapped = [(host_map or {}).get(h, h) for h in huniq.tolist()]
    only = [
        next(iter(node_jobs[m])) if len(node_jobs.get(m, ())) == 1 and not mapped_hosts[i] else ""
        for i, m in enumerate(mapped)
    ]
    valid = np.array([bool(m) and NODE_RE.match(m) is not None for m in mapped] + [False])
    node = np.array(mapped + [""], dtype=object)[hcodes]
    joined = np.array(only + [""], dtype=object)[hcodes]
    job = np.where(job == "", joined, job)
    gcodes, guniq = pd.factorize(gpu_s)
    gnum = np.array(
        [int(g) if g.isascii() and g.isdigit() and len(g) <= 3 else -1 for g in guniq] + [-1]
    )
    gpu = gnum[gcodes]
    jcodes, juniq = pd.factorize(job)
    jvalid = np.array([j == "" or JOB_RE.match(j) is not None for j in juniq] + [False])
    ok = valid[hcodes] & (gpu >= 0) & jvalid[jcodes]
    return np.where(ok, node, ""), np.where(ok, gpu, 0), np.where(ok, job, ""), model


@contextmanager
def no_gc() -> Iterator[None]:
    """The cyclic garbage collector paused: decoding an answer allocates millions of objects
    (none in a cycle: reference counting frees them), and the collections those allocations
    trigger cost 5-10x the decoding itself (bench/results/scale.md)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()

"""The online engine shared by the service and replay: score an instant, persist, aggregate,
learn baselines per job, and flag GPUs that went missing from a running job.

Online state per GPU slot: the last `k` raw scores of each detector (float32), last-seen time
and job code: under 2 KiB (see bench/detector_bench.py). Per job: a bounded reservoir of
healthy rows (`reservoir` x fields, < 1 MiB) used to fit baselines outside the scoring path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from detector import fields as F
from detector.base import Detector
from detector.baselines import BaselineStore
from detector.detectors import (
    BaselineDeviation,
    HardwareEvents,
    PeerComparison,
    Progress,
    RobustCovariance,
)
from detector.frame import Frame

LOCALISING = ("peer", "hardware", "missing")  # detectors whose GPU scores point at a node
NO_PERSIST = ("hardware", "progress")  # direct evidence / already integrated over time


@dataclass
class Config:
    interval_s: float = 5.0
    persist_s: float = 15.0  # a metric anomaly must last this long (min over the window)
    warmup_s: float = 300.0  # a job's first minutes are never learned from
    fit_after_s: float = 900.0  # first baseline fit (healthy samples after warm-up)
    refit_s: float = 1800.0  # slow update: refit from the reservoir this often
    learn_below: float = 0.5  # only cycles whose job score is below this are learned
    reservoir: int = 512
    missing_after_s: float = 20.0
    multivariate: bool = True


@dataclass
class JobInfo:
    name: str
    first_seen: float
    fitted_at: float | None = None
    seen: int = 0
    rows: np.ndarray | None = None  # reservoir (reservoir, len(ALL_FIELDS))
    max_stall: float = 0.0
    loaded: bool = False


@dataclass
class Result:
    """One cycle's scores. `gpu` rows follow `frame`; columns follow `detectors`."""

    frame: Frame
    detectors: tuple[str, ...]
    gpu: np.ndarray  # (n, D) persisted scores
    jobs: pd.DataFrame  # job_id, detector, score (detector="combined" is the max)
    nodes: pd.DataFrame  # job_id, node, score (suspect score)
    missing: pd.DataFrame = field(default_factory=pd.DataFrame)  # job_id, node, gpu, since


def default_detectors(cfg: Config) -> dict[str, Detector]:
    dets: list[Detector] = [
        BaselineDeviation(),
        PeerComparison().fit(_EMPTY),
        Progress(),
        HardwareEvents(),
    ]
    if cfg.multivariate:
        dets.append(RobustCovariance())
    return {d.name: d for d in dets}


_EMPTY = Frame(
    np.zeros(0),
    np.zeros(0, dtype=object),
    np.zeros(0, dtype=object),
    np.zeros(0, dtype=np.int64),
    np.zeros((0, len(F.ALL_FIELDS))),
)


class Engine:
    def __init__(
        self,
        cfg: Config | None = None,
        store: BaselineStore | None = None,
        detectors: dict[str, Detector] | None = None,
        seed: int = 0,
    ) -> None:
        self.cfg = cfg or Config()
        self.store = store
        self.det = detectors or default_detectors(self.cfg)
        self.names = tuple(self.det)
        self.k = max(1, math.ceil(self.cfg.persist_s / self.cfg.interval_s))
        self.rng = np.random.default_rng(seed)
        self.jobs: dict[str, JobInfo] = {}
        self._slot_of: dict[int, int] = {}
        self._node_ids: dict[str, int] = {}
        self.ring = np.zeros((0, len(self.names), self.k), dtype=np.float32)
        self.slot_seen = np.zeros(0)
        self.slot_job = np.zeros(0, dtype=object)
        self.slot_key = np.zeros(0, dtype=np.int64)
        self.slot_node = np.zeros(0, dtype=object)

    # --- scoring ------------------------------------------------------------------------------
    def step(self, frame: Frame, now: float, names: dict[str, str] | None = None) -> Result:
        """Score one instant. `names` maps job_id -> job name (for baselines by name)."""
        for job in pd.unique(frame.job):
            if job and job not in self.jobs:
                self._new_job(job, (names or {}).get(job, job), now)
        raw = (
            np.column_stack([self.det[n].score(frame) for n in self.names])
            if len(frame)
            else np.zeros((0, len(self.names)))
        )
        gpu = self._persist(frame, raw, now)
        jobs, nodes, missing = self._aggregate(frame, gpu, now)
        self._learn(frame, jobs, now)
        return Result(frame, self.names, gpu, jobs, nodes, missing)

    def _slots(self, frame: Frame) -> np.ndarray:
        codes, uniques = pd.factorize(frame.node)
        ids = np.array(
            [self._node_ids.setdefault(u, len(self._node_ids)) for u in uniques], dtype=np.int64
        )
        key = ids[codes] * 1024 + frame.gpu
        idx = pd.Index(self.slot_key).get_indexer(key)
        new = np.flatnonzero(idx < 0)
        if len(new):
            start = len(self.slot_key)
            idx[new] = start + np.arange(len(new))
            self.slot_key = np.concatenate([self.slot_key, key[new]])
            self.slot_node = np.concatenate([self.slot_node, frame.node[new]])
            self.slot_job = np.concatenate([self.slot_job, frame.job[new]])
            self.slot_seen = np.concatenate([self.slot_seen, np.full(len(new), np.nan)])
            self.ring = np.concatenate(
                [self.ring, np.zeros((len(new), len(self.names), self.k), np.float32)]
            )
        return idx

    def _persist(self, frame: Frame, raw: np.ndarray, now: float) -> np.ndarray:
        if not len(frame):
            return raw
        idx = self._slots(frame)
        changed = self.slot_job[idx] != frame.job  # a new job on this GPU: forget old scores
        self.ring[idx[changed]] = 0.0
        self.slot_job[idx] = frame.job
        self.slot_seen[idx] = now
        ring = self.ring[idx]
        ring[:, :, :-1] = ring[:, :, 1:]
        ring[:, :, -1] = raw
        self.ring[idx] = ring
        out = ring.min(axis=2).astype(float)
        for i, n in enumerate(self.names):
            if n in NO_PERSIST:
                out[:, i] = raw[:, i]
        # until k samples exist the min includes zeros, which is the intended persistence
        return out

    def _aggregate(self, frame: Frame, gpu: np.ndarray, now: float):
        on_job = frame.job != ""
        jf = pd.DataFrame(gpu[on_job], columns=list(self.names))
        jf["job_id"] = frame.job[on_job]
        jf["node"] = frame.node[on_job]
        per_job = jf.groupby("job_id", sort=True)[list(self.names)].max()
        loc = [n for n in self.names if n in LOCALISING]
        jf["suspect"] = jf[loc].max(axis=1) if loc else 0.0
        nodes = jf.groupby(["job_id", "node"], sort=True)["suspect"].max().reset_index()
        missing = self._missing(set(per_job.index), now)
        if len(missing):
            per_job["missing"] = 0.0
            lost = missing.groupby("job_id").size().index
            per_job.loc[per_job.index.isin(lost), "missing"] = 2.0
            extra = missing[["job_id", "node"]].drop_duplicates().assign(suspect=2.0)
            nodes = pd.concat([nodes, extra]).groupby(["job_id", "node"])["suspect"].max()
            nodes = nodes.reset_index()
        per_job["combined"] = per_job.max(axis=1)
        jobs = per_job.reset_index().melt(id_vars="job_id", var_name="detector", value_name="score")
        return jobs, nodes.rename(columns={"suspect": "score"}), missing

    def _missing(self, running: set[str], now: float) -> pd.DataFrame:
        """GPUs of a still-running job that stopped reporting (a lost node stops answering)."""
        age = now - self.slot_seen
        gone = (age > self.cfg.missing_after_s) & pd.Series(self.slot_job).isin(running).to_numpy()
        old = age > 3600.0
        if old.any():  # forget long-gone slots
            self._drop(np.flatnonzero(old & ~gone))
            age = now - self.slot_seen
            alive = pd.Series(self.slot_job).isin(running).to_numpy()
            gone = (age > self.cfg.missing_after_s) & alive
        i = np.flatnonzero(gone)
        return pd.DataFrame(
            {
                "job_id": self.slot_job[i],
                "node": self.slot_node[i],
                "gpu": (self.slot_key[i] % 1024).astype(int),
                "since": self.slot_seen[i],
            }
        )

    def _drop(self, idx: np.ndarray) -> None:
        keep = np.ones(len(self.slot_key), bool)
        keep[idx] = False
        for a in ("slot_key", "slot_node", "slot_job", "slot_seen", "ring"):
            setattr(self, a, getattr(self, a)[keep])

    # --- baselines ----------------------------------------------------------------------------
    def _new_job(self, job: str, name: str, now: float) -> None:
        info = JobInfo(name=name, first_seen=now)
        self.jobs[job] = info
        if self.store is None:
            return
        states = self.store.load(name, set(self.names))
        if not states:
            return
        try:
            for det_name, state in states.items():
                if state is not None:
                    self.det[det_name].set_job_state(job, state)
            info.loaded = True
            info.fitted_at = now
        except (KeyError, TypeError, ValueError) as exc:
            self.store.errors.append(f"{name}: {exc}")

    def _learn(self, frame: Frame, jobs: pd.DataFrame, now: float) -> None:
        calm = jobs[(jobs.detector == "combined") & (jobs.score < self.cfg.learn_below)]
        calm_jobs = set(calm.job_id)
        if not calm_jobs:
            return
        stall = frame.col(F.STALL_SECONDS)
        codes, uniques = pd.factorize(frame.job)
        for ci, job in enumerate(uniques):
            info = self.jobs.get(job)
            if info is None or job not in calm_jobs or now - info.first_seen < self.cfg.warmup_s:
                continue
            rows = np.flatnonzero(codes == ci)
            self._reservoir(info, frame.values[rows])
            st = stall[rows]
            if np.isfinite(st).any():
                info.max_stall = max(info.max_stall, float(np.nanmax(st)))
            due = (info.fitted_at is None and now - info.first_seen >= self.cfg.fit_after_s) or (
                info.fitted_at is not None and now - info.fitted_at >= self.cfg.refit_s
            )
            if due:
                self.fit_job(job, now)

    def _reservoir(self, info: JobInfo, rows: np.ndarray) -> None:
        size = self.cfg.reservoir
        if info.rows is None:
            info.rows = np.empty((0, rows.shape[1]))
        for row in rows:  # Algorithm R: a uniform sample over the job's healthy life
            info.seen += 1
            if len(info.rows) < size:
                info.rows = np.vstack([info.rows, row])
            else:
                j = int(self.rng.integers(0, info.seen))
                if j < size:
                    info.rows[j] = row

    def fit_job(self, job: str, now: float) -> None:
        """Fit every detector on the job's reservoir and save the baseline under its name."""
        info = self.jobs[job]
        if info.rows is None or not len(info.rows):
            return
        rows = info.rows.copy()
        stall_col = F.ALL_FIELDS.index(F.STALL_SECONDS)
        if info.max_stall > 0:  # the longest healthy gap is kept even if the sample missed it
            rows[0, stall_col] = max(np.nan_to_num(rows[0, stall_col]), info.max_stall)
        n = len(rows)
        train = Frame(
            np.full(n, now),
            np.full(n, job, dtype=object),
            np.full(n, "train", dtype=object),
            np.arange(n) % 1000,
            rows,
        )
        for name, det in self.det.items():
            if name != "hardware":
                det.fit(train)
        info.fitted_at = now
        if self.store is not None:
            states = {n: s for n, d in self.det.items() if (s := d.job_state(job)) is not None}
            if states:
                self.store.save(info.name, states)

    def end_jobs(self, running: set[str]) -> None:
        """Forget jobs that are no longer running (their baselines stay in the store)."""
        for job in [j for j in self.jobs if j not in running]:
            del self.jobs[job]

    def state_bytes_per_gpu(self) -> float:
        n = max(len(self.slot_key), 1)
        total = (
            self.ring.nbytes
            + self.slot_seen.nbytes
            + self.slot_key.nbytes
            + 8 * len(self.slot_job)
            + 8 * len(self.slot_node)
        )
        return total / n

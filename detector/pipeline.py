"""The online engine shared by the service and replay: score an instant, persist, aggregate,
and flag GPUs that went missing from a running job; the baselines it learns per job are
`learning.Baselines`'.

Online state per GPU slot: the last `k` raw scores of each detector (float32), last-seen time
and job code: under 2 KiB (see bench/detector_bench.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from detector import fields as F
from detector.base import Detector, pause_open, row_max
from detector.baselines import BaselineStore
from detector.covariance import RobustCovariance
from detector.deviation import BaselineDeviation, NodeShift
from detector.frame import Frame
from detector.hardware import HardwareEvents
from detector.learning import ONLINE, Baselines
from detector.level import Level
from detector.memo import Memo
from detector.peer import PeerComparison
from detector.physics import PAUSE_ALLOWANCE, Physics, prior_rows
from detector.progress import Pace, Progress

LOCALISING = ("peer", "shift", "hardware", "missing")  # GPU scores that point at a node
PHASED = ("deviation", "multivariate", "level")  # job-wide baseline detectors (see Engine._phase)
# what a GPU looks like against its baseline or its peers: capped inside an announced pause
# (Engine._pause), where the rank that saves idles while the others wait for it in a barrier
PAUSE_CAPPED = (*PHASED, "shift", "peer")
NO_PERSIST = ("hardware", "progress", "pace")  # direct evidence / already integrated over time
GATED = ("physics",)  # must hold on every sample of the window; counts at its latest value
ALL: tuple[type[Detector], ...] = (  # the learned and the evidence detectors
    BaselineDeviation,
    NodeShift,
    PeerComparison,
    Progress,
    HardwareEvents,
    RobustCovariance,
)
KNOWN: tuple[type[Detector], ...] = (
    *ALL,
    Physics,
    Level,
)  # every detector whose per-job state a stored baseline may hold


@dataclass
class Config:
    interval_s: float = 5.0
    persist_s: float = 15.0  # a metric anomaly must last this long (min over the window)
    warmup_s: float = 120.0  # a job's first minutes are never learned from
    fit_rows: int = 24  # first fit as soon as this many calm rows were learned after warm-up
    fit_cycles: int = 6  # ... over at least this many cycles
    fit_after_s: float = 300.0  # ... or at this age, whatever the row count (if any)
    refit_s: float = 900.0  # slow update: refit from the reservoir this often
    learn_below: float = 0.5  # only cycles whose job score is below this are learned ...
    learn_delay_s: float = 30.0  # ... and stays below it this long after (a fault's onset)
    learn_every: int = 6  # each job adds to its reservoir every n-th cycle (spread over jobs)
    learn_small: int = 8  # ... except jobs of at most this many GPUs, which learn every cycle
    reservoir: int = 256
    fits_per_cycle: int = 32  # at most this many jobs fitted in one cycle (the rest wait)
    refit_batch: int = 16  # periodic refits wait for this many due (first fits never) ...
    refit_wait_s: float = 30.0  # ... or for the longest waiting to have waited this long
    # the longest one DCGM reading may stay a GPU's latest: Prometheus keeps the last scrape
    # between scrapes (1 m by default), dcgm-exporter refreshes its readings every 30 s by
    # default (--collect-interval); a pause covers the scores until its readings are replaced,
    # at most this long after it (`Engine._pause`)
    scrape_s: float = 60.0
    missing_after_s: float = 20.0  # a GPU silent this long while labelled with a job
    hold_s: float = 120.0  # hardware evidence on a GPU its job just left still counts for it
    phase_share: float = 0.5  # this share of a job's GPUs moving together, progress calm:
    phase_calm: float = 1.0  # ... a phase (eval, checkpoint), not a fault (see `_phase`)
    relearn_s: float = 1800.0  # a phase held this long is the job's new normal (`relearn`)
    multivariate: bool = False  # RobustCovariance: off the per-cycle path unless asked for
    level: bool = True  # Level: each job's adaptive, unit-free series baselines (level.py)


@dataclass
class Result:
    """One cycle's scores. `gpu` rows follow `frame`; columns follow `detectors`. The job, node
    and missing tables are columns (name -> array), as DataFrames on first use."""

    frame: Frame
    detectors: tuple[str, ...]
    gpu: np.ndarray  # (n, D) persisted scores
    job_cols: dict[str, np.ndarray]  # job_id, detector, score (detector="combined": the max)
    node_cols: dict[str, np.ndarray]  # job_id, node, score (suspect score)
    missing_cols: dict[str, np.ndarray] = field(default_factory=dict)  # job_id, node, gpu, since
    pause_cols: dict[str, np.ndarray] = field(default_factory=dict)  # job_id, value (s), pausing
    # what the detectors learned of each job, by name ("iteration_seconds",
    # "gpu_utilization_percent"): job_id, value (exported as goodput_job_baseline_<name>)
    learned: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    @cached_property
    def jobs(self) -> pd.DataFrame:
        return pd.DataFrame(self.job_cols)

    @cached_property
    def nodes(self) -> pd.DataFrame:
        return pd.DataFrame(self.node_cols)

    @cached_property
    def missing(self) -> pd.DataFrame:
        return pd.DataFrame(self.missing_cols)


def _per_job(frame: Frame, allowance: np.ndarray) -> dict[str, np.ndarray]:
    """The pause allowance of each named job inside a pause its log announced (the max over
    its rows; none where no row has one, a GPU model without priors, so that the alert
    condition falls back to the default)."""
    codes, uniq = frame.job_codes
    best = np.full(len(uniq), np.nan)
    inside = pause_open(frame.col(F.STALL_SECONDS), frame.col(F.SINCE_PAUSE))
    np.fmax.at(best, codes[inside], allowance[inside])
    keep = frame.job_named & np.isfinite(best) if len(uniq) else np.zeros(0, dtype=bool)
    return {"job_id": uniq[keep], "value": best[keep]}


def default_detectors(cfg: Config) -> dict[str, Detector]:
    deviation = BaselineDeviation()
    dets: list[Detector] = [
        deviation,
        NodeShift(of=deviation),  # reads the deviation's baselines: one fit, one stored state
        PeerComparison().fit(_EMPTY),
        progress := Progress(),  # scores before physics, which reads the pauses it learned
        Pace(of=progress),  # its slowdown score, apart from the stall: a slower job is no hang
        HardwareEvents(),
        Physics(pauses=progress),
    ]
    if cfg.level:
        dets.append(Level())
    if cfg.multivariate:
        dets.append(RobustCovariance())
    return {d.name: d for d in dets}


# weights of a GPU's gauges in the fingerprint of its reading (`Engine._held`): distinct and
# irrational-ish, so that a new reading gives a new fingerprint
_FINGERPRINT = 1.0 + np.sqrt(np.arange(2, 2 + len(F.GAUGE_NAMES), dtype=float)) / 7.0

_EMPTY = Frame(
    np.zeros(0),
    np.zeros(0, dtype=object),
    np.zeros(0, dtype=object),
    np.zeros(0, dtype=np.int64),
    np.zeros((0, len(F.ALL_FIELDS))),
)


class GroupMax:
    """Column max of `values` (rows, D) per code in [0, n) -> (n, D), 0 for empty groups;
    the sorts of the last few code arrays are kept (a cycle groups its rows as the last one
    did: one comparison instead of a sort). One per engine."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._sorts: list[tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]] = []

    def _sort(self, codes: np.ndarray) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
        """(the order that groups the rows, None when they already are; each group's code;
        where each starts in that order)."""
        for k, entry in enumerate(self._sorts):
            if np.array_equal(entry[0], codes):
                self._sorts.insert(0, self._sorts.pop(k))
                return entry[1:]
        order = np.argsort(codes, kind="stable")
        sc = codes[order]
        starts = np.flatnonzero(np.r_[True, sc[1:] != sc[:-1]])
        sorted_ = bool((order == np.arange(len(order))).all())  # rows already grouped
        self._sorts.insert(0, (codes.copy(), None if sorted_ else order, sc[starts], starts))
        del self._sorts[self.keep :]
        return self._sorts[0][1:]

    def __call__(self, values: np.ndarray, codes: np.ndarray, n: int) -> np.ndarray:
        out = np.zeros((n, values.shape[1]))
        if len(codes):
            order, first, starts = self._sort(codes)
            planes = values.T if order is None else np.take(values.T, order, axis=1)
            out[first] = np.maximum.reduceat(planes, starts, axis=1).T  # a row per field
        return out


class Engine:
    """Scores one instant at a time; all per-GPU state is integer-keyed numpy arrays."""

    def __init__(
        self,
        cfg: Config | None = None,
        store: BaselineStore | None = None,
        detectors: dict[str, Detector] | None = None,
        seed: int = 0,
    ) -> None:
        self.cfg = cfg or Config()
        self.det = detectors or default_detectors(self.cfg)
        self.names = tuple(self.det)
        self.k = max(1, math.ceil(self.cfg.persist_s / self.cfg.interval_s))
        known = {cls.name for cls in KNOWN}
        self.base = Baselines(self.cfg, store, self.det, known, np.random.default_rng(seed))
        self._node_ids: dict[str, int] = {}
        self._node_names: list[str] = []
        self.cycle = 0
        self.ring = np.zeros((self.k, 0, len(self.names)), dtype=np.float32)  # cycle, slot, det
        self.slot_seen = np.zeros(0)  # last time the GPU reported at all
        self.slot_job = np.zeros(0, dtype=np.int32)  # job code of its last row (0 = none)
        self.slot_job_seen = np.zeros(0)  # last time it reported with that job
        self.slot_key = np.zeros(0, dtype=np.int64)  # node id * 1024 + gpu
        # the job's last pause on the slot (`_pause`): when it began (the log's stamp) and when
        # it was over by (+inf while open, NaN: none seen); the GPU's reading (a fingerprint of
        # its gauges) and the cycle it was first seen at (a reading Prometheus holds between
        # scrapes comes back bit for bit)
        self.slot_pause_at = np.zeros(0)
        self.slot_pause_end = np.zeros(0)
        self.slot_reading = np.zeros(0)
        self.slot_read_at = np.zeros(0)
        self._memo: dict[str, Memo[Any]] = {
            k: Memo()
            for k in (
                "node_ids",
                "index",
                "slots",
                "pairs",
                "job_codes",
                "job_labels",
                "node_labels",
            )
        }
        self._group_max = GroupMax()

    # --- scoring ------------------------------------------------------------------------------
    def step(self, frame: Frame, now: float, names: dict[str, str] | None = None) -> Result:
        """Score one instant. `names` maps job_id -> job name (for baselines by name)."""
        self.cycle += 1
        jcodes, juniq = frame.job_codes
        base = self.base
        job = self._job_codes(juniq, names, now)[jcodes] if len(frame) else np.zeros(0, np.int32)
        if len(frame):  # derived: how long the engine has seen each row's job
            frame.values[:, frame.fields.index(F.JOB_AGE)] = now - base.first_seen()[job]
        idx, new, nid = self._slots(frame)
        hw = self.det.get("hardware")
        if isinstance(hw, HardwareEvents) and len(frame):  # counter baseline: first sight,
            reset = np.flatnonzero(hw.fell(frame))  # and down after a counter reset
            if len(new) or len(reset):
                hw.fit(frame.take(np.union1d(new, reset)))
        with frame.unchanged():  # the detectors share what they derive from it
            raw = (
                np.column_stack([self.det[n].score(frame) for n in self.names])
                if len(frame)
                else np.zeros((0, len(self.names)))
            )
            allowance = self._pause_allowance(frame)
            # before persistence: the window after it holds the cap
            self._pause(frame, raw, allowance, idx, now)
            gpu = self._persist(idx, job, raw, now)
            phased = self._phase(frame, job, gpu)
            jobs, nodes, missing, combined, calm, steady = self._aggregate(idx, job, gpu, now, nid)
            base.learn(frame, job, base.relearn(phased, calm, steady, now), now, self.cycle)
            base.learn_online(frame, combined)
        pauses = _per_job(frame, allowance)
        return Result(frame, self.names, gpu, jobs, nodes, missing, pauses, self._learned(frame))

    def _learned(self, frame: Frame) -> dict[str, dict[str, np.ndarray]]:
        """Each job's learned step time and busy GPU utilisation, for the attribution to
        compare a restart with (`Result.learned`)."""
        out = {}
        if isinstance(prog := self.det.get("progress"), Progress):
            out["iteration_seconds"] = prog.typical_steps(frame)
        if isinstance(dev := self.det.get("deviation"), BaselineDeviation):
            out["gpu_utilization_percent"] = dev.typical_busy(frame)
        return out

    def _pause_allowance(self, frame: Frame) -> np.ndarray:
        """Per row, how long its job may pause where its log announces one
        (`Physics.pause_allowance`; without physics, the GPU model's `pause_allowance_s`)."""
        if not len(frame):
            return np.zeros(0)
        phys = self.det.get("physics")
        if isinstance(phys, Physics):
            return phys.pause_allowance(frame)
        return prior_rows(frame, PAUSE_ALLOWANCE)

    def _job_codes(self, juniq: np.ndarray, names: dict[str, str] | None, now: float):
        """The code of each of the frame's jobs (those seen for the first time are added), and
        0 last for rows without one; kept while the frame's jobs and the job table are the
        last cycle's."""
        base = self.base

        def table() -> np.ndarray:
            for j in juniq.tolist():
                if j and j not in base.jobs:
                    old = base.code.get(j)
                    base.add(j, (names or {}).get(j, j), now)
                    if old is not None:  # back (a restart): the GPUs it left are held for it
                        self.slot_job[self.slot_job == old] = base.code[j]
            return np.array([base.code[j] for j in juniq.tolist()] + [0], dtype=np.int32)

        return self._memo["job_codes"].get((juniq, base.version), table)

    def _slots(self, frame: Frame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each row's slot (created on first sight), the rows whose slot is new and each row's
        node id."""
        ncodes, nuniq = frame.node_codes
        names = nuniq.tolist()
        ids = self._memo["node_ids"].get((names,), lambda: self._ids_of(names))
        nid = ids[ncodes] if len(frame) else np.zeros(0, dtype=np.int64)
        key = nid * 1024 + frame.gpu
        slots = self.slot_key  # a new array whenever a slot is added or dropped
        index = self._memo["index"].get((slots,), lambda: pd.Index(slots))
        idx = self._memo["slots"].get((key, slots), lambda: index.get_indexer(key))
        new = np.flatnonzero(idx < 0)
        if len(new):
            # one slot per GPU, also where it first shows with two series (two exporters, two
            # jobs sharing it): a key twice in the slot index would fail every later cycle
            fresh, which = np.unique(key[new], return_inverse=True)
            start, n = len(self.slot_key), len(fresh)
            idx = idx.copy()  # the memo's stays as computed
            idx[new] = start + which
            self.slot_key = np.concatenate([self.slot_key, fresh])
            self.slot_job = np.concatenate([self.slot_job, np.zeros(n, np.int32)])
            self.slot_seen = np.concatenate([self.slot_seen, np.full(n, np.nan)])
            self.slot_job_seen = np.concatenate([self.slot_job_seen, np.full(n, np.nan)])
            self.slot_pause_at = np.concatenate([self.slot_pause_at, np.full(n, np.nan)])
            self.slot_pause_end = np.concatenate([self.slot_pause_end, np.full(n, np.nan)])
            self.slot_reading = np.concatenate([self.slot_reading, np.full(n, np.nan)])
            self.slot_read_at = np.concatenate([self.slot_read_at, np.full(n, np.nan)])
            self.ring = np.concatenate(
                [self.ring, np.zeros((self.k, n, len(self.names)), np.float32)], axis=1
            )
        return idx, new, nid

    def _ids_of(self, names: list[str]) -> np.ndarray:
        """Each node's id (given on first sight), and 0 last for rows without a node code."""
        for u in names:
            if u not in self._node_ids:
                self._node_ids[u] = len(self._node_names)
                self._node_names.append(str(u))
        return np.array([self._node_ids[u] for u in names] + [0], dtype=np.int64)

    def _persist(self, idx: np.ndarray, job: np.ndarray, raw: np.ndarray, now: float):
        """Min over the last k cycles (a metric anomaly must persist); a new job on a GPU
        forgets the old scores. Direct evidence (hardware), progress and pace are not delayed."""
        if not len(idx):
            return raw
        rows = idx
        sel: np.ndarray | slice = idx
        if len(idx) == len(self.slot_key) and (idx == np.arange(len(idx))).all():
            sel = slice(None)  # every slot, in slot order (steady state): views, no gathers
        on = job > 0
        changed = on & (self.slot_job[sel] != job)
        self.ring[:, rows[changed]] = 0.0
        self.ring[self.cycle % self.k, sel] = raw
        self.slot_seen[sel] = now
        self.slot_job_seen[rows[on]] = now
        self.slot_job[rows[on]] = job[on]
        left = ~on & (self.slot_job[sel] > 0) & (now - self.slot_job_seen[sel] > self.cfg.hold_s)
        self.slot_job[rows[left]] = 0
        out = self.ring[0, sel].astype(float)
        for c in range(1, self.k):
            np.minimum(out, self.ring[c, sel], out=out)
        for i, n in enumerate(self.names):
            if n in NO_PERSIST:
                out[:, i] = raw[:, i]
            elif n in GATED:
                out[:, i] = np.where(out[:, i] > 0, raw[:, i], 0.0)
        return out

    def _pause(
        self, frame: Frame, raw: np.ndarray, allowance: np.ndarray, idx: np.ndarray, now: float
    ) -> None:
        """Inside a pause the job's log announced (a checkpoint save or load, start-up work)
        and younger than its `allowance` (`Physics.pause_allowance`: the model's
        `pause_allowance_s`, or a multiple of the job's own longest pause), a job's GPUs idle
        or wait in a barrier for the rank that saves (spinning like a hung collective,
        cupy/cupy#3557);
        in a live wait (`Physics.live_wait`: most of the job's ranks spin while its log moves
        or a GPU of it works) they wait for a rank that works, rank 0 evaluating say. There
        the baseline and peer detectors' (`PAUSE_CAPPED`) raw scores are capped below 1.0, so
        that the persistence window holds the cap for its length after the pause (the first
        samples after it straddle the two).

        A pause also covers its job's scores after it was over while a GPU of the job still
        shows a reading that may have been taken during it (`_held`): a reading stays a GPU's
        latest until its next scrape, so one node still shows the save (idle, at rest) while
        the others work again, a straggler to the peer and shift detectors. A save of a few
        seconds often falls between two cycles, never seen open. Once every GPU of the job has
        a reading taken after the pause, its scores are judged as ever: a GPU that stays off
        is flagged a scrape after the pause, not hidden behind it.

        A pause that outlives its allowance, a wait that stops showing life, hardware
        evidence, a GPU gone missing, progress and the physics rules (which give a pause and
        a wait their own allowance) are judged as ever."""
        cols = [i for i, n in enumerate(self.names) if n in PAUSE_CAPPED]
        if not cols or not len(frame):
            return
        held = self._held(frame, idx, now)
        phys = self.det.get("physics")
        inside = phys.live_wait(frame) if isinstance(phys, Physics) else np.zeros(len(frame), bool)
        since = frame.col(F.SINCE_PAUSE)
        if np.isfinite(since).any():
            with np.errstate(invalid="ignore"):
                opened = pause_open(frame.col(F.STALL_SECONDS), since)
                inside = inside | opened & (since < allowance)
                over = self._pause_over(idx, since, opened, now)
            # a reading first seen less than a cycle after the pause was over may be from it
            # (taken since the cycle before); at most `scrape_s` after it
            with np.errstate(invalid="ignore"):
                from_pause = (
                    ~opened
                    & (held < over + 0.5 * self.cfg.interval_s)
                    & (now - over <= self.cfg.scrape_s)
                )
            codes, uniq = frame.job_codes
            if from_pause.any() and len(uniq):
                job_held = np.zeros(len(uniq), dtype=bool)
                job_held[codes[from_pause]] = True
                inside = inside | job_held[codes] & frame.job_named[codes]
        if inside.any():
            at = np.ix_(np.flatnonzero(inside), np.array(cols))
            raw[at] = np.minimum(raw[at], 0.99)

    def _held(self, frame: Frame, idx: np.ndarray, now: float) -> np.ndarray:
        """Per row, the cycle at which the GPU's current reading was first seen: Prometheus
        answers with a GPU's last scrape until the next, bit for bit (a fingerprint of its
        gauges tells a new reading from the same one); a GPU first seen now, now."""
        g = len(F.GAUGE_NAMES)
        gauges = (  # the frame's first fields, as a rule: a view, not a gather
            frame.values[:, :g] if frame.fields[:g] == F.GAUGE_NAMES else frame.cols(F.GAUGE_NAMES)
        )
        reading = np.nan_to_num(gauges, nan=-1.0, posinf=-2.0, neginf=-3.0) @ _FINGERPRINT
        new = ~(reading == self.slot_reading[idx])
        self.slot_reading[idx] = reading
        self.slot_read_at[idx[new]] = now
        return self.slot_read_at[idx]

    def _pause_over(
        self, idx: np.ndarray, since: np.ndarray, opened: np.ndarray, now: float
    ) -> np.ndarray:
        """Per row, when its job's last pause was over by: +inf while open, NaN where none is
        logged; the first cycle that saw it closed (one never seen open: the first that saw
        it), or, on a GPU first seen now, its stamp (a restarted detector does not know more).
        Updates the slots' pause stamps and ends."""
        stamp = now - since  # NaN: no pause logged
        known = np.isfinite(stamp)
        at, end = self.slot_pause_at[idx], self.slot_pause_end[idx]
        fresh = known & ~(np.abs(stamp - at) < 1e-3)  # a pause this slot has not seen before
        tracked = np.isfinite(self.slot_seen[idx])  # the slot was scored at an earlier cycle
        over = np.where(opened, np.inf, end)  # open: not over yet
        closing = known & ~opened & (fresh | np.isinf(end))
        over = np.where(closing, np.where(tracked | ~fresh, now, stamp), over)
        over = np.where(known, over, np.nan)  # no stamp (none logged, a gap): none to cover
        self.slot_pause_at[idx] = np.where(known, stamp, at)
        self.slot_pause_end[idx] = over
        return over

    def _phase(self, frame: Frame, job: np.ndarray, gpu: np.ndarray) -> np.ndarray:
        """A job-wide move is judged by the job's progress: when `phase_share` of a job's GPUs
        reach 1.0 on a baseline detector and the job reports progress, its progress and pace
        scores below `phase_calm` (their alert level), it is a phase (evaluation, checkpoint,
        a new data shard), not a fault, and those detectors are capped below 1.0 for the job.
        A job-wide fault stops or slows progress and alarms there. Never capped: jobs without
        progress, one node or GPU moving alone (under `phase_share`), and jobs whose GPUs mostly
        spin (busy at idle power: a collective hang, which no healthy phase looks like).
        Returns, per job code, whether it was capped (held for `relearn_s`: a new normal,
        `Baselines.relearn`)."""
        cols = [i for i, n in enumerate(self.names) if n in PHASED]
        n = len(self.base.ids)
        if "progress" not in self.names or not cols or not len(job):
            return np.zeros(n, dtype=bool)
        on = job > 0
        jo, g = (job, gpu) if on.all() else (job[on], gpu[on])
        count = np.maximum(np.bincount(jo, minlength=n), 1).astype(float)
        over = (g[:, cols] >= 1.0).astype(float)
        share = np.column_stack([np.bincount(jo, over[:, i], n) for i in range(len(cols))])
        share = share / count[:, None]
        seen = np.isfinite(frame.col(F.ITER_SECONDS)) | np.isfinite(frame.col(F.STALL_SECONDS))
        has = np.bincount(jo, weights=seen[on], minlength=n) > 0
        own = [self.names.index(p) for p in ("progress", "pace") if p in self.names]
        prog = self._group_max(g[:, own], jo, n).max(axis=1)  # stalled or slower
        calm = has & (prog < self.cfg.phase_calm)
        dev = self.det.get("deviation")
        if isinstance(dev, BaselineDeviation):
            spin = np.bincount(jo, weights=dev.spinning(frame)[on], minlength=n)
            calm &= spin / count < 0.5
        phase = (share >= self.cfg.phase_share) & calm[:, None]
        if not phase.any():
            return np.zeros(n, dtype=bool)
        capped = phase[job] & on[:, None]
        gpu[:, cols] = np.where(capped, np.minimum(gpu[:, cols], 0.99), gpu[:, cols])
        return phase.any(axis=1)

    def _aggregate(self, idx: np.ndarray, job: np.ndarray, gpu: np.ndarray, now, nid):
        n = len(self.base.ids)
        held = np.zeros(len(job), dtype=np.int32)
        if len(idx):  # a GPU its job just left: its hardware evidence still counts for the job
            held = np.where(job > 0, job, self.slot_job[idx]).astype(np.int32)
        agg = gpu.copy()
        if "hardware" in self.names:
            mask = (job == 0) & (held > 0)
            keep = self.names.index("hardware")
            agg[mask] = np.where(np.arange(len(self.names)) == keep, agg[mask], 0.0)
        on = held > 0
        if not on.all():
            agg, held, nid = agg[on], held[on], nid[on]
        per_job = self._group_max(agg, held, n)
        present = np.bincount(held, minlength=n) > 0
        loc = [i for i, nm in enumerate(self.names) if nm in LOCALISING]
        suspect = row_max(agg[:, loc]) if loc else np.zeros(len(agg))
        nn = max(len(self._node_names), 1)
        pair = held.astype(np.int64) * nn + nid
        upair, inv = self._pairs(pair)
        node_score = self._group_max(suspect[:, None], inv, len(upair))[:, 0]
        missing = self._missing(now)
        names = list(self.names)
        if len(missing["job_id"]):
            mj = np.array([self.base.code[j] for j in missing["job_id"]], dtype=np.int64)
            mn = np.array([self._node_ids[x] for x in missing["node"]], dtype=np.int64)
            per_job = np.column_stack([per_job, np.zeros(n)])
            per_job[mj, -1] = 2.0
            present[mj] = True
            names.append("missing")
            extra = np.unique(mj * nn + mn)
            allp = np.concatenate([upair, extra])
            alls = np.concatenate([node_score, np.full(len(extra), 2.0)])
            upair, inv = np.unique(allp, return_inverse=True)
            node_score = self._group_max(alls[:, None], inv.ravel(), len(upair))[:, 0]
        codes = np.flatnonzero(present)
        combined = per_job[codes].max(axis=1) if len(codes) else np.zeros(0)
        block = np.column_stack([per_job[codes], combined])
        jobs = {**self._job_labels(codes, names + ["combined"]), "score": block.ravel()}
        nodes = {**self._node_labels(upair, nn), "score": node_score}
        comb = np.full(n, -1.0)
        comb[codes] = combined
        # the reservoir's gate leaves out the online detectors: they learn on their own guard,
        # and a shift they are adopting as the new normal must not starve the reservoir of it
        gate = [i for i, nm in enumerate(names) if nm not in ONLINE]
        # steady: the detectors a phase neither caps nor needs under their alert level (progress
        # and pace: a phase holds them there, and a new normal may step a little slower)
        calm, steady = np.full(n, -1.0), np.full(n, -1.0)
        rest = [i for i in gate if names[i] not in (*PHASED, "progress", "pace")]
        if len(codes):
            calm[codes] = per_job[codes][:, gate].max(axis=1) if gate else 0.0
            steady[codes] = per_job[codes][:, rest].max(axis=1) if rest else 0.0
        return jobs, nodes, missing, comb, calm, steady

    def _job_labels(self, codes: np.ndarray, cols: list[str]) -> dict[str, np.ndarray]:
        """The job table's label columns (job_id, detector), row-major over `codes` x `cols`;
        kept while the jobs, the job table and the detectors are the last cycle's."""

        def labels() -> dict[str, np.ndarray]:
            ids = np.array(self.base.ids, dtype=object)
            return {
                "job_id": np.repeat(ids[codes], len(cols)),
                "detector": np.tile(np.array(cols, dtype=object), len(codes)),
            }

        return self._memo["job_labels"].get((codes, self.base.version, cols), labels)

    def _node_labels(self, upair: np.ndarray, nn: int) -> dict[str, np.ndarray]:
        """The node table's label columns (job_id, node) of each (job, node) pair code;
        kept while the pairs and the job table are the last cycle's."""

        def labels() -> dict[str, np.ndarray]:
            return {
                "job_id": np.array(self.base.ids, dtype=object)[upair // nn],
                "node": np.array(self._node_names, dtype=object)[upair % nn]
                if len(upair)
                else np.zeros(0, dtype=object),
            }

        return self._memo["node_labels"].get((upair, nn, self.base.version), labels)

    def _pairs(self, pair: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`np.unique(pair, return_inverse=True)`, kept while the (job, node) pairs of the rows
        are the last cycle's (steady state: one comparison instead of a sort)."""

        def unique() -> tuple[np.ndarray, np.ndarray]:
            upair, inv = np.unique(pair, return_inverse=True)
            return upair, inv.ravel()

        return self._memo["pairs"].get((pair,), unique)

    def _missing(self, now: float) -> dict[str, np.ndarray]:
        """GPUs that went silent while labelled with a job (a lost node stops answering; a
        job that ends leaves its GPUs reporting without the label). Flagged for `hold_s`, and
        only while at least as many nodes answer as went silent (Prometheus that lost its way
        to a whole cluster or its larger part is not that many lost nodes)."""
        age = now - self.slot_seen
        gone = (self.slot_job > 0) & (age > self.cfg.missing_after_s)
        old = age > 3600.0
        if old.any():  # forget long-gone slots
            self._drop(np.flatnonzero(old))
            age = now - self.slot_seen
            gone = (self.slot_job > 0) & (age > self.cfg.missing_after_s)
        gone &= age <= self.cfg.missing_after_s + self.cfg.hold_s
        i = np.flatnonzero(gone)
        if len(i):  # more nodes silent than answering: the way to them failed, not the nodes
            answering = np.unique(self.slot_key[age <= self.cfg.missing_after_s] // 1024)
            if len(np.unique(self.slot_key[i] // 1024)) > len(answering):
                i = i[:0]
        none = np.zeros(0, dtype=object)  # (the usual cycle: no label table is built)
        return {
            "job_id": np.array(self.base.ids, dtype=object)[self.slot_job[i]] if len(i) else none,
            "node": np.array(self._node_names, dtype=object)[self.slot_key[i] // 1024]
            if len(i)
            else none,
            "gpu": (self.slot_key[i] % 1024).astype(int),
            "since": self.slot_seen[i],
        }

    def _drop(self, idx: np.ndarray) -> None:
        keep = np.ones(len(self.slot_key), bool)
        keep[idx] = False
        for a in (
            "slot_key",
            "slot_job",
            "slot_seen",
            "slot_job_seen",
            "slot_pause_at",
            "slot_pause_end",
            "slot_reading",
            "slot_read_at",
        ):
            setattr(self, a, getattr(self, a)[keep])
        self.ring = self.ring[:, keep]

    def end_jobs(self, running: set[str], now: float | None = None) -> None:
        """Forget jobs that are no longer running (`Baselines.end`); their codes are compacted
        in the slots too when the job table was. With `now` (the service), a job absent while
        none of its GPUs answered since (a missed scrape, a lost node) is kept for
        `missing_after_s + hold_s`: a job forgotten on one missed scrape lost what it learned."""
        if now is not None:
            running = running | self._unheard(running, now)
        remap = self.base.end(running, self.slot_job)
        if remap is not None:
            self.slot_job = remap[self.slot_job]

    def _unheard(self, running: set[str], now: float) -> set[str]:
        """The absent jobs whose GPUs all went silent with them, less than the grace ago (a GPU
        that answered without the job since: it ended, or was requeued)."""
        absent = [j for j in self.base.jobs if j not in running]
        if not absent:
            return set()
        n = max(len(self.base.ids), int(self.slot_job.max(initial=0)) + 1)
        wanted = np.zeros(n, bool)
        wanted[[self.base.code[j] for j in absent]] = True
        sel = wanted[self.slot_job]  # the slots of absent jobs, all in one pass
        codes, with_job = self.slot_job[sel], self.slot_job_seen[sel]
        last = np.full(n, -np.inf)
        np.maximum.at(last, codes, with_job)  # NaN (never with a job) stays NaN: not kept
        spoke = np.zeros(n, bool)
        np.logical_or.at(spoke, codes, ~(self.slot_seen[sel] <= with_job))
        grace = self.cfg.missing_after_s + self.cfg.hold_s
        kept = wanted & ~spoke & (now - last <= grace)
        return {j for j in absent if kept[self.base.code[j]]}

    def state_bytes_per_gpu(self) -> float:
        n = max(len(self.slot_key), 1)
        total = (
            self.ring.nbytes
            + self.slot_seen.nbytes
            + self.slot_key.nbytes
            + self.slot_job.nbytes
            + self.slot_job_seen.nbytes
            + self.slot_pause_at.nbytes
            + self.slot_pause_end.nbytes
            + self.slot_reading.nbytes
            + self.slot_read_at.nbytes
        )
        return total / n

"""The engine's baselines per job: the job table (id <-> integer code), a bounded reservoir of
healthy rows per job (`reservoir` x fields, float32, 26 KB) fitted outside the scoring path, the
rows taken but not yet confirmed calm (`learn_delay_s` of the cycles' learning rows, float32:
about 7 MB at 10,000 GPUs of 8-GPU jobs), the online detectors' learning, and the store by job
name (a requeued job starts with its baseline)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from detector import fields as F
from detector.base import Detector, pause_open
from detector.baselines import BaselineStore
from detector.frame import Frame, repeated
from detector.level import Level
from detector.memo import Memo
from detector.thresholds import level as alert_level

if TYPE_CHECKING:
    from detector.pipeline import Config

ONLINE = ("level",)  # learn every cycle in `learn_online`, not from the reservoir


@dataclass
class JobInfo:
    name: str
    first_seen: float
    fitted_at: float | None = None
    seen: int = 0
    rows: np.ndarray | None = None  # reservoir (reservoir, len(ALL_FIELDS)) float32; the
    # first min(seen, reservoir) rows are filled
    max_stall: float = 0.0
    loaded: bool = False
    code: int = 0
    fitted_rows: int = 0  # rows learned at the last fit (a second fit follows at 4x)
    learns: int = 0  # cycles that added rows
    relearn: bool = False  # its reservoir started over from a new normal (`Baselines.relearn`)


Span = tuple[str, JobInfo, int, int, float]


class Baselines:
    """The running jobs (`jobs`, `ids`: code -> job id, code 0 = no job; `code`: the inverse)
    and how their detectors learn (see `learn`, `learn_online`, `fit_job`)."""

    def __init__(
        self,
        cfg: Config,
        store: BaselineStore | None,
        det: dict[str, Detector],
        known: set[str],
        rng: np.random.Generator,
    ) -> None:
        self.cfg, self.store, self.det, self.known, self.rng = cfg, store, det, known, rng
        self.jobs: dict[str, JobInfo] = {}
        self.ids: list[str] = [""]
        self.code: dict[str, int] = {"": 0}
        self._due: dict[str, tuple[bool, float]] = {}  # job -> (periodic, due since): _fit_due
        self.version = 0  # changes to the job table (`add`, `end`): the memos' check
        self._first_seen: Memo[np.ndarray] = Memo()
        self._phased: dict[str, float] = {}  # job -> since when a phase caps it (`relearn`)
        # rows taken, not yet confirmed calm (`_release`): (time, block, spans), a span being
        # (job, its entry, its rows in block, its longest stall)
        self._pending: deque[tuple[float, np.ndarray, list[Span]]] = deque()
        self._hot: dict[str, float] = {}  # job -> the latest time its score was not calm

    def add(self, job: str, name: str, now: float) -> None:
        """A job seen for the first time: a code, and its stored baseline by name if any."""
        info = JobInfo(name=name, first_seen=now, code=len(self.ids))
        self.version += 1
        self.jobs[job] = info
        self.code[job] = info.code
        self.ids.append(job)
        if self.store is None:
            return
        states = self.store.load(name, self.known)
        if not states:
            return
        try:
            for det_name, state in states.items():
                if state is not None and det_name in self.det:
                    self.det[det_name].set_job_state(job, state)
            info.loaded = True
            info.fitted_at = now
        except (KeyError, TypeError, ValueError) as exc:
            self.store.error(f"{name}: {exc}")

    def first_seen(self) -> np.ndarray:
        """Per job code, when the engine first saw the job (NaN for code 0 and ended jobs);
        kept until the job table changes."""

        def table() -> np.ndarray:
            jobs = self.jobs
            return np.array(
                [np.nan] + [getattr(jobs.get(j), "first_seen", np.nan) for j in self.ids[1:]]
            )

        return self._first_seen.get((self.version,), table)

    def learn(
        self, frame: Frame, job: np.ndarray, combined: np.ndarray, now: float, cycle: int
    ) -> None:
        """Calm jobs past warm-up add rows to their reservoir (each every `learn_every`-th
        cycle, spread over jobs; small jobs every cycle), except rows of a run's start-up and
        first steps after a pause (`settling`), once the job stayed calm for
        `learn_delay_s` after them (`_release`), and fit when due: first as soon as `fit_rows`
        calm rows are in (or at `fit_after_s`), again at 4x as many, then every `refit_s` (at
        most `fits_per_cycle` jobs a cycle: `_fit_due`)."""
        self._add_rows(frame, job, combined, now, cycle)
        self._release(now)
        self._fit_due(now)

    def relearn(
        self, phased: np.ndarray, calm: np.ndarray, steady: np.ndarray, now: float
    ) -> np.ndarray:
        """The score each job learns by (`learn`): its `calm`, except for a fitted job that a
        phase (`Engine._phase`: a job-wide move its progress calls healthy) has capped for
        `relearn_s`: that is its new normal (a new stage of training, a longer sequence, a
        restart on other nodes), not a phase. Its reservoir starts over and learns while the
        detectors that the phase neither caps nor holds under 1.0 (`steady`: not progress and
        pace, which may sit at 0.5-1.0 when the new normal steps a little slower) are calm,
        and it is fitted as a first fit is, as soon as `fit_rows` rows are in; a phase still on
        then starts a new `relearn_s`. Without this its baseline would never move: capped at
        0.99, the job learns nothing. `relearn_s` (30 min) outlasts an evaluation pass, which
        would otherwise become the normal that training then departs from."""
        held, out = self._phased, calm
        on = np.flatnonzero(phased[: len(self.ids)]).tolist()
        now_on = {self.ids[c] for c in on}
        for job in [j for j in held if j not in now_on]:
            del held[job]
        for c in on:
            job = self.ids[c]
            info = self.jobs.get(job)
            if info is None or info.fitted_at is None:
                continue
            since = held.setdefault(job, now)
            if not info.relearn and now - since >= self.cfg.relearn_s:
                info.relearn, info.rows, info.seen, info.learns = True, None, 0, 0
                info.fitted_rows, held[job] = 0, now
                self._due.pop(job, None)
            if info.relearn:
                out = calm.copy() if out is calm else out
                out[c] = steady[c]
        return out

    def _add_rows(
        self, frame: Frame, job: np.ndarray, combined: np.ndarray, now: float, cycle: int
    ) -> None:
        every = max(self.cfg.learn_every, 1)
        hot = [self.ids[c] for c in (np.flatnonzero(combined[1:] >= self.cfg.learn_below) + 1)]
        self._hot.update((j, now) for j in hot if j in self.jobs)  # (an ended job's GPUs: no)
        codes = np.flatnonzero((combined < self.cfg.learn_below) & (combined >= 0))
        size = np.bincount(job, minlength=len(combined))[codes] if len(job) else codes * 0
        turn = (codes % every == cycle % every) | (size <= self.cfg.learn_small)
        codes = codes[(codes > 0) & turn]
        if not len(codes):
            return
        stall = frame.col(F.STALL_SECONDS)
        chosen = np.zeros(len(combined), dtype=bool)  # a table: np.isin sorts both sides
        chosen[codes] = True
        rows_all = np.flatnonzero(chosen[job] & ~settling(frame))
        order = rows_all[np.argsort(job[rows_all], kind="stable")]
        jo = job[order]
        starts = np.flatnonzero(np.r_[True, jo[1:] != jo[:-1]])
        if not len(order):
            return
        with np.errstate(invalid="ignore"):  # each job's longest stall (NaN: none reported)
            longest = np.fmax.reduceat(stall[order], starts).tolist()
        block = frame.values[order].astype(np.float32)  # one gather; a job's rows: a slice
        ends = np.r_[starts[1:], len(order)].tolist()
        spans: list[Span] = []  # the jobs past warm-up
        for c, a, b, st in zip(jo[starts].tolist(), starts.tolist(), ends, longest, strict=True):
            info = self.jobs.get(self.ids[c])
            if info is not None and now - info.first_seen >= self.cfg.warmup_s:
                spans.append((self.ids[c], info, a, b, st))
        if spans:
            self._pending.append((now, block, spans))

    def _release(self, now: float) -> None:
        """Learn the rows taken `learn_delay_s` ago or more of jobs whose score was calm ever
        since: a fault's first samples score calm until the persistence window fills (15 s),
        and a baseline that learned them (a spin hang's onset: every rank busy at idle power)
        takes the job's training for the fault. Rows of a job gone since are dropped, also when
        it is back under the same id (a requeue, a missed scrape): a new entry, its own warm-up."""
        while self._pending and self._pending[0][0] <= now - self.cfg.learn_delay_s:
            taken, block, spans = self._pending.popleft()
            learning = [
                (info, a, b, st)
                for job, info, a, b, st in spans
                if self.jobs.get(job) is info and self._hot.get(job, -math.inf) < taken
            ]
            self._learned(block, learning, now)

    def _learned(
        self, block: np.ndarray, learning: list[tuple[JobInfo, int, int, float]], now: float
    ) -> None:
        """Add each job's span of `block` to its reservoir and mark its fit due when it is."""
        self._reservoirs(block, [(info, a, b) for info, a, b, _ in learning])
        cfg = self.cfg
        for info, _, _, st in learning:
            info.learns += 1
            if math.isfinite(st):
                info.max_stall = max(info.max_stall, st)
            if info.fitted_at is None or info.relearn:
                enough = info.seen >= cfg.fit_rows and info.learns >= cfg.fit_cycles
                late = info.fitted_at is None and now - info.first_seen >= cfg.fit_after_s
                due, periodic = enough or late, False
            else:
                due = 0 < info.fitted_rows <= info.seen / 4  # the early refit
                periodic = now - info.fitted_at >= cfg.refit_s
            if due or periodic:  # (first and early fits first, then the longest waiting)
                self._due.setdefault(self.ids[info.code], (not due, now))

    def _fit_due(self, now: float) -> None:
        """Fit the jobs that came due, at most `fits_per_cycle` a cycle, in one pass
        (`fit_jobs`: a pass costs about 0.4 ms and 0.15 ms a job at 10,000 GPUs). A job's
        first fit and its early refit are made at once (a job is scored from them, a short
        run stores them); periodic refits wait until `refit_batch` are due or the longest has
        waited `refit_wait_s`, so that one pass serves many (at 10,000 GPUs three a cycle
        come due). A burst (every job of a restarted service reaching its
        first fit within a minute: ~100 fits) is spread over the next cycles instead of
        stalling one."""
        if not self._due:
            return
        waiting = self._due.values()
        if (
            all(periodic for periodic, _ in waiting)
            and len(self._due) < self.cfg.refit_batch
            and now - min(since for _, since in waiting) < self.cfg.refit_wait_s
        ):
            return
        due = sorted(self._due, key=self._due.__getitem__)[: self.cfg.fits_per_cycle]
        for job in due:
            del self._due[job]
        self.fit_jobs([j for j in due if j in self.jobs], now)

    def learn_online(self, frame: Frame, combined: np.ndarray) -> None:
        """Online detectors (`Level`) learn every instant, except from jobs whose alert is on
        (their persisted, phase-capped combined score at the job alert's level): a shift no
        alert confirmed can become the new normal, an alerting window never does."""
        online = [d for d in self.det.values() if isinstance(d, Level)]
        if not online:
            return
        on = np.flatnonzero(combined >= alert_level("job"))
        alerting = {self.ids[c] for c in on if c > 0}
        for det in online:
            det.update(frame, alerting)

    def _reservoirs(self, block: np.ndarray, spans: list[tuple[JobInfo, int, int]]) -> None:
        """Algorithm R for several jobs at once, each adding the rows `block[a:b]`: a uniform
        sample over each job's healthy life. The random draws are those the jobs would make
        one after the other (one per row past a full reservoir), in one call."""
        if not spans:
            return
        size = self.cfg.reservoir
        seen = np.array([info.seen for info, _, _ in spans])
        start = np.array([a for _, a, _ in spans])
        count = np.array([b - a for _, a, b in spans])
        room = np.minimum(np.maximum(size - seen, 0), count)  # rows that fill a free place
        for i in np.flatnonzero(room).tolist():  # (a job's first rows find its rows None)
            info, a, _ = spans[i]
            if info.rows is None:  # allocated whole: filling is a copy, not a vstack per learn
                info.rows = np.empty((size, block.shape[1]), dtype=np.float32)
            filled, free = min(info.seen, size), int(room[i])
            info.rows[filled : filled + free] = block[a : a + free]
        rest = count - room  # rows drawn for: each replaces a random place with p = size/seen
        k = np.repeat(np.arange(len(spans)), rest)  # each draw's job
        pos = np.arange(len(k)) - np.repeat(np.cumsum(rest) - rest, rest)  # its rank in the job
        place = (self.rng.random(len(k)) * ((seen + room + 1)[k] + pos)).astype(np.int64)
        hit = np.flatnonzero(place < size)
        if len(hit):  # in draw order, so a place drawn twice keeps the later row, as one by one
            kh, at = k[hit], place[hit]
            drawn = block[(start + room)[kh] + pos[hit]]  # the rows that replace, one gather
            bounds = np.flatnonzero(np.r_[True, kh[1:] != kh[:-1]])
            ends = [*bounds[1:].tolist(), len(hit)]
            for j, lo, hi in zip(kh[bounds].tolist(), bounds.tolist(), ends, strict=True):
                rows = spans[j][0].rows
                assert rows is not None
                rows[at[lo:hi]] = drawn[lo:hi]
        for (info, _, _), n in zip(spans, count.tolist(), strict=True):
            info.seen += n

    def fit_job(self, job: str, now: float) -> None:
        """Fit every detector on the job's reservoir and save the baseline under its name."""
        self.fit_jobs([job], now)

    def fit_jobs(self, jobs: list[str], now: float) -> None:
        """`fit_job` for several jobs at once: one training frame of their reservoirs, so each
        detector fits them in one pass (a cycle's due refits, a burst of first fits)."""
        infos = [(j, i) for j in jobs if (i := self.jobs[j]).rows is not None and i.seen]
        if not infos:
            return
        stall_col = F.ALL_FIELDS.index(F.STALL_SECONDS)
        blocks = []
        for _, info in infos:
            assert info.rows is not None
            rows = info.rows[: min(info.seen, self.cfg.reservoir)].astype(float)
            if info.max_stall > 0:  # the longest healthy gap is kept if the sample missed it
                first = float(rows[0, stall_col])
                rows[0, stall_col] = max(0.0 if math.isnan(first) else first, info.max_stall)
            blocks.append(rows)
        size = [len(b) for b in blocks]
        n = sum(size)
        train = Frame(
            np.full(n, now),
            np.repeat(np.array([j for j, _ in infos], dtype=object), size),
            repeated("train", n),
            np.arange(n) % 1000,
            np.concatenate(blocks),
        )
        for name, det in self.det.items():
            if name != "hardware" and name not in ONLINE:
                det.fit(train)
        for job, info in infos:
            info.fitted_at, info.relearn = now, False
            info.fitted_rows = 0 if info.fitted_rows else max(info.seen, 1)  # one early refit
            if self.store is not None:
                states = {n: s for n, d in self.det.items() if (s := d.job_state(job)) is not None}
                if states:
                    self.store.save(info.name, states)

    def end(self, running: set[str], in_use: np.ndarray) -> np.ndarray | None:
        """Forget jobs that are no longer running (their baselines stay in the store): their
        entry and their detectors' fitted state; once no GPU slot refers to them any more
        (`in_use`: the codes slots hold), their code. Codes are compacted so per-job arrays
        stay the size of the live set on a service that runs for months: returns the old ->
        new code table when they were (None otherwise)."""
        ended = {j for j in self.jobs if j not in running}
        self.version += bool(ended)
        for job in ended:
            del self.jobs[job]
            self._due.pop(job, None)
            self._phased.pop(job, None)
            self._hot.pop(job, None)
        if ended:
            for det in self.det.values():
                det.drop_jobs(ended)
        if len(self.ids) <= 2 * len(self.jobs) + 1000:  # the live set holds at least the jobs
            return None
        live = set(self.jobs) | {self.ids[c] for c in np.unique(in_use)}
        if len(self.ids) <= 2 * len(live) + 1000:
            return None
        ids = [""] + sorted(j for j in live if j)
        new = {j: i for i, j in enumerate(ids)}
        remap = np.array([new.get(j, 0) for j in self.ids], dtype=np.int32)
        self.ids, self.code = ids, new
        self.version += 1
        for job, info in self.jobs.items():
            info.code = new[job]
        return remap


SETTLE_S, SETTLE_STEPS = 10.0, 40  # a run's first steps after a pause: not its steady state


def settling(frame: Frame) -> np.ndarray:
    """Rows of a run before its first step (the log opened a pause, the start-up line or a
    restart's, and reported no step time since: NCCL init, a checkpoint load, ranks spinning
    in the first collective), and of its first steps after a pause closed, for max(`SETTLE_S`,
    `SETTLE_STEPS` x its step time) from the pause's start: a run back from a restart or a
    save steps slowly at first (the quickstart's restart: 2.2 s, 1.7 s, then 1.2 s steps).
    No run's steady state: a first fit of them took that restart's 2.2 s for the job's step."""
    it = frame.col(F.ITER_SECONDS)
    since = frame.col(F.SINCE_PAUSE)
    with np.errstate(invalid="ignore"):
        inside = pause_open(frame.col(F.STALL_SECONDS), since)
        after = ~inside & (since < np.fmax(SETTLE_S, SETTLE_STEPS * it))
        return ~np.isfinite(it) & inside | after

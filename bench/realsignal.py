"""Real-signal rows of `goodput bench faults`: a real H200, healthy and with faults spliced in.

Data: `tests/data/real/h200-healthy-ckpt` (NVML at 4 Hz and the job's own log, one H200, a
Megatron-style loop with checkpoint saves, started twice). A run is a one-GPU job built from
that trace: its first process as recorded, then its steady training part repeated (re-timed,
nothing invented) until the job is `minutes` long. A fault replaces the GPU samples from its
onset with the signature measured on the same H200 (`SIGNATURES`, from failures.md) and the log
as that fault shapes it (a hang: no more lines; a straggler: every step 124/85 slower). Every
run goes through the production detector engine (5 s cycles, each reading the GPU's latest
sample) and the alert conditions of alertmanager/alerts.yaml, in simulated time; it measures
detection (first firing alert after onset) and false alerts; a detected straggler also gets the
production attribution's verdict on the same evidence (`verdict`); no actions (no scheduler).

The healthy job is also run as production samples it (`Scrapes`): on 2 nodes x 4 GPUs (copies
of the trace's GPU, each a little apart as silicon is), each node scraped every 15 s, or 30 s,
at its own moment, every cycle reading each GPU's latest scrape: a checkpoint save that one
node's scrape caught stays its reading for a scrape while the other node works again.

Run alone (about 5 minutes on one core; `goodput bench faults` includes these rows):
`.venv/bin/python -m bench.realsignal --out bench/results` writes realsignal.json and
realsignal.md there.
"""

from __future__ import annotations

import gzip
import json
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.inproc import score_frames
from bench.online_alerts import OnlineAlerts
from detector import exposition
from detector import fields as F
from detector.baselines import BaselineStore
from detector.frame import Frame, counter_rate
from detector.pipeline import Config, Engine
from exporters.logmetrics.parser import LogState
from recovery.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "tests" / "data" / "real" / "h200-healthy-ckpt"
HOST = ROOT / "tests" / "data" / "real" / "host-cpu" / "host_cpu.csv"
SCRAPE_S = 15.0  # the exporters' scrape interval in production (the simulator's is 5 s)
NODE, GPU, JOB, NAME, MODEL = "h200", 0, "700001", "real-mlp", "NVIDIA H200"
INTERVAL_S = 5.0
DETECTION = (
    "GoodputJobHung",
    "GoodputJobSlow",
    "GoodputJobAnomaly",
    "GoodputGPUAnomaly",
    "GoodputJobStraggler",
)
UTIL, POWER, SM = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_PROF_SM_ACTIVE"
TEMP = "DCGM_FI_DEV_GPU_TEMP"
TENSOR, DRAM, CLOCK = (
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_DEV_SM_CLOCK",
)
GPM = {  # NVML GPM readings (percent) -> dcgm-exporter's ratio fields
    "gpm_sm_active": SM,
    "gpm_tensor_active": TENSOR,
    "gpm_dram_bw_util": DRAM,
}
# failures.md, one H200 at 4 Hz: (mean, sd) per field from the fault's onset
SIGNATURES: dict[str, dict[str, tuple[float, float]]] = {
    "spin_hang": {
        UTIL: (100, 0),
        POWER: (125, 2),
        SM: (0.008, 0.001),
        TENSOR: (0, 0),
        DRAM: (0, 0),
        CLOCK: (1980, 0),
    },
    "idle_hang": {UTIL: (0, 0), POWER: (124, 1), SM: (0, 0), TENSOR: (0, 0), DRAM: (0, 0)},
    "straggler": {UTIL: (62, 11), POWER: (564, 15), SM: (0.59, 0.05), TENSOR: (0.40, 0.04)},
}
SLOWDOWN = 124.0 / 85.0  # the straggling rank's iteration time vs healthy (failures.md)
_TS = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\] ?(.*)$")
_STEP = re.compile(r"(elapsed time per iteration \(ms\):\s*)([0-9.]+)")


@dataclass
class Trace:
    samples: pd.DataFrame  # t + DCGM fields (ratios 0..1), 4 Hz
    lines: list[tuple[float, str]]  # (time, line) of the job's output
    runs: list[tuple[float, float]]  # the job's processes (start, end)


def load(path: Path = TRACE) -> Trace:
    df = pd.read_csv(path / "metrics.csv")
    for gpm, name in GPM.items():
        df[name] = pd.to_numeric(df.pop(gpm), errors="coerce") / 100.0
    df = df.rename(columns={"ts": "t", **F.ALIASES}).astype(float)
    lines = []
    with gzip.open(path / "app.log.gz", "rt") as fh:
        for raw in fh:
            m = _TS.match(raw.rstrip("\n"))
            if m:
                ts = pd.Timestamp(m.group(1), tz="UTC").timestamp()
                lines.append((ts, m.group(2)))
    truth = json.loads((path / "truth.json").read_text())
    runs = [(p["start"], p["end"]) for p in truth["phases"] if p["mode"] != "idle"]
    return Trace(df, lines, runs)


def job(trace: Trace, minutes: float) -> Trace:
    """The first process as recorded, then its steady part (after the first save) repeated."""
    start, end = trace.runs[0]
    s = trace.samples[(trace.samples.t >= start) & (trace.samples.t < end)]
    lines = [(t, x) for t, x in trace.lines if start - 15 <= t < end]
    saves = [t for t, x in lines if "saving checkpoint" in x]
    loop0 = saves[0] - 5.0 if saves else start
    steady_s = s[s.t >= loop0]
    steady_l = [(t, x) for t, x in lines if t >= loop0 and "phase done" not in x]
    span = end - loop0
    out_s, out_l, shift = [s], [(t, x) for t, x in lines if "phase done" not in x], end - loop0
    while start + shift < start + minutes * 60:
        out_s.append(steady_s.assign(t=steady_s.t + shift))
        out_l += [(t + shift, x) for t, x in steady_l]
        shift += span
    stop = start + minutes * 60
    samples = pd.concat(out_s, ignore_index=True)
    return Trace(
        samples[samples.t < stop].reset_index(drop=True),
        [(t, x) for t, x in out_l if t < stop],
        [(start, stop)],
    )


def splice(trace: Trace, kind: str, onset: float, seed: int = 0) -> Trace:
    """The fault's measured signature from `onset`; the log as the fault shapes it."""
    rng = np.random.default_rng(seed)
    s = trace.samples.copy()
    after = (s.t >= onset).to_numpy()
    for name, (mu, sd) in SIGNATURES[kind].items():
        v = mu + sd * rng.standard_normal(int(after.sum()))
        if name == UTIL:  # NVML reports whole percent
            v = np.round(np.clip(v, 0.0, 100.0)).astype(float)
        elif name.startswith("DCGM_FI_PROF_"):
            v = np.clip(v, 0.0, 1.0)
        s.loc[after, name] = np.maximum(v, 0.0)
    if kind == "straggler":
        lines = [(t, x) for t, x in trace.lines if t < onset]
        for t, line in trace.lines:
            if t >= onset:
                nt = onset + (t - onset) * SLOWDOWN
                slow = _STEP.sub(lambda m: f"{m.group(1)}{float(m.group(2)) * SLOWDOWN:.1f}", line)
                lines.append((nt, slow))
        lines = [(t, x) for t, x in lines if t < trace.runs[-1][1]]
    else:
        lines = [(t, x) for t, x in trace.lines if t < onset]
    return Trace(s, lines, trace.runs)


def _stretch(trace: Trace, at: float, extra_s: float) -> Trace:
    """`extra_s` more before `at`: from `at` on, every sample and line that much later, the gap
    the GPU's last reading before it, repeated at the trace's rate."""
    s = trace.samples
    before, after = s[s.t < at], s[s.t >= at]
    dt = float(np.median(np.diff(s.t.to_numpy())))
    n = int(extra_s / dt)
    same = before.iloc[[-1] * n].assign(t=before.t.iloc[-1] + dt * np.arange(1, n + 1))
    return Trace(
        pd.concat([before, same, after.assign(t=after.t + extra_s)], ignore_index=True),
        [(t + extra_s if t >= at else t, x) for t, x in trace.lines],
        [(a, b + extra_s) for a, b in trace.runs],
    )


def compiling(trace: Trace, compile_s: float) -> Trace:
    """The job's first step compiling silently for `compile_s` more (torch.compile): the GPU's
    last reading before its first iteration (idle, its memory held) for that long."""
    return _stretch(trace, _first_iteration(trace), compile_s)


def long_saves(trace: Trace, save_s: float, count: int) -> Trace:
    """The job's first `count` checkpoint saves taking `save_s` each (a large model's): the
    GPU's last reading before each save's `successfully saved` line (idle, its memory held)
    until it has."""
    for k in range(count):
        began = [t for t, x in trace.lines if x.startswith("saving checkpoint")][k]
        done = next(t for t, x in trace.lines if t > began and "successfully saved" in x)
        trace = _stretch(trace, done, save_s - (done - began))
    return trace


def host_side(trace: Trace, phases: list[tuple[float, str]]) -> Trace:
    """The GPU's processes on the host as measured of real PyTorch processes (`HOST`): from
    each (time, phase) on, that phase's per-second readings after its first 5 s (its imports),
    repeated; read as the detector reads the NVML exporter's counter scraped every `SCRAPE_S`
    from the first phase's start, its irate(): the last two scrapes' rate, held until the
    next (NaN before the second scrape)."""
    rec = pd.read_csv(HOST)
    t0, end = phases[0][0], float(trace.samples.t.max())
    seconds = np.arange(t0, end + 1.0, 1.0)
    per_s = np.zeros(len(seconds))
    for k, (at, phase) in enumerate(phases):
        r = rec[rec.phase == phase]
        ts, cpu = r.t_s.to_numpy(), r.cpu_seconds.to_numpy()
        rate = (np.diff(cpu) / np.diff(ts))[ts[:-1] >= 5.0]
        until = phases[k + 1][0] if k + 1 < len(phases) else np.inf
        sel = (seconds >= at) & (seconds < until)
        per_s[sel] = rate[np.floor(seconds[sel] - at).astype(int) % len(rate)]
    done = np.r_[0.0, np.cumsum(per_s)]  # the counter at each whole second from t0
    scrapes = np.arange(0, len(per_s) + 1, int(SCRAPE_S))  # seconds from t0
    one_gpu = np.zeros(len(scrapes))
    irate = counter_rate(t0 + scrapes, one_gpu.astype(object), one_gpu, done[scrapes], SCRAPE_S)
    t = trace.samples.t.to_numpy()
    latest = np.searchsorted(scrapes, np.floor(t - t0), side="right") - 1
    cores = np.where(t >= t0, irate[np.maximum(latest, 0)], np.nan)
    return Trace(trace.samples.assign(**{F.HOST_CPU: cores}), trace.lines, trace.runs)


def cut(trace: Trace, end: float) -> Trace:
    """The trace's run ended at `end` (requeued)."""
    s = trace.samples
    return Trace(
        s[s.t < end].reset_index(drop=True),
        [(t, x) for t, x in trace.lines if t < end],
        [(trace.runs[0][0], end)],
    )


def shifted(trace: Trace, dt: float) -> Trace:
    """The same trace `dt` seconds later (a later run of the same job)."""
    return Trace(
        trace.samples.assign(t=trace.samples.t + dt),
        [(t + dt, x) for t, x in trace.lines],
        [(a + dt, b + dt) for a, b in trace.runs],
    )


def _instants(trace: Trace, job_id: str, end: float) -> Iterator[tuple[float, pd.Series, Any]]:
    """Every 5 s from the trace's first run's start to `end`: (the time, the GPU's latest
    sample, the job's log-metrics state after the lines printed by then)."""
    logs, li = LogState(), 0
    ts = trace.samples.t.to_numpy()
    for now in np.arange(trace.runs[0][0] + INTERVAL_S, end + INTERVAL_S / 2, INTERVAL_S):
        while li < len(trace.lines) and trace.lines[li][0] <= now:
            logs.feed_job(job_id, [trace.lines[li][1]], trace.lines[li][0])
            li += 1
        i = int(np.searchsorted(ts, now, side="right")) - 1
        if i >= 0:
            yield float(now), trace.samples.iloc[i], logs.jobs.get(job_id)


@dataclass(frozen=True)
class Scrapes:
    """A job on `nodes` x `gpus` GPUs built from the trace's one GPU, as production samples it:
    each GPU a copy of the trace, a little apart as silicon is (its power a constant offset of
    sd 8 W and 2 W of noise per scrape, its temperature a whole degree or two), each node
    scraped every `every_s` from its own moment (node k at k x 7.3 s, modulo `every_s`: the
    scrapes of two nodes never line up with each other or the detector's cycle), a GPU's
    reading up to 0.25 s old at its scrape (the exporter's cache); every 5 s cycle reads each
    GPU's latest scrape, as Prometheus answers."""

    nodes: int = 2
    gpus: int = 4
    every_s: float = 15.0
    seed: int = 0
    stagger_s: float = 7.3

    def node(self, n: int) -> str:
        return f"{NODE}-{n + 1}"

    def readings(self, trace: Trace) -> list[tuple[str, int, np.ndarray, pd.DataFrame]]:
        """Per GPU: (node, gpu, its scrape times, the reading each scrape took)."""
        rng = np.random.default_rng(self.seed)
        s = trace.samples
        ts = s.t.to_numpy()
        out = []
        for n in range(self.nodes):
            off = (n * self.stagger_s) % self.every_s
            at = np.arange(trace.runs[0][0] + off, ts.max(), self.every_s)
            for g in range(self.gpus):
                lag = 0.25 * rng.integers(0, 2)
                i = np.clip(np.searchsorted(ts, at - lag, side="right") - 1, 0, None)
                r = s.iloc[i].reset_index(drop=True)
                r[POWER] = r[POWER] + rng.normal(0, 8) + rng.normal(0, 2, len(r))
                r[TEMP] = r[TEMP] + round(float(rng.normal(0, 2)))
                out.append((self.node(n), g, at, r))
        return out


@dataclass
class Replayed:
    """What the detector engine and the alert conditions made of a replay."""

    fired: list[dict[str, Any]]  # firing detection alerts: {time, run, alertname, ...}
    peak: dict[str, float]  # the peak score per detector
    exported: list[tuple[int, float, str, float]]  # (run, time, gauge, value): the per-job
    # series the detector exported (exposition.job_series: pause allowance, what it learned)


def replay(
    traces: list[Trace], store: BaselineStore | None = None, scrapes: Scrapes | None = None
) -> Replayed:
    """Run the traces one after another as the same job name: on its one GPU, each cycle
    reading the latest sample, or as `scrapes` samples it."""
    eng = Engine(Config(interval_s=INTERVAL_S), store)
    alerts = OnlineAlerts(interval_s=INTERVAL_S)
    out = Replayed([], {}, [])
    fired, peak = out.fired, out.peak
    for k, tr in enumerate(traces):
        job_id = f"{JOB}{k}" if store is not None else JOB
        gpus = scrapes.readings(tr) if scrapes is not None else []
        for now, sample, js in _instants(tr, job_id, tr.runs[-1][1]):
            job = {
                "time": now,
                "job_id": job_id,
                "modelName": MODEL,
                F.LAST_PROGRESS: max(js.last_progress.values())
                if js and js.last_progress
                else np.nan,
                F.ITER_SECONDS: js.iteration_seconds if js and js.iteration_seconds else np.nan,
                F.LAST_PAUSE: js.last_pause if js and js.last_pause else np.nan,
            }
            if scrapes is None:
                rows = [{**sample.to_dict(), **job, "node": NODE, "gpu": GPU}]
            else:
                rows = []
                for node, gpu, at, read in gpus:
                    i = int(np.searchsorted(at, now, side="right")) - 1
                    if i >= 0:
                        rows.append({**read.iloc[i].to_dict(), **job, "node": node, "gpu": gpu})
            if not rows:
                continue
            frame = Frame.from_dataframe(pd.DataFrame(rows))
            res = eng.step(frame, now, {job_id: NAME})
            for d, name in enumerate(res.detectors):
                peak[name] = max(peak.get(name, 0.0), float(res.gpu[:, d].max()))
            out.exported += [
                (k, float(now), name, float(v))
                for name, cols in exposition.job_series(res).items()
                for v in cols["value"]
            ]
            dcgm = pd.DataFrame([{k2: v for k2, v in r.items() if k2 != "time"} for r in rows])
            dcgm.insert(0, "timestamp", now)
            alerts.add(now, {"dcgm": dcgm, **score_frames(res, now)})
            for a in alerts.firing(now):
                if a.get("alertname") in DETECTION:
                    fired.append({"time": float(now), "run": k, **a})
        eng.end_jobs(set())
    return out


def verdict(
    trace: Trace, first: float, now: float, seen: Replayed | None = None, run: int = 0
) -> dict[str, Any]:
    """The production attribution's diagnosis at `now` of an incident on the job's node whose
    first alert came at `first`, in the receiver's context (`Context.from_incident`: from
    `lookback_s` before that alert to `lookahead_s` after it), on the evidence it would
    gather: every DCGM field and the log-derived progress series at 5 s (the trace's first
    run, as one job) and, from `seen` (the replay of `run`), the alerts fired by then and
    the per-job series the detector exported (its pause allowance, what it learned)."""
    from recovery import attribution
    from recovery.evidence import Bundle, Context, Report, Series

    fired = [a for a in seen.fired if a["run"] == run and a["time"] <= now] if seen else []
    alerts = [{"alertname": a["alertname"], "job_id": JOB} for a in fired]
    incident = {"job_id": JOB, "node": NODE, "first_alert_at": first, "alerts": alerts}
    ctx = replace(Context.from_incident(incident, Settings(), now), job_name=NAME)
    start, end = max(trace.runs[0][0], ctx.start), ctx.end
    fields = [c for c in trace.samples.columns if c.startswith("DCGM_")]
    pts: dict[str, list[tuple[float, float]]] = {}
    for t, row, js in _instants(trace, JOB, end):
        if t < start:
            continue
        for name in fields:
            pts.setdefault(name, []).append((t, float(row[name])))
        for name, v in (
            ("goodput_job_iteration", js and js.iteration),
            ("goodput_job_iteration_seconds", js and js.iteration_seconds),
        ):
            if v:
                pts.setdefault(name, []).append((t, float(v)))
    for k, t, name, v in seen.exported if seen else ():
        if k == run and start <= t <= end:
            pts.setdefault(name, []).append((t, v))
    series = [
        Series(n, p, node=NODE if n.startswith("DCGM_") else None,
               gpu=str(GPU) if n.startswith("DCGM_") else None, job_id=JOB)
        for n, p in pts.items()
    ]  # fmt: skip
    ok = [Report(c, "ok") for c in ("prometheus", "logs", "slurm")]
    return attribution.attribute(Bundle(series=series, reports=ok), ctx, gpus_per_node=1)


TARGETS_S = {"spin_hang": 30.0, "idle_hang": 45.0, "straggler": 60.0}
COMPILE_S, REQUEUED_S = 200.0, 180.0  # a silent first-step compile; the requeue after its alert
SCRAPES_S = (15.0, 30.0)  # the healthy job on 2 nodes x 4 GPUs, scraped as production does
LOAD_S, FIRST_BATCH_S = 150.0, (20.0, 30.0)  # a checkpoint load, then a first batch at rest
SAVE_S = 720.0  # a save as long as a large model's (epfLLM/Megatron-LLM#69: 70B in ~10 minutes)


def _first(fired: list[dict[str, Any]], onset: float, run: int = 0) -> dict[str, Any] | None:
    after = [a for a in fired if a["run"] == run and a["time"] >= onset]
    return min(after, key=lambda a: a["time"]) if after else None


def _price(
    fired: list[dict[str, Any]], start: float, end: float, ref: float
) -> tuple[str | None, float | None]:
    """The first alert of run 0 in [start, end) and its seconds after `ref`: what a healthy
    row pays where it is taken for a hang once (None, None: nothing)."""
    hit = _first(fired, start)
    if hit is None or hit["time"] >= end:
        return None, None
    return hit["alertname"], round(hit["time"] - ref, 1)


def scraped_rows(minutes: float = 10.0) -> list[dict[str, Any]]:
    """The healthy job on 2 nodes x 4 GPUs, each node scraped every 15 s and every 30 s at
    its own moment (`Scrapes`): false alerts, as the other healthy rows."""
    long = job(load(), minutes)
    out = []
    for every in SCRAPES_S:
        how = Scrapes(every_s=every)
        seen = replay([long], scrapes=how)
        name = (
            f"{minutes:g}-min job on {how.nodes} nodes x {how.gpus} GPUs, each node scraped "
            f"every {every:g} s at its own moment"
        )
        out.append(_healthy_row(name, [long], seen.fired, seen.peak, how.nodes * how.gpus))
    return out


def rows(
    minutes: float = 10.0, onset_s: float = 420.0, scraped: bool = True
) -> list[dict[str, Any]]:
    """The real-signal rows: healthy runs (false alerts), on one GPU and (`scraped`) on 2
    nodes scraped as production does, and each fault warm, at job start, and (straggler, a
    start-up that never ends) in a restart that has the job's stored baseline."""
    trace = load()
    long = job(trace, minutes)
    start = long.runs[0][0]
    first_iter = _first_iteration(long)
    again = shifted(job(trace, 5.0), long.runs[-1][1] - trace.runs[0][0] + 30.0)
    out: list[dict[str, Any]] = []
    healthy = (
        ("recorded trace (2 runs)", [trace]),
        (f"{minutes:g}-min job", [long]),
        (f"{minutes:g}-min job, then a 5-min restart by name", [long, again]),
    )
    for name, traces in healthy:
        with tempfile.TemporaryDirectory(prefix="goodput-real-") as tmp:
            seen = replay(traces, BaselineStore(tmp) if len(traces) > 1 else None)
        out.append(_healthy_row(name, traces, seen.fired, seen.peak))
    if scraped:
        out += scraped_rows(minutes)
    # a first step compiling longer than the start-up allowance: the run is taken for one that
    # never starts and requeued; its restart (same id) compiles as long, and must run
    slow = compiling(job(trace, 5.0), COMPILE_S)
    requeued = cut(slow, first_iter + REQUEUED_S)
    restart = shifted(slow, requeued.runs[0][1] - start + 30.0)
    seen = replay([requeued, restart])
    name = (
        f"first step compiling silently {COMPILE_S:g} s, requeued {REQUEUED_S:g} s in as "
        "not started, then its restart compiling as long (same id)"
    )
    # every alert counts against the row (the requeue is a false action on a healthy job);
    # the price paid and what came after it are reported apart
    out.append(_healthy_row(name, [requeued, restart], seen.fired, seen.peak))
    price = _price(seen.fired, requeued.runs[0][0], np.inf, first_iter)
    out[-1]["requeued_run_alert"], out[-1]["requeued_run_alert_s"] = price
    out[-1]["alerts_after_price"] = sorted({a["alertname"] for a in seen.fired if a["run"] == 1})
    # saves longer than the pause allowance: the first is flagged once (nothing yet says how
    # long the job's saves take), the next as long raises nothing (3x the first is allowed)
    saves = long_saves(job(trace, 5.0), SAVE_S, 2)
    seen = replay([saves])
    marks = [t for t, x in saves.lines if x.startswith("saving checkpoint")]
    name = f"its first two checkpoint saves taking {SAVE_S:g} s each (the GPU idle, memory held)"
    later = [a for a in seen.fired if a["time"] >= marks[1]]
    out.append(_healthy_row(name, [saves], seen.fired, seen.peak))
    out[-1]["first_save_alert"], out[-1]["first_save_alert_s"] = _price(
        seen.fired, marks[0], marks[1], marks[0]
    )
    out[-1]["alerts_after_price"] = sorted({a["alertname"] for a in later})
    cases = [(k, "warm (7 min of history)", start + onset_s) for k in TARGETS_S]
    cases += [
        ("spin_hang", "at job start (before its first iteration)", first_iter),
        ("idle_hang", "10 s after its first iteration", first_iter + 10.0),
        ("idle_hang", "before its first iteration (start-up never ends)", first_iter),
        ("straggler", "from its first iteration, never seen before", first_iter),
        ("straggler", "60 s after its first iteration, before its first fit", first_iter + 60.0),
    ]
    for kind, when, onset in cases:
        faulty = splice(long, kind, onset)
        seen = replay([faulty])
        out.append(_fault_row(kind, when, onset, seen, run=0))
        _add_verdict(out[-1], faulty, onset, seen, run=0)
    # the host side measured of real PyTorch processes (tests/data/real/host-cpu/): a process
    # that rests on the host while its GPU idles, before the first iteration, is a hang at the
    # short host-idle allowance; one that compiles is no hang however long it takes
    hung = splice(long, "idle_hang", first_iter)
    when = (
        "before its first iteration, its process resting on the host (measured: a rendezvous "
        "that never completes; the slowest of 3 scrape phases)"
    )
    phases = []
    for lag in (0.0, 5.0, 10.0):  # the 15 s scrapes at each 5 s phase against the samples
        resting = host_side(hung, [(start - lag, "train"), (first_iter, "rendezvous_hang")])
        phases.append(_fault_row("idle_hang", when, first_iter, replay([resting]), run=0))
    out.append(max(phases, key=lambda r: r["latency_s"] if r["detected"] else np.inf))
    compiled = host_side(
        slow, [(start, "train"), (first_iter, "compile"), (first_iter + COMPILE_S, "train")]
    )
    seen = replay([compiled])
    name = (
        f"first step compiling silently {COMPILE_S:g} s, its process compiling on the host "
        "(measured: torch.compile)"
    )
    out.append(_healthy_row(name, [compiled], seen.fired, seen.peak))
    # a checkpoint load on the host, then the first batch's read resting on the host (blocked
    # in I/O), then the first step: a rest after the milestone's 20 s is a hang, however long
    # the host worked before it (a rest timed from the work's end cost 20 s on the rendezvous)
    read = first_iter + LOAD_S
    for rest in FIRST_BATCH_S:
        loaded = compiling(job(trace, 5.0), LOAD_S + rest)
        name = (
            f"a {LOAD_S:g} s checkpoint load, then its first batch read resting {rest:g} s "
            "(measured: torch.load, then a blocked DataLoader; the worst of 3 scrape phases)"
        )
        by_phase = []
        for lag in (0.0, 5.0, 10.0):
            phased = [(start - lag, "train"), (first_iter, "ckpt_load"), (read, "loader_hang")]
            traced = host_side(loaded, [*phased, (read + rest, "train")])
            seen = replay([traced])
            by_phase.append(_healthy_row(name, [traced], seen.fired, seen.peak))
        out.append(max(by_phase, key=lambda r: r["false_alert_samples"]))
    restarts = [
        ("straggler", "restart, stored baseline by name", again.runs[0][0]),
        ("idle_hang", "restart that never reaches its first iteration", _first_iteration(again)),
    ]
    for kind, when, onset in restarts:
        faulty = splice(again, kind, onset)
        with tempfile.TemporaryDirectory(prefix="goodput-real-") as tmp:
            seen = replay([long, faulty], BaselineStore(tmp))
        out.append(_fault_row(kind, when, onset, seen, run=1))
        _add_verdict(out[-1], faulty, onset, seen, run=1)
    return out


def _add_verdict(row: dict[str, Any], trace: Trace, onset: float, seen: Replayed, run: int) -> None:
    """A detected straggler's diagnosis: the first verdict, on the evidence at 5 s steps after
    its first alert, that names a node (else the last one), and when."""
    if row["kind"] != "straggler" or row["latency_s"] is None:
        return
    alert = onset + row["latency_s"]
    for dt in np.arange(INTERVAL_S, Settings.lookahead_s + INTERVAL_S / 2, INTERVAL_S):
        doc = verdict(trace, alert, alert + dt, seen, run)
        if doc["affected_nodes"]:
            break
    row["verdict"] = {
        "outcome": doc["outcome"],
        "nodes": doc["affected_nodes"],
        "confidence": doc["confidence"],
        "after_alert_s": float(dt),
        "cause": doc["root_cause"],
    }


def _healthy_row(
    name: str, traces: list[Trace], fired: list[dict[str, Any]], peak: dict, gpus: int = 1
) -> dict[str, Any]:
    secs = gpus * sum(t.runs[-1][1] - t.runs[0][0] for t in traces)
    return {
        "row": f"healthy: {name}",
        "kind": "healthy",
        "gpu_hours": round(secs / 3600.0, 3),
        "false_alerts": sorted({a["alertname"] for a in fired}),
        "false_alert_samples": len(fired),
        "peak": {k: round(v, 2) for k, v in peak.items()},
        "met": not fired,
    }


def _first_iteration(trace: Trace) -> float:
    return min(t for t, x in trace.lines if re.search(r"\biteration\s+\d+/", x))


def _fault_row(kind: str, when: str, onset: float, seen: Replayed, run: int) -> dict[str, Any]:
    hit = _first(seen.fired, onset, run)
    latency = None if hit is None else round(hit["time"] - onset, 1)
    return {
        "row": f"{kind}: {when}",
        "kind": kind,
        "detected": hit is not None,
        "latency_s": latency,
        "first_alert": None if hit is None else hit["alertname"],
        "target_s": TARGETS_S[kind],
        "met": latency is not None and latency <= TARGETS_S[kind],
        "peak": {k: round(v, 2) for k, v in seen.peak.items()},
    }


def markdown(rows_: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| real-signal row | detected | latency (s) | first alert | target | met | peak scores |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows_:
        peak = ", ".join(f"{k} {v:g}" for k, v in r["peak"].items() if v >= 0.05) or "all < 0.05"
        if r["kind"] == "healthy":
            got = ", ".join(r["false_alerts"]) or "none"
            after = ", ".join(r.get("alerts_after_price") or []) or "none"
            if "requeued_run_alert" in r:  # the price: the first run is taken for a hang
                got += (
                    f" (the requeued run: {r['requeued_run_alert'] or 'none'} "
                    f"{r['requeued_run_alert_s']} s into its compile; its restart: {after})"
                )
            if "first_save_alert" in r:  # the price: the first long save is taken for a hang
                got += (
                    f" (the first save: {r['first_save_alert'] or 'none'} "
                    f"{r['first_save_alert_s']} s into it; after it: {after})"
                )
            lines.append(
                f"| {r['row']} ({r['gpu_hours']:g} GPU-h) | false alerts: {got} | – | – | "
                f"0 false | {'yes' if r['met'] else '**no**'} | {peak} |"
            )
            continue
        first = r["first_alert"] or "–"
        if v := r.get("verdict"):
            on = f" on {', '.join(v['nodes'])}" if v["nodes"] else ""
            why = v["cause"].partition(": ")[2] if v["outcome"] == "unknown" else ""
            first += (
                f"; diagnosed {v['outcome']}{on} ({v['confidence']:g}{': ' + why if why else ''})"
                f" on the evidence {v['after_alert_s']:g} s after it"
            )
        lines.append(
            f"| {r['row']} | {'yes' if r['detected'] else '**no**'} | "
            f"{'–' if r['latency_s'] is None else r['latency_s']} | {first} | "
            f"<= {r['target_s']:g} s | {'yes' if r['met'] else '**no**'} | {peak} |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    """Write the real-signal rows alone: realsignal.json and realsignal.md under --out."""
    import argparse
    import platform
    import time

    ap = argparse.ArgumentParser(prog="python -m bench.realsignal", description=main.__doc__)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    got = rows()
    command, date = "python -m bench.realsignal --out bench/results", time.strftime("%Y-%m-%d")
    wall = round(time.perf_counter() - t0, 1)
    meta = {
        "command": command,
        "trace": str(TRACE.relative_to(ROOT)),
        "interval_s": INTERVAL_S,
        "scrapes_s": list(SCRAPES_S),
        "wall_s": wall,
        "python": platform.python_version(),
        "date": date,
    }
    doc = {"meta": meta, "rows": got}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "realsignal.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    head = [
        "# Real-signal rows (a real H200: tests/data/real/h200-healthy-ckpt)",
        "",
        f"`{command}` ({date}, {wall:g} s). "
        "The trace's GPU scored every 5 s by the production engine and alert conditions; "
        "the rows on 2 nodes x 4 GPUs sample it as production does (`Scrapes`: each node "
        "scraped every 15 s or 30 s at its own moment, each cycle reading the latest scrape). "
        "Detection only: latency = onset -> first detection alert.",
        "",
    ]
    (args.out / "realsignal.md").write_text("\n".join([*head, *markdown(got)]) + "\n")
    print("\n".join(markdown(got)))


if __name__ == "__main__":
    main()

"""Scale benchmark: the detector service's whole cycle at 1k, 10k and 100k GPUs, in process,
from Prometheus answers in the shape the real Prometheus gives for the service's queries.

The cluster (bench/scale_data.py): 8 GPUs per node, 16 per job (two nodes), dcgm-exporter's
label set and the 23 DCGM fields the engine reads. The answers are served over HTTP by a separate
process, so a cycle pays for the transfer as it would from Prometheus: query + decode + frame +
score + render /metrics. Beside it, on the same answers: one bare `orjson.loads` (the limit)
and one bare numpy pass (z against per-job mean/sd, max over the 12 gauges); and for scale,
the bare parse of the raw `{__name__=~...}` answer with all labels that the service used to
ask for. 100,000 GPUs run as 10 shards (each shard's answer holds what `goodput_shard="K"`
selects), one after the other, each its own service.

    python -m bench.scale [--sizes 1000,10000,100000] [--shards 10] [--cycles 24] [--out DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qs

import numpy as np
import orjson

from bench.scale_data import Cluster, gpu_answers, job_answers, raw_answer, vector_answer
from detector import fields as F
from detector.baselines import BaselineStore
from detector.ingest import Shard, fetch, no_gc
from detector.service import Service, ServiceConfig

PORT = 19395


def serve_answers(directory: str, port: int) -> None:
    """A separate process that answers /api/v1/query from recorded answers (by query)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    root = Path(directory)

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive and no Nagle delay, as Prometheus' (Go's)

        def setup(self) -> None:
            super().setup()
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_POST(self) -> None:  # noqa: N802
            n = int(self.headers.get("Content-Length") or 0)
            expr = parse_qs(self.rfile.read(n).decode()).get("query", [""])[0]
            path = root / "current" / (hashlib.sha256(expr.encode()).hexdigest() + ".json")
            body = path.read_bytes() if path.exists() else vector_answer([])
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()


def _write(directory: Path, recorded: dict[str, bytes]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for expr, body in recorded.items():
        (directory / (hashlib.sha256(expr.encode()).hexdigest() + ".json")).write_bytes(body)


def _best(fn, n: int, clock=time.perf_counter) -> float:
    times = []
    for _ in range(n):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return min(times)


VARIANTS = 4  # healthy samples drawn afresh per GPU: cycle k reads variant k % VARIANTS
WARM_CYCLES = 72  # 6 minutes at 5 s from a fresh start: warm-up, first fits, Level's fits
NO_DCP = 100  # every 100th node's exporter has no profiling fields (bench/scale_data.Cluster)


class Answers:
    """What the answer server gives in each cycle: the GPUs' samples of one variant (in turn)
    and the jobs' progress up to the cycle's time, under `work/current`."""

    def __init__(self, c: Cluster, shard: Shard | None, now: float, work: Path) -> None:
        self.c, self.shard, self.now, self.work = c, shard, now, work
        self.gpu = []
        for k in range(VARIANTS):
            variant = Cluster(
                c.node, c.gpu, c.job, Cluster.make(len(c.node), seed=k, no_dcp=NO_DCP).values
            )
            self.gpu.append(gpu_answers(variant, shard, now))
            _write(work / f"v{k}", self.gpu[-1])

    def serve(self, k: int) -> list[bytes]:
        """Cycle k's answers in place (returns their bodies, for the bare parse)."""
        jobs = job_answers(self.c, self.shard, self.now + 5.0 * k)
        _write(self.work / f"v{k % VARIANTS}", jobs)
        link, tmp = self.work / "current", self.work / "current.tmp"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(self.work / f"v{k % VARIANTS}")
        tmp.replace(link)
        return [*self.gpu[k % VARIANTS].values(), *jobs.values()]


def run_shard(c: Cluster, shard: Shard | None, cycles: int, work: Path, port: int) -> dict:
    """One service (one shard) over generated answers: timings, sizes, the two limits.

    The service starts fresh and runs `WARM_CYCLES` cycles untimed (its jobs past warm-up,
    fitted, their Level series fitted: the steady state it reaches by itself), then `cycles`
    measured ones. Each measured cycle is followed by the writes of the baselines it saved
    (the service's writer waits for the end of a cycle), then a bare parse of the answers it
    read and a bare numpy pass, so the ratios compare runs under the same load from other work
    (median of the per-cycle ratios); wall and CPU seconds of this process are both kept."""
    now = 1.8e9
    served = Answers(c, shard, now, work)
    bodies = served.serve(0)
    svc = Service(
        ServiceConfig(prometheus_url=f"http://127.0.0.1:{port}", shard=shard),
        store=BaselineStore(work / "baselines", background=True),  # as the service's
    )
    frame, _ = fetch(svc.client, None, now, shard)
    x = np.ascontiguousarray(frame.cols(F.GAUGE_NAMES))  # row-major: the bare pass's fastest
    codes, uniq = frame.job_codes
    mu = np.random.default_rng(0).normal(size=(len(uniq), x.shape[1]))
    sd = np.ones((len(uniq), x.shape[1]))

    def parse_all() -> None:  # one answer at a time, as the service reads them
        for b in bodies:
            orjson.loads(b)

    def bare_numpy() -> None:
        np.abs((x - mu[codes]) / sd[codes]).max(axis=1)

    def measure(k: int) -> dict:
        """Cycle k, then the bare parse and numpy pass right after it (the same load)."""
        nonlocal bodies
        bodies = served.serve(k)
        cpu = time.process_time()
        assert svc.cycle(now=now + 5.0 * k), "a cycle failed"
        run = {"total": svc.scores.cycle_seconds, "cpu": time.process_time() - cpu}
        run.update(svc.scores.phases)
        run["score_cpu"] = svc.scores.phases_cpu["score"]
        assert svc.store.flush(60.0)  # its saves written, as between the service's cycles
        with no_gc():  # the limit: orjson alone, without the collector (as the service runs)
            cpu = time.process_time()
            run["parse"] = _best(parse_all, 1)
            run["parse_cpu"] = time.process_time() - cpu
        run["numpy"] = _best(bare_numpy, 5)
        run["numpy_cpu"] = _best(bare_numpy, 5, time.thread_time)
        return run

    first = 0.0
    for k in range(WARM_CYCLES):
        bodies = served.serve(k)
        assert svc.cycle(now=now + 5.0 * k), "a cycle failed"
        first = first or svc.scores.cycle_seconds  # the first cycle creates every job
    steady = [measure(WARM_CYCLES + k) for k in range(cycles)]
    text = svc.exposition()
    bare_gc = _best(parse_all, 2)
    # the long run: every job's periodic refit comes due in turn (a share of them each cycle)
    start = WARM_CYCLES + cycles
    _age(svc, now + 5.0 * start)
    long_run, refits = [], []
    for k in range(start, start + cycles):
        before = {j: i.fitted_at for j, i in svc.engine.base.jobs.items()}
        long_run.append(measure(k))
        refits.append(sum(i.fitted_at != before.get(j) for j, i in svc.engine.base.jobs.items()))
    assert svc.engine.base.store is not None and svc.engine.base.store.flush(60.0)

    def stat(key: str, how=min, runs=steady) -> float:
        return round(how(r[key] for r in runs), 5)

    def ratio(a: str, b: str, runs=steady) -> float:
        return round(statistics.median(r[a] / r[b] for r in runs), 2)

    def total_ratio(a: str, b: str, runs=long_run) -> float:  # periodic work included
        return round(sum(r[a] for r in runs) / sum(r[b] for r in runs), 2)

    lines = [ln for ln in text.decode().splitlines() if ln and not ln.startswith("#")]
    return {
        "shard": f"{shard.index}/{shard.count}" if shard else "all",
        "gpus": len(frame),
        "jobs": len(set(frame.job) - {""}),
        "queries": len(bodies),
        "answer_bytes": sum(map(len, bodies)),
        "answer_series": sum(b.count(b'"value"') for b in bodies),
        "warm_cycles": WARM_CYCLES,
        "jobs_fitted": sum(i.fitted_at is not None for i in svc.engine.base.jobs.values()),
        "measured_cycles": len(steady),
        "first_cycle_s": round(first, 4),
        "cycle_s_min": stat("total"),
        "cycle_s_median": stat("total", statistics.median),
        "cycle_s_max": stat("total", max),
        "cycle_cpu_s_median": stat("cpu", statistics.median),
        "fetch_s_min": stat("fetch"),
        "score_s_min": stat("score"),
        "score_s_median": stat("score", statistics.median),
        "score_s_max": stat("score", max),
        "render_s_min": stat("render"),
        "bare_orjson_parse_s_min": stat("parse"),
        "bare_orjson_parse_cpu_s_median": stat("parse_cpu", statistics.median),
        "bare_orjson_parse_s_with_gc": round(bare_gc, 4),
        "bare_numpy_pass_s_min": stat("numpy"),
        "cycle_vs_bare_parse": ratio("total", "parse"),
        "cycle_cpu_vs_bare_parse_cpu": ratio("cpu", "parse_cpu"),
        "engine_vs_bare_numpy": ratio("score", "numpy"),
        "engine_cpu_vs_bare_numpy_cpu": ratio("score_cpu", "numpy_cpu"),
        "long_run_refits_per_cycle": round(statistics.mean(refits), 2),
        "long_run_score_s_median": stat("score", statistics.median, long_run),
        "long_run_cycle_s_median": stat("total", statistics.median, long_run),
        "long_run_engine_vs_bare_numpy": ratio("score", "numpy", long_run),
        "long_run_engine_cpu_vs_bare_numpy_cpu": ratio("score_cpu", "numpy_cpu", long_run),
        "long_run_score_s_mean": round(statistics.mean(r["score"] for r in long_run), 5),
        "long_run_total_engine_vs_bare_numpy": total_ratio("score", "numpy"),
        "long_run_total_engine_cpu_vs_bare_numpy_cpu": total_ratio("score_cpu", "numpy_cpu"),
        "metrics_series": len(lines),
        "metrics_bytes": len(text),
    }


def _age(svc: Service, now: float, hours: float = 2.0, seed: int = 0) -> None:
    """Put the service in the state of one whose jobs have run for `hours`: every fitted job's
    last fit at a spread phase of `refit_s` (as jobs' different start times spread them), so
    that `jobs x interval / refit_s` refits come due a cycle; its reservoir full (its rows
    repeated: the bench has run minutes) and the rows it has learned those of `hours` at the
    rate it learned so far, so a new row replaces a reservoir row as rarely as it then does;
    `level`'s windows full (each series' samples repeated, oldest first), as after 43 min."""
    base, cfg = svc.engine.base, svc.engine.cfg
    rng = np.random.default_rng(seed)
    for info in base.jobs.values():
        if info.fitted_at is None or info.rows is None or not info.seen:
            continue
        have = min(info.seen, cfg.reservoir)
        info.rows[:] = info.rows[np.arange(cfg.reservoir) % have]
        learned_s = max(now - info.first_seen - cfg.warmup_s, cfg.interval_s)
        later = int(info.seen * (hours * 3600.0 - cfg.warmup_s) / learned_s)
        info.seen = max(info.seen, cfg.reservoir, later)
        info.fitted_rows = 0  # past the early refit: the periodic ones only
        info.fitted_at = now - cfg.refit_s * rng.uniform()
    for det in svc.engine.det.values():
        if (bank := getattr(det, "bank_", None)) is not None:
            _fill_windows(bank)


def _fill_windows(bank) -> None:  # noqa: ANN001 - a `detector.univariate.Bank`
    rows = np.flatnonzero(bank.nbuf_[: bank.rows] > 0)
    n, head, w = bank.nbuf_[rows][:, None], bank.bhead_[rows][:, None], bank.window
    oldest_first = (head - n + np.arange(w) % n) % w
    bank.buf_[rows] = np.take_along_axis(bank.buf_[rows], oldest_first, axis=1)
    bank.bph_[rows] = np.take_along_axis(bank.bph_[rows], oldest_first, axis=1)
    bank.nbuf_[rows], bank.bhead_[rows] = w, 0


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--shards", type=int, default=10, help="shards for sizes above 10,000")
    ap.add_argument("--cycles", type=int, default=24, help="measured, after the warm ones")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    return run(sizes, args.shards, args.cycles, args.out)


def run(sizes: list[int], shards: int, cycles: int, out: Path) -> dict:
    """Every size in turn (one service per shard); writes scale.json and scale.md to `out`."""
    work = Path(tempfile.mkdtemp(prefix="goodput-scale-"))
    load = [round(x, 2) for x in os.getloadavg()]
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from bench.scale import serve_answers; serve_answers({str(work)!r}, {PORT})",
        ],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    rows = []
    try:
        _wait(PORT)
        for n in sizes:
            c = Cluster.make(n, no_dcp=NO_DCP)
            parts = [None] if n <= 10_000 else [Shard(k, shards) for k in range(shards)]
            per = [run_shard(c, s, cycles, work, PORT) for s in parts]
            now = 1.8e9
            raw = raw_answer(c, now) if n <= 10_000 else b""
            with no_gc():
                raw_parse = _best(lambda b=raw: orjson.loads(b), 3) if raw else None
            rows.append(
                {
                    "gpus": n,
                    "shards": len(parts),
                    "worst_shard": max(per, key=lambda r: r["cycle_s_median"]),
                    "per_shard": per,
                    "raw_answer_bytes": len(raw) or None,
                    "raw_answer_bare_orjson_parse_s": round(raw_parse, 4) if raw_parse else None,
                    "load_1min": round(os.getloadavg()[0], 2),  # the machine's, at the row's end
                }
            )
            print(json.dumps(rows[-1]["worst_shard"]), flush=True)
    finally:
        server.terminate()
        server.wait()
    doc = {
        "machine": {
            "platform": platform.platform(),
            "cores_visible": os.cpu_count(),
            "python": platform.python_version(),
            "note": "2 cores shared with other agents' work",
            "load_before": load,  # load average over 1, 5, 15 minutes, at the start and end
            "load_after": [round(x, 2) for x in os.getloadavg()],
        },
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "data": "generated Prometheus answers in dcgm-exporter's label shape (bench/scale.py), "
        "one node in 100 without profiling fields (its exporter's profiling module failed; "
        "until 2026-12-04 every node had them, which hid a 4-9 ms slow path of the medians)",
        "rows": rows,
    }
    out.mkdir(parents=True, exist_ok=True)
    old = out / "scale.json"
    if old.exists() and "live" in (prev := json.loads(old.read_text())):
        doc["live"] = prev["live"]  # the live rows (bench/scale_live.py) are kept
    (out / "scale.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "scale.md").write_text(markdown(doc))
    shutil.rmtree(work, ignore_errors=True)
    return doc


def _wait(port: int) -> None:
    for _ in range(100):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"answer server on {port} did not start")


def markdown(doc: dict) -> str:
    """scale.md: the in-process rows, then the live rows when there are any."""
    head = (
        "| GPUs | shards | GPUs per shard | cycle s, wall min / median / max | cycle CPU s "
        "| fetch | score min / median / max | render | bare orjson parse s | cycle / parse "
        "(wall; CPU) | engine / bare numpy (wall; CPU) | long run: engine / bare numpy, all "
        "cycles ; median cycle (refits a cycle) | answer "
        "MB | /metrics series | load (1 min) |\n" + "|---" * 15 + "|\n"
    )
    body = ""
    for r in doc.get("rows", []):
        w = r["worst_shard"]
        body += (
            f"| {r['gpus']:,} | {r['shards']} | {w['gpus']:,} | {w['cycle_s_min']:.3f} / "
            f"{w['cycle_s_median']:.3f} / {w['cycle_s_max']:.3f} | "
            f"{w['cycle_cpu_s_median']:.3f} | {w['fetch_s_min']:.3f} | {w['score_s_min']:.3f} / "
            f"{w['score_s_median']:.3f} / {w['score_s_max']:.3f} | {w['render_s_min']:.3f} | "
            f"{w['bare_orjson_parse_s_min']:.3f} | {w['cycle_vs_bare_parse']} ; "
            f"{w['cycle_cpu_vs_bare_parse_cpu']} | {w['engine_vs_bare_numpy']} ; "
            f"{w.get('engine_cpu_vs_bare_numpy_cpu', '–')} | "
            f"{_long_run(w)} | "
            f"{w['answer_bytes'] / 1e6:.1f} | {w['metrics_series']:,} | "
            f"{r.get('load_1min', '–')} |\n"
        )
    rows = doc.get("rows", [])
    note = "".join(
        f"- {r['gpus']:,} GPUs: the raw `{{__name__=~...}}` answer with every dcgm label (what "
        f"the service asked for before) is {r['raw_answer_bytes'] / 1e6:.1f} MB; its bare orjson "
        f"parse takes {r['raw_answer_bare_orjson_parse_s']} s.\n"
        for r in rows
        if r.get("raw_answer_bytes")
    )
    if any("long_run_refits_per_cycle" in r["worst_shard"] for r in rows):
        note = (
            "- Long run: after the measured cycles the service is put in the state of one whose "
            "jobs have run for 2 hours (`_age`: each job's last fit at a spread phase of "
            "`refit_s`, 15 min, so jobs x 5 s / 15 min periodic refits come due a cycle; "
            "reservoirs full, their rows repeated, and the rows learned those of 2 hours at the "
            "rate learned so far, so new rows replace reservoir rows as rarely as they then "
            "do; `level`'s windows full, each series' samples repeated), then as many cycles "
            "again are measured, each refitting its due jobs (every detector on the job's "
            "reservoir, the baseline handed to the store's writer thread) and `level` its due "
            "series, as the service does. Its first ratio is all its cycles' engine seconds "
            "over their bare numpy seconds (the periodic work comes in bursts, which the "
            "median cycle, the second, leaves out; until 2026-12-05 only the median was "
            "given).\n" + note
        )
    text = "# Scale benchmark (detector service)\n\n"
    if body:
        text += (
            "## In process\n\n"
            f"{doc['data']}; answers served over HTTP by a separate process. Each service "
            f"starts fresh and runs {WARM_CYCLES} cycles (6 minutes at 5 s) before the "
            "measured ones, every job logging progress and every GPU's samples drawn afresh "
            f"({VARIANTS} healthy draws in turn): the steady state it reaches by itself, jobs "
            "past warm-up and fitted, their early refits and `level`'s online learning "
            "included (until 2026-12-02 the bench fitted every detector on one instant "
            "instead, a state cheaper to score than the real one); then the long run's cycles, "
            "with their periodic refits (see the notes). Sharded rows "
            "show the slowest shard (by median wall cycle). Ratios are medians of per-cycle "
            "ratios, each bare run taken right after its cycle (same load); the CPU ratios "
            "count this process' (cycle / parse) or the scoring thread's (engine / numpy) CPU "
            "seconds, which other work on the machine inflates less than wall seconds. The "
            "limit stays a bare orjson parse of the answers, while the service decodes the "
            "per-GPU answers with msgspec straight into typed records (values already floats; "
            "`clients.prometheus.decode_column`), which costs less than that parse.\n\n"
            + head
            + body
            + "\n"
            + note
            + f"\nMachine: {_machine(doc['machine'])}; measured {doc['measured']}.\n\n"
        )
    if doc.get("live"):
        text += _live_markdown(doc["live"])
    return text + "Rerun: `goodput bench scale` (in process) and `goodput bench scale --live`.\n"


def _long_run(w: dict) -> str:
    if "long_run_total_engine_vs_bare_numpy" not in w:
        return "–"
    return (
        f"{w['long_run_total_engine_vs_bare_numpy']} ; {w['long_run_engine_vs_bare_numpy']} "
        f"({w['long_run_refits_per_cycle']})"
    )


def _machine(m: dict) -> str:
    text = f"{m['platform']}, {m['cores_visible']} cores, Python {m['python']}; {m['note']}"
    if "load_before" in m:
        text += (
            f"; load average (1, 5, 15 min) {', '.join(map(str, m['load_before']))} at the "
            f"start, {', '.join(map(str, m['load_after']))} at the end"
        )
    return text


def _live_markdown(live: dict) -> str:
    rows = ""
    for r in live["rows"]:
        if r.get("failed"):
            rows += f"| {r['gpus']:,} | failed: {r['failed']} |" + " |" * 9 + "\n"
        for ph in r["phases"]:
            per = ph["per_replica"]
            rows += (
                f"| {r['gpus']:,} | {r['targets_up']:.0f}/{r['nodes']} | {r['scrape_p99_s']} | "
                f"{r.get('sim_tick_s', '–')} | "
                f"{ph['replicas']} | {', '.join(str(int(p['gpus'])) for p in per)} | "
                f"{', '.join(str(p['cycle_s_median']) for p in per)} | "
                f"{max((p['cycle_s_max'] or 0) for p in per)} | "
                f"{ph['prometheus_query_s_mean']} | {ph['prometheus_queries']} | "
                f"{sum(int(p['errors'] or 0) for p in per)} |\n"
            )
    return (
        "## Live: simulator, real Prometheus, detector replicas\n\n"
        "One simulator process serving every node's dcgm /metrics, a private real Prometheus "
        f"scraping them every {live['interval_s']} s with the local stack's shard relabelling, "
        "and the detector replicas as their own processes (`goodput detector serve`, 1 "
        "unsharded, then N with `--shard K/N`), each phase "
        f"{live['seconds']:g} s; cycle times are the replicas' own "
        "`goodput_detector_cycle_seconds`, Prometheus' query time the mean of its "
        "`/api/v1/query` request durations over the phase.\n\n"
        "| GPUs | targets up | scrape p99 s | sim tick s | replicas | GPUs per replica | cycle s "
        "median per replica | cycle s max | Prometheus query s mean | queries | errors |\n"
        + "|---" * 11
        + "|\n"
        + rows
        + f"\nMachine: {live['cores']} cores shared with other agents' work; measured "
        f"{live['measured']}.\n\n"
    )


if __name__ == "__main__":
    main()

"""Detector scoring speed and memory: 100,000 GPUs x 12 metrics per cycle on one core.

Side by side on the same stream: Goodput's full cycle (the default detectors, persistence,
phase rule, job and node aggregation, reservoir learning; and again with the optional
multivariate view), one bare numpy pass (z against per-job mean/sd, max over fields), and
river's HalfSpaceTrees (run on a subsample, per-sample cost extrapolated: said in the output).
Run: `taskset -c 0 python bench/detector_bench.py [--gpus N]`; writes bench/results/detector.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

import numpy as np  # noqa: E402

from detector import fields as F  # noqa: E402
from detector.pipeline import Config, Engine  # noqa: E402
from detector.synthetic import healthy_frame  # noqa: E402


def _engine(jobs: int, multivariate: bool) -> tuple[Engine, float, float]:
    """An engine with every job fitted and past warm-up (so each cycle also learns)."""
    cfg = Config(multivariate=multivariate)
    eng = Engine(cfg)
    train = healthy_frame(jobs=jobs, nodes=2, steps=3, seed=1)
    eng.step(train.take(train.instants()[0]), -cfg.warmup_s - 1.0)  # jobs first seen long ago
    t0 = time.perf_counter()
    for name, det in eng.det.items():
        if name not in ("multivariate", "hardware"):
            det.fit(train)
    fit_all = time.perf_counter() - t0
    fit_mv_job = 0.0
    if multivariate:  # fitted per job outside the loop: time one job, copy its state
        one = healthy_frame(jobs=1, nodes=2, steps=20, seed=1)
        t0 = time.perf_counter()
        eng.det["multivariate"].fit(one)
        fit_mv_job = time.perf_counter() - t0
        state = eng.det["multivariate"].job_state("100")
        assert state is not None
        for j in range(jobs):
            eng.det["multivariate"].set_job_state(str(100 + j), state)
    for info in eng.base.jobs.values():
        info.fitted_at = 0.0  # fitted: the timed cycles learn but do not refit
    return eng, fit_all, fit_mv_job


def _cycles(eng: Engine, cycles: list) -> tuple[float, list[float]]:
    times = []
    for c, frame in enumerate(cycles):
        t0 = time.perf_counter()
        eng.step(frame, 5.0 * c)
        times.append(time.perf_counter() - t0)
    return float(min(times[1:] if len(times) > 1 else times)), times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=100_000)
    ap.add_argument("--cycles", type=int, default=6)
    ap.add_argument("--river-samples", type=int, default=2000)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "detector.json"))
    args = ap.parse_args()
    jobs = args.gpus // 16
    cycles = [
        healthy_frame(jobs=jobs, nodes=2, steps=1, seed=10 + c, start=5.0 * c)
        for c in range(args.cycles)
    ]
    eng, fit_all, _ = _engine(jobs, multivariate=False)
    cycle_s, times = _cycles(eng, cycles)
    per_det = {}
    with cycles[-1].unchanged():  # as in a cycle: pace reads what progress worked out
        for name, det in eng.det.items():
            t0 = time.perf_counter()
            det.score(cycles[-1])
            per_det[name] = round(time.perf_counter() - t0, 4)
    state = eng.state_bytes_per_gpu()
    reservoir = eng.cfg.reservoir * len(F.ALL_FIELDS) * 4  # full reservoir, float32
    mv, _, fit_mv_job = _engine(jobs, multivariate=True)
    mv_cycle_s, _ = _cycles(mv, cycles)
    t0 = time.perf_counter()
    mv.det["multivariate"].score(cycles[-1])
    per_det["multivariate (optional)"] = round(time.perf_counter() - t0, 4)
    # one bare numpy pass over the same data
    x = cycles[-1].cols(F.GAUGE_NAMES)
    codes = np.repeat(np.arange(jobs), 16)
    mu = np.random.default_rng(0).normal(size=(jobs, x.shape[1]))
    sd = np.ones((jobs, x.shape[1]))
    bare = []
    for _ in range(20):
        t0 = time.perf_counter()
        np.abs((x - mu[codes]) / sd[codes]).max(axis=1)
        bare.append(time.perf_counter() - t0)
    bare_s = float(min(bare))
    river = _river(x, args.river_samples)
    res = {
        "machine": {
            "platform": platform.platform(),
            "cpu": _cpu(),
            "cores_visible": os.cpu_count(),
            "affinity": sorted(os.sched_getaffinity(0)),
            "python": platform.python_version(),
            "note": "2 cores shared with other work; run pinned to one core (taskset -c 0)",
        },
        "gpus": len(cycles[-1]),
        "metrics": len(F.GAUGE_NAMES),
        "jobs": jobs,
        "detectors": list(eng.names),
        "timing": "best of the cycles after the first (the CPU is shared; medians vary 2x)",
        "cycle_seconds": round(cycle_s, 4),
        "cycle_seconds_all": [round(t, 4) for t in times],
        "cycle_seconds_with_multivariate": round(mv_cycle_s, 4),
        "per_detector_score_seconds": per_det,
        "online_state_bytes_per_gpu": round(state, 1),
        "reservoir_bytes_per_job_full": int(reservoir),
        "fit_seconds_vectorised_detectors": round(fit_all, 3),
        "fit_seconds_multivariate_per_job": round(fit_mv_job, 4),
        "bare_numpy_pass_seconds": round(bare_s, 4),
        "ratio_vs_bare_numpy": round(cycle_s / bare_s, 1),
        **river,
        "ratio_river_vs_goodput": round(river["river_extrapolated_seconds"] / cycle_s, 1),
        "targets": {
            "cycle_le_1s": cycle_s <= 1.0,
            "state_le_2KiB": state <= 2048,
            "river_ge_50x": river["river_extrapolated_seconds"] / cycle_s >= 50,
            "within_10x_bare_numpy": cycle_s / bare_s <= 10,
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))


def _river(x: np.ndarray, n: int) -> dict:
    from river import anomaly

    model = anomaly.HalfSpaceTrees(n_trees=10, height=8, window_size=250, seed=1)
    lo, hi = np.nanmin(x, axis=0), np.nanmax(x, axis=0)
    xs = np.nan_to_num((x[:n] - lo) / np.where(hi > lo, hi - lo, 1.0))
    rows = [{str(i): float(v) for i, v in enumerate(r)} for r in xs]
    chunks = []
    for part in np.array_split(np.arange(len(rows)), 4):
        t0 = time.perf_counter()
        for i in part:
            model.score_one(rows[i])
            model.learn_one(rows[i])
        chunks.append((time.perf_counter() - t0) / max(len(part), 1))
    per = min(chunks)
    return {
        "river_model": "HalfSpaceTrees(n_trees=10, height=8), score_one+learn_one",
        "river_samples_run": len(rows),
        "river_seconds_per_sample": per,
        "river_extrapolated_seconds": round(per * len(x), 2),
        "river_note": "run on a subsample (best of 4 chunks); per-sample cost extrapolated",
    }


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()

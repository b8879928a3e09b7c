"""The detector on every simulator scenario, healthy-long (8 nodes, 8 h, 14 jobs) included.

Per scenario: peak combined job score before onset and after it (faulted job, neighbours),
the suspect-node ranking after onset, the first cycle at or above the alert level after onset
(detection latency), and for healthy runs how often the phase rule held a job-wide move below
the threshold. Writes bench/results/detector_scenarios.json.
Run: `python bench/detector_scenarios.py [--only NAME ...] [--keep DIR]`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from detector.pipeline import Config, Engine
from detector.replay import load, steps
from detector.thresholds import level
from exporters.sim.recording import run_scenario

ROOT = Path(__file__).resolve().parents[1]


def score(path: Path) -> tuple[pd.DataFrame, pd.DataFrame, float]:
    frame, names, interval = load(path)
    eng = Engine(Config(interval_s=interval or 5.0))
    jobs, nodes = [], []
    t0 = time.perf_counter()
    for _, now, res in steps(frame, names, eng):
        jobs.append(res.jobs.assign(t=now))
        nodes.append(res.nodes.assign(t=now))
    return pd.concat(jobs), pd.concat(nodes), time.perf_counter() - t0


def summarise(name: str, truth: dict, jobs: pd.DataFrame, nodes: pd.DataFrame) -> dict:
    alert = level("job")
    comb = jobs[jobs.detector == "combined"]
    faults = truth.get("faults", [])
    onset = min((f["onset"] for f in faults), default=np.inf)
    faulted = {f.get("job_id") for f in faults if f.get("job_id")}
    out: dict = {
        "fault": faults[0]["kind"] if faults else "healthy",
        "peak_before_onset": round(float(comb[comb.t < onset].score.max()), 3),
        "peak_neighbours": round(float(comb[~comb.job_id.isin(faulted)].score.max()), 3),
        "peak_node_suspect_healthy": round(
            float(nodes[(nodes.t < onset) | ~nodes.job_id.isin(faulted)].score.max()), 3
        ),
        "phase_held_cycles": int(((comb.score >= 0.99) & (comb.score < alert)).sum()),
    }
    if faults:
        f = faults[0]
        job = f.get("job_id")
        after = comb[(comb.t >= onset) & ((comb.job_id == job) if job else True)]
        hit = after[after.score >= alert]
        out["peak_after_onset"] = round(float(after.score.max()), 3)
        out["latency_s"] = float(hit.t.min() - onset) if len(hit) else None
        d = jobs[(jobs.t >= onset) & ((jobs.job_id == job) if job else True)]
        first = d[(d.score >= alert) & (d.detector != "combined")].sort_values("t")
        out["first_detectors"] = sorted(set(first[first.t == first.t.min()].detector))
        if f.get("culprit") == "node" and job:
            peak = nodes[(nodes.t >= onset) & (nodes.job_id == job)].groupby("node").score.max()
            out["truth_node"] = f["nodes"][0] if f.get("nodes") else None
            out["suspect_peaks"] = {k: round(float(v), 3) for k, v in peak.items()}
            out["culprit_top"] = bool(
                len(peak) and peak.idxmax() == out["truth_node"] and peak.max() >= alert
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--keep", help="directory for the recordings (default: a temporary one)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "detector_scenarios.json"))
    args = ap.parse_args()
    base = Path(args.keep or tempfile.mkdtemp(prefix="goodput-det-"))
    results = {}
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        if args.only and path.stem not in args.only:
            continue
        rec_dir = base / path.stem
        if not (rec_dir / "truth.json").exists():
            run_scenario(path, out=rec_dir)
        truth = json.loads((rec_dir / "truth.json").read_text())
        jobs, nodes, seconds = score(rec_dir)
        results[path.stem] = {
            **summarise(path.stem, truth, jobs, nodes),
            "replay_s": round(seconds, 1),
        }
        print(path.stem, json.dumps(results[path.stem]), flush=True)
    doc = {"alert_level": level("job"), "config": Config().__dict__, "scenarios": results}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""`goodput bench tuning`: the fault benchmark with two alert condition files, side by side.

Runs `bench.faults` once with `--before` (default: the project's alerts.yaml) and once with
`--after` (a tuned copy, e.g. what `notebooks/tune_detector.ipynb` wrote), on the same scenarios
and seeds, and sets their figures next to each other: detection latency and accuracy per fault
kind, false incidents on healthy load. Given the notebook's `prediction.json`, it also says,
per fault kind, whether the benchmark moved the way the notebook predicted.
Results: `tuning.json` and `tuning.md`.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alertdsl import spec as A
from bench import faults
from bench.faults_plan import ROOT
from detector.tuning_sweep import direction

KIND_FIGURES = (
    "detected",
    "latency_p50_s",
    "latency_p95_s",
    "outcome_accuracy",
    "culprit_precision",
    "culprit_recall",
    "gpu_hours_lost_mean",
)
OVERALL_FIGURES = (
    "latency_p50_s",
    "latency_p95_s",
    "outcome_accuracy",
    "action_accuracy",
    "culprit_precision",
    "culprit_recall",
    "gpu_hours_lost_mean",
)


@contextmanager
def alerts_file(path: Path) -> Iterator[None]:
    """Point every consumer of the alert conditions (`$GOODPUT_ALERTS_FILE`) at `path`."""
    old = os.environ.get(A.PATH_ENV)
    os.environ[A.PATH_ENV] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(A.PATH_ENV, None)
        else:
            os.environ[A.PATH_ENV] = old


def describe(path: Path) -> dict[str, str]:
    """The file's name (relative to the repository where inside it) and content digest."""
    p = path.resolve()
    name = str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else p.name
    return {"file": name, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()[:12]}


def compare(
    after: Path,
    before: Path = A.DEFAULT_PATH,
    prediction: dict[str, Any] | None = None,
    quick: bool = False,
    seeds: int = 3,
    pattern: str | None = None,
    workers: int = 1,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run the fault benchmark with each file; their summaries and the verdicts."""
    for path in (before, after):
        A.load(path)  # a broken file fails here, before any run
    if describe(before)["sha256"] == describe(after)["sha256"]:
        raise ValueError(f"{before} and {after} hold the same alert conditions: nothing to compare")
    if prediction is not None:
        check_prediction(prediction)
    t0 = time.perf_counter()
    side: dict[str, Any] = {}
    for name, path in (("before", before), ("after", after)):
        with alerts_file(path):
            doc = faults.benchmark(quick, seeds, pattern, None, workers, progress)
        side[name] = {**describe(path), "summary": doc["summary"], "meta": doc["meta"]}
    b, a = side["before"]["summary"], side["after"]["summary"]
    kinds = sorted(set(b["per_kind"]) | set(a["per_kind"]))
    rows: dict[str, dict[str, Any]] = {
        k: {
            f: {"before": b["per_kind"].get(k, {}).get(f), "after": a["per_kind"].get(k, {}).get(f)}
            for f in KIND_FIGURES
        }
        for k in kinds
    }
    for k, row in rows.items():
        lat = row["latency_p50_s"]
        row["latency_moved"] = direction(lat["before"], lat["after"])
        want = ((prediction or {}).get("by_kind") or {}).get(k, {}).get("latency")
        row["latency_predicted"] = want
        row["as_predicted"] = None if want is None else want == row["latency_moved"]
    fb, fa = b["false_incidents"], a["false_incidents"]
    return {
        "meta": {
            "command": "goodput bench tuning",
            "runs": side["after"]["meta"]["runs"],
            "simulated_hours": side["after"]["meta"]["simulated_hours"],
            "quick": quick,
            "pattern": pattern,
            "wall_s": round(time.perf_counter() - t0, 1),
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
        },
        "before": {k: side["before"][k] for k in ("file", "sha256")},
        "after": {k: side["after"][k] for k in ("file", "sha256")},
        "per_kind": rows,
        "overall": {
            f: {"before": b["overall"].get(f), "after": a["overall"].get(f)}
            for f in OVERALL_FIGURES
        },
        "false_incidents": {
            "before": fb["false_incidents"],
            "after": fa["false_incidents"],
            "healthy_gpu_hours": fa["healthy_gpu_hours"],
            "destructive_before": fb["destructive_false_actions"],
            "destructive_after": fa["destructive_false_actions"],
        },
        "prediction": prediction,
    }


DIRECTIONS = ("down", "up", "same")


def check_prediction(doc: Any) -> dict[str, Any]:
    """`doc` if it has the shape `detector.tuning_sweep.predict` writes, else a clear ValueError."""
    if not isinstance(doc, dict) or not isinstance(doc.get("by_kind"), dict):
        raise ValueError("not a tuning prediction (no by_kind object)")
    for kind, row in doc["by_kind"].items():
        if not isinstance(row, dict) or row.get("latency") not in DIRECTIONS:
            raise ValueError(f"prediction for {kind!r}: latency must be one of {DIRECTIONS}")
    false = doc.get("false_per_1000_gpu_h")
    if false is not None and not (
        isinstance(false, dict)
        and false.get("direction") in DIRECTIONS
        and all(isinstance(false.get(k), (int, float, type(None))) for k in ("before", "after"))
    ):
        raise ValueError("prediction: false_per_1000_gpu_h must be {before, after, direction}")
    if not isinstance(doc.get("gpu_hours", 0), (int, float)) or not isinstance(
        doc.get("recordings", []), list
    ):
        raise ValueError("prediction: gpu_hours must be a number and recordings a list")
    return doc


def _cell(x: Any) -> str:
    return "–" if x is None else f"{x:g}" if isinstance(x, float) else str(x)


def markdown(doc: dict[str, Any]) -> str:
    m, before, after = doc["meta"], doc["before"], doc["after"]
    out = [
        "# Alert tuning, before and after (`goodput bench tuning`)",
        "",
        f"The fault benchmark run twice on the same {m['runs']} runs ({m['simulated_hours']} "
        f"simulated hours each{', --quick' if m['quick'] else ''}), in {m['wall_s']:g} s wall: "
        f"**before** = `{before['file']}` ({before['sha256']}), **after** = `{after['file']}` "
        f"({after['sha256']}). Latency = fault onset → first firing alert (5 s samples).",
        "",
        "| fault kind | detected | latency p50 (s) | latency p95 (s) | outcome accuracy | "
        "culprit precision | culprit recall | GPU-h lost (mean) | latency moved | "
        "notebook predicted | as predicted |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, r in doc["per_kind"].items():
        pair = [f"{_cell(r[f]['before'])} → {_cell(r[f]['after'])}" for f in KIND_FIGURES]
        verdict = {None: "–", True: "yes", False: "**no**"}[r["as_predicted"]]
        out.append(
            f"| {kind} | {' | '.join(pair)} | {r['latency_moved']} | "
            f"{r['latency_predicted'] or '–'} | {verdict} |"
        )
    out += ["", "| overall | before | after |", "|---|---|---|"]
    out += [
        f"| {f} | {_cell(v['before'])} | {_cell(v['after'])} |" for f, v in doc["overall"].items()
    ]
    fi = doc["false_incidents"]
    out += [
        "",
        f"False incidents on healthy load: {fi['before']} before, {fi['after']} after, in "
        f"{fi['healthy_gpu_hours']} healthy GPU-hours; destructive actions on healthy jobs: "
        f"{fi['destructive_before']} before, {fi['destructive_after']} after.",
    ]
    pred = doc.get("prediction") or {}
    f = pred.get("false_per_1000_gpu_h")
    if f:
        out += [
            "",
            f"The notebook predicted from {pred.get('gpu_hours', 0):.0f} GPU-hours of recordings "
            f"({', '.join(pred.get('recordings', []))}): false incidents per 1,000 GPU-hours "
            f"{_cell(f['before'])} → {_cell(f['after'])} ({f['direction']}); per fault kind, "
            "the latency direction in the table (– where it recorded no such fault).",
        ]
    return "\n".join(out) + "\n"


def write(doc: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "tuning.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (out / "tuning.md").write_text(markdown(doc))

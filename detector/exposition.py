"""The detector's scores as Prometheus exposition text, rendered once per cycle (bounded).

Per GPU one series, the combined score (max over detectors), plus the detector that drives it
only while the GPU is at or over its alert level; per job and per (job, node) the score of every
detector; per (job, node) the suspect score; per job inside a pause its allowance, and its
fitted step time. Label values reach here validated (job and node patterns, integer GPU
indexes; detector names are code), so they need no escaping.

Rendering is a join of per-series label prefixes and numbers: the prefixes are built once and
kept while a family's label columns equal the last cycle's (steady state), the numbers are
formatted by orjson in one call (shortest round-trip, as Prometheus parses them).
"""

from __future__ import annotations

from itertools import chain, repeat

import numpy as np
import orjson

from detector.pipeline import Result


def gauge(name: str) -> str:
    """Declares a gauge family rendered here (the contract test finds emitters by such calls)."""
    return name


GPU = gauge("goodput_gpu_anomaly_score")
DRIVER = gauge("goodput_gpu_anomaly_driver_score")
JOB = gauge("goodput_job_anomaly_score")
NODE = gauge("goodput_node_anomaly_score")
SUSPECT = gauge("goodput_node_suspect_score")
PAUSE = gauge("goodput_job_pause_allowance_seconds")
STEP = gauge("goodput_job_baseline_iteration_seconds")
BUSY = gauge("goodput_job_baseline_gpu_utilization_percent")
LEARNED = {"iteration_seconds": STEP, "gpu_utilization_percent": BUSY}  # `Result.learned`

HELP = {
    GPU: "Per-GPU combined anomaly score (max over detectors); 1.0 is the nominal alarm level.",
    DRIVER: "Score of the detector that drives a GPU's combined score, only while the GPU is "
    "at or over its alert level.",
    JOB: "Per-job anomaly score per detector (detector=combined is the max).",
    NODE: "Per job and node, each detector's max over the node's GPUs.",
    SUSPECT: "How strongly a node is suspected in a job; 1.0 = threshold.",
    PAUSE: "How long the job may pause where its log announces a pause (start-up work, a "
    "save) before it counts as stuck: the GPU model's allowance, or a multiple of the job's "
    "own longest pause.",
    STEP: "The job's typical iteration time as the detector learned it (its own calm steps, or "
    "its stored baseline by name): the reference of its pace (step-time slowdown) score.",
    BUSY: "The job's typical GPU utilisation (%) while busy as the detector learned it (its own "
    "calm samples, or its stored baseline by name).",
}


def job_series(res: Result) -> dict[str, dict[str, np.ndarray]]:
    """The per-job gauges of a cycle by family name, {job_id, value} each: the pause
    allowance of the jobs inside a pause, then what the detectors learned of each job."""
    out = {}
    if res.pause_cols:
        out[PAUSE] = res.pause_cols
    return out | {LEARNED[key]: cols for key, cols in res.learned.items()}


def family(name: str, help_text: str, kind: str = "gauge") -> str:
    """The HELP/TYPE header of one family."""
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"


def numbers(values: np.ndarray) -> list[str]:
    """Exposition-format numbers (NaN, +Inf, -Inf spelled as Prometheus reads them)."""
    out = [repr(v) for v in np.asarray(values, dtype=float).tolist()]
    if not np.isfinite(values).all():
        special = {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf"}
        out = [special.get(s, s) for s in out]
    return out


def _numbers(values: np.ndarray) -> list[bytes]:
    v = np.ascontiguousarray(values, dtype=np.float64)
    if not len(v):
        return []
    if np.isfinite(v).all():  # orjson writes NaN and Inf as null: those take `numbers`
        return orjson.dumps(v, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].split(b",")
    return [x.encode() for x in numbers(v)]


def gpu_combined(res: Result) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(frame rows on a job, their combined score = max over detectors, the index of the
    detector that drives it): what `goodput_gpu_anomaly_score` exposes, for every reader."""
    codes = res.frame.job_codes[0]
    on = np.flatnonzero(res.frame.job_named[codes]) if len(codes) else np.zeros(0, dtype=np.int64)
    scores = res.gpu[on] if len(on) else np.zeros((0, len(res.detectors)))
    if not scores.shape[1]:
        return on, np.zeros(len(on)), np.zeros(len(on), dtype=np.int64)
    scores = np.asfortranarray(scores)  # column-major: fast row reductions (`base.row_max`)
    return on, scores.max(axis=1), scores.argmax(axis=1)


class Renderer:
    """Renders each cycle's score families (`render`), keeping the label prefixes of the last
    cycle per family (rebuilt when a family's label columns differ)."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[list[list], list[bytes]]] = {}

    def _prefixes(self, name: str, columns: list[list], fmt: str, keep: bool) -> list[bytes]:
        kept = self._kept.get(name)
        if kept is not None and kept[0] == columns:
            return kept[1]
        out = [(name + "{" + fmt.format(*v) + "} ").encode() for v in zip(*columns, strict=True)]
        if keep:
            self._kept[name] = (columns, out)
        return out

    def _lines(
        self, name: str, columns: list[list], fmt: str, values: np.ndarray, keep: bool = True
    ) -> bytes:
        if not len(values):
            return b""
        pre = self._prefixes(name, columns, fmt, keep)
        body = b"".join(chain.from_iterable(zip(pre, _numbers(values), repeat(b"\n"))))
        return family(name, HELP[name]).encode() + body

    def render(self, res: Result, gpu_level: float) -> bytes:
        """The cycle's score families as exposition text."""
        f = res.frame
        on, combined, drive = gpu_combined(res)
        gpu_cols = [f.job[on].tolist(), f.node[on].tolist(), f.gpu[on].tolist()]
        gpu_fmt = 'job_id="{}",node="{}",gpu="{}"'
        parts = [self._lines(GPU, gpu_cols, gpu_fmt, combined)]
        over = np.flatnonzero(combined >= gpu_level)
        if len(over):  # a few GPUs: not kept
            cols = [[c[i] for i in over.tolist()] for c in gpu_cols]
            cols.append([res.detectors[d] for d in drive[over].tolist()])
            fmt = gpu_fmt + ',detector="{}"'
            parts.append(self._lines(DRIVER, cols, fmt, combined[over], keep=False))
        jobs = res.job_cols
        parts.append(
            self._lines(
                JOB,
                [jobs["job_id"].tolist(), jobs["detector"].tolist()],
                'job_id="{}",detector="{}"',
                jobs["score"],
            )
        )
        for name, per_job in job_series(res).items():
            jid = per_job["job_id"].tolist()
            parts.append(self._lines(name, [jid], 'job_id="{}"', per_job["value"]))
        parts.append(self._node_detectors(res, on, res.gpu[on]))
        nodes = res.node_cols
        parts.append(
            self._lines(
                SUSPECT,
                [nodes["job_id"].tolist(), nodes["node"].tolist()],
                'job_id="{}",node="{}"',
                nodes["score"],
            )
        )
        return b"".join(parts)

    def _node_detectors(self, res: Result, on: np.ndarray, scores: np.ndarray) -> bytes:
        """Each detector's max over the GPUs of each (job, node) pair."""
        if not len(on):
            return b""
        jc, ju = res.frame.job_codes
        nc, nu = res.frame.node_codes
        pair = jc[on].astype(np.int64) * len(nu) + nc[on]
        upair, inv = np.unique(pair, return_inverse=True)
        best = np.full((len(upair), scores.shape[1]), -np.inf)
        np.maximum.at(best, inv.ravel(), scores)
        d = len(res.detectors)
        cols = [
            np.repeat(ju[upair // len(nu)], d).tolist(),
            np.repeat(nu[upair % len(nu)], d).tolist(),
            list(res.detectors) * len(upair),
        ]
        return self._lines(NODE, cols, 'job_id="{}",node="{}",detector="{}"', best.ravel())


def render(res: Result, gpu_level: float) -> bytes:
    """One cycle's score families as exposition text (nothing kept)."""
    return Renderer().render(res, gpu_level)

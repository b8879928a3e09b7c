"""The detector's scores as Prometheus exposition text, rendered once per cycle (bounded).

Per GPU one series, the combined score (max over detectors), plus the detector that drives it
only while the GPU is at or over its alert level; per job and per (job, node) the score of every
detector; per (job, node) the suspect score. Label values reach here validated (job and node
patterns, integer GPU indexes; detector names are code), so they need no escaping.
"""

from __future__ import annotations

import numpy as np

from detector.pipeline import Result


def gauge(name: str) -> str:
    """Declares a gauge family rendered here (the contract test finds emitters by such calls)."""
    return name


GPU = gauge("goodput_gpu_anomaly_score")
DRIVER = gauge("goodput_gpu_anomaly_driver_score")
JOB = gauge("goodput_job_anomaly_score")
NODE = gauge("goodput_node_anomaly_score")
SUSPECT = gauge("goodput_node_suspect_score")

HELP = {
    GPU: "Per-GPU combined anomaly score (max over detectors); 1.0 is the nominal alarm level.",
    DRIVER: "Score of the detector that drives a GPU's combined score, only while the GPU is "
    "at or over its alert level.",
    JOB: "Per-job anomaly score per detector (detector=combined is the max).",
    NODE: "Per job and node, each detector's max over the node's GPUs.",
    SUSPECT: "How strongly a node is suspected in a job; 1.0 = threshold.",
}


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


def _lines(name: str, labels: list[str], values: np.ndarray) -> str:
    if not labels:
        return ""
    body = "".join(f"{name}{{{lab}}} {v}\n" for lab, v in zip(labels, numbers(values), strict=True))
    return family(name, HELP[name]) + body


def gpu_combined(res: Result) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(frame rows on a job, their combined score = max over detectors, the index of the
    detector that drives it): what `goodput_gpu_anomaly_score` exposes, for every reader."""
    on = np.flatnonzero(res.frame.job != "")
    scores = res.gpu[on] if len(on) else np.zeros((0, len(res.detectors)))
    if not scores.shape[1]:
        return on, np.zeros(len(on)), np.zeros(len(on), dtype=np.int64)
    return on, scores.max(axis=1), scores.argmax(axis=1)


def render(res: Result, gpu_level: float) -> bytes:
    """The cycle's score families as exposition text."""
    f = res.frame
    on, combined, drive = gpu_combined(res)
    parts = []
    gpu_labels = [
        f'job_id="{j}",node="{n}",gpu="{g}"'
        for j, n, g in zip(f.job[on].tolist(), f.node[on].tolist(), f.gpu[on].tolist(), strict=True)
    ]
    parts.append(_lines(GPU, gpu_labels, combined))
    over = np.flatnonzero(combined >= gpu_level)
    if len(over):
        names = [res.detectors[d] for d in drive[over].tolist()]
        labels = [
            f'{gpu_labels[i]},detector="{d}"' for i, d in zip(over.tolist(), names, strict=True)
        ]
        parts.append(_lines(DRIVER, labels, combined[over]))
    jobs = res.jobs
    parts.append(
        _lines(
            JOB,
            [
                f'job_id="{j}",detector="{d}"'
                for j, d in zip(jobs["job_id"].tolist(), jobs["detector"].tolist(), strict=True)
            ],
            jobs["score"].to_numpy(dtype=float),
        )
    )
    parts.append(_node_detectors(res, on, res.gpu[on]))
    nodes = res.nodes
    parts.append(
        _lines(
            SUSPECT,
            [
                f'job_id="{j}",node="{n}"'
                for j, n in zip(nodes["job_id"].tolist(), nodes["node"].tolist(), strict=True)
            ],
            nodes["score"].to_numpy(dtype=float),
        )
    )
    return "".join(parts).encode()


def _node_detectors(res: Result, on: np.ndarray, scores: np.ndarray) -> str:
    """Each detector's max over the GPUs of each (job, node) pair."""
    if not len(on):
        return ""
    jc, ju = res.frame.job_codes
    nc, nu = res.frame.node_codes
    pair = jc[on].astype(np.int64) * len(nu) + nc[on]
    upair, inv = np.unique(pair, return_inverse=True)
    best = np.full((len(upair), scores.shape[1]), -np.inf)
    np.maximum.at(best, inv.ravel(), scores)
    jobs, nodes = ju[upair // len(nu)].tolist(), nu[upair % len(nu)].tolist()
    dets = list(res.detectors)
    labels = [
        f'job_id="{j}",node="{n}",detector="{d}"'
        for j, n in zip(jobs, nodes, strict=True)
        for d in dets
    ]
    return _lines(NODE, labels, best.ravel())

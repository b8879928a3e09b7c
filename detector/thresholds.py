"""The alert-worthy level of each score, read from the single source of alert conditions
(`alertmanager/alerts.yaml` through `alertdsl.spec`; `$GOODPUT_ALERTS_FILE` overrides the
path, as for the tuning tools), so tuning changes one file.

Scores are calibrated so that 1.0 is every detector's nominal alarm level; the alerts' own
thresholds start there and are tuned (`notebooks/tune_detector.ipynb`), so anything that flags a
detection (replay's reasons, the default `--min-score`) asks here instead of assuming 1.0.
"""

from __future__ import annotations

from functools import lru_cache

from alertdsl import spec as A

# which alert watches which score (detector names as in the engine's Result)
ALERT_OF = {
    "job": "GoodputJobAnomaly",  # goodput_job_anomaly_score{detector="combined"}
    "progress": "GoodputJobHung",  # goodput_job_anomaly_score{detector="progress"}
    "pace": "GoodputJobSlow",  # goodput_job_anomaly_score{detector="pace"}
    "node": "GoodputJobStraggler",  # goodput_node_suspect_score
    "gpu": "GoodputGPUAnomaly",  # goodput_gpu_anomaly_score
}


@lru_cache(maxsize=8)
def levels(path: str | None = None) -> dict[str, float]:
    """{"job", "progress", "pace", "node", "gpu"} -> threshold from alerts.yaml (cached per
    path)."""
    spec = A.load(path)
    return {kind: float(A.threshold(name, spec)) for kind, name in ALERT_OF.items()}


def level(kind: str, path: str | None = None) -> float:
    """The alert-worthy score of `kind` ("job", "progress", "pace", "node" or "gpu")."""
    if kind not in ALERT_OF:
        raise KeyError(f"unknown score kind {kind!r}; want one of {sorted(ALERT_OF)}")
    return levels(path or str(A.configured_path()))[kind]

"""What the detector learned of a job, exported per job: its step time
(`goodput_job_baseline_iteration_seconds`, the reference of the pace score) and its busy GPU
utilisation (`goodput_job_baseline_gpu_utilization_percent`), for the attribution to compare
a restart that is slow from its first step with (docs/contracts.md)."""

from __future__ import annotations

import numpy as np
import pytest

from detector import fields as F
from detector.baselines import BaselineStore
from detector.exposition import BUSY, STEP, render
from detector.pipeline import Config, Engine, Result
from detector.synthetic import healthy_frame

JOB, NAME = "100", "trainer"


def _run(eng: Engine, t0: float, seconds: float, step_s: float, job: str = JOB) -> list[Result]:
    """One 1-node job training at `step_s` a step, seen every 5 s from `t0`."""
    return [
        eng.step(
            healthy_frame(
                jobs=1, nodes=1, steps=1, seed=int(t), start=t, step_s=step_s, first_job=int(job)
            ),
            t,
            {job: NAME},
        )  # fmt: skip
        for t in np.arange(t0, t0 + seconds, 5.0)
    ]


def _exported(res: Result, key: str = "iteration_seconds") -> dict[str, float]:
    cols = res.learned[key]
    return dict(zip(cols["job_id"].tolist(), cols["value"].tolist(), strict=True))


def test_exported_once_fitted_then_carried_to_a_restart_by_name(tmp_path) -> None:
    eng = Engine(Config(interval_s=5.0), BaselineStore(tmp_path))
    first = _run(eng, 0.0, 600.0, step_s=0.5)
    assert _exported(first[0]) == {}  # nothing learned yet: nothing to compare with
    assert _exported(first[-1])[JOB] == pytest.approx(0.5, rel=0.02)
    util = np.concatenate([r.frame.col(F.UTIL) for r in first])
    busy = _exported(first[-1], "gpu_utilization_percent")[JOB]
    assert busy == pytest.approx(np.median(util[util >= 50]), abs=1.0)
    text = render(first[-1], gpu_level=1.25).decode()
    assert f'{STEP}{{job_id="{JOB}"}} ' in text and f'{BUSY}{{job_id="{JOB}"}} ' in text
    eng.end_jobs(set())
    # a new job id with the same name, slower from its first step: its first cycle already
    # exports what the name's stored baseline learned, not its own pace
    again = _run(eng, 2000.0, 10.0, step_s=0.73, job="200")
    assert _exported(again[0])["200"] == pytest.approx(0.5, rel=0.02)
    assert _exported(again[0], "gpu_utilization_percent")["200"] == pytest.approx(busy)


def test_a_fresh_engines_cycle_with_no_samples_exports_nothing() -> None:
    """The service's first cycles before any GPU reports (an empty frame: nothing scored, so
    no detector state touched yet): nothing learned to export, and no error (the service's
    cycles failed with AttributeError 'step_' on the real stack before)."""
    empty = healthy_frame(jobs=1, nodes=1, steps=1).take(np.zeros(0, dtype=np.int64))
    res = Engine(Config(interval_s=5.0)).step(empty, 0.0, {})
    assert {k: len(v["job_id"]) for k, v in res.learned.items()} == {
        "iteration_seconds": 0,
        "gpu_utilization_percent": 0,
    }

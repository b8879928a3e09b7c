"""A job that never reaches its first iteration (issue 15): the detector's physics rule
`never_started` fires, and attribution calls it a hang at start-up (`workload_hang`, no node
named: an NCCL init hang or a bad node at rendezvous shows on no GPU), not `unknown`. Before
the `job_never_started` rule, `job_idle` was the only idle-job rule: it wants GPUs that worked
first and is suppressed while a pause (the announced start-up) is open, so the case went to a
person. The detector's score is what judges the start-up allowance (per GPU model, short after
the log's start-up milestone, long while start-up work such as a checkpoint load is open:
catalogue/priors.yaml): a start-up it does not score over 1.0 is no hang."""

from __future__ import annotations

import pytest

from bench import faults as B
from bench import faults_plan as P
from recovery import attribution
from recovery.evidence import Bundle, Context, LogLine, Report, Series

pytestmark = pytest.mark.filterwarnings("ignore")

START = 1_735_689_600.0
STEP = 5.0
N = 16  # 80 s of samples from the job's start
STARTUP = [
    "> building GPT model ...",
    " loading checkpoint from /ckpt at iteration 100",  # a long load before the first step
]


def _job(gpus: int, score: float, iterating: bool = False) -> list[Series]:
    """A one-node job idle since its start with its memory held (the start-up the log
    announced), the detector scoring each GPU `score`; `iterating`: its counter advances."""

    def s(name: str, vals: list[float], gpu: int | None) -> Series:
        pts = [(START + STEP * i, v) for i, v in enumerate(vals)]
        return Series(name, pts, node="node1", gpu=None if gpu is None else str(gpu), job_id="7")

    out = []
    for g in range(gpus):
        out += [
            s("DCGM_FI_DEV_GPU_UTIL", [0.0] * N, g),
            s("DCGM_FI_PROF_SM_ACTIVE", [0.0] * N, g),
            s("DCGM_FI_DEV_FB_USED", [2600.0] * N, g),  # CUDA context + NCCL buffers
            s("goodput_gpu_anomaly_score", [score * i / (N - 1) for i in range(N)], g),
        ]
    it = [float(i if iterating and i > N // 2 else 0) for i in range(N)]
    return [*out, s("goodput_job_iteration", it, None)]


def _doc(series: list[Series]) -> dict:
    lines = [LogLine("job.log", i + 1, t, time=START + i) for i, t in enumerate(STARTUP)]
    bundle = Bundle(
        series=series,
        lines=lines,
        reports=[Report("prometheus", "ok"), Report("logs", "ok"), Report("slurm", "ok")],
    )
    ctx = Context(job_id="7", nodes=["node1"], start=START, end=START + STEP * N)
    return attribution.attribute(bundle, ctx)


@pytest.mark.parametrize("gpus", [1, 8])
def test_a_start_up_the_detector_scores_over_its_allowance_is_a_hang(gpus: int) -> None:
    doc = _doc(_job(gpus, score=1.6))
    assert doc["outcome"] == "workload_hang"
    assert doc["affected_nodes"] == []  # nothing localises it: no node is drained
    assert any(s["id"] == "job_never_started" for s in doc["symptoms"])


def test_a_long_start_up_within_the_detectors_allowance_is_no_hang() -> None:
    assert _doc(_job(8, score=0.8))["outcome"] != "workload_hang"


def test_a_job_that_began_iterating_is_not_never_started() -> None:
    doc = _doc(_job(1, score=1.6, iterating=True))
    assert not any(s["id"] == "job_never_started" for s in doc["symptoms"])


def test_a_job_that_trained_before_the_window_is_not_never_started() -> None:
    """Idle through the whole window after iterating before it (a long idle hang): its
    counter is frozen at 5000, so the job started; job_idle's rules judge it, not this one."""
    series = [s for s in _job(1, score=1.6) if s.name != "goodput_job_iteration"]
    frozen = Series("goodput_job_iteration", [(START + STEP * i, 5000.0) for i in range(N)])
    doc = _doc([*series, frozen])
    assert not any(s["id"] == "job_never_started" for s in doc["symptoms"])


def test_without_the_detectors_score_the_rule_is_silent() -> None:
    series = [s for s in _job(1, score=1.6) if s.name != "goodput_gpu_anomaly_score"]
    assert _doc(series)["outcome"] != "workload_hang"


# ------------------------------------------------- through the fault benchmark's receiver path


@pytest.mark.parametrize("scenario", ["never-started-1gpu", "never-started-1node"])
def test_never_started_scenarios_are_a_hang_requeued_without_a_culprit(scenario: str) -> None:
    spec = next(r for r in P.plan_cold(seeds=1, pattern=scenario) if not r.healthy)
    (fault,) = B.run_one(spec)["faults"]
    assert fault["detected"]
    assert (fault["outcome"], fault["nodes"]) == ("workload_hang", [])
    assert fault["action"] == "requeue" and fault["result"] == "executed"


def test_healthy_jobs_with_long_start_ups_open_no_incident(monkeypatch) -> None:  # noqa: ANN001
    """healthy-small with long quiet start-ups (25 s and 60 s from process start to its first
    start-up line, as a slow import or CUDA init would be): no incident."""
    spec = next(r for r in P.plan_cold(seeds=1, pattern="healthy-small"))
    plain = P.scenario_for

    def slow_start(spec: P.RunSpec, directory=None):  # noqa: ANN001, ANN202
        sc = plain(spec, directory)
        jobs = [
            j.model_copy(update={"init_s": 25.0 if j.gpus_per_node == 1 else 60.0}) for j in sc.jobs
        ]
        return sc.model_copy(update={"jobs": jobs, "duration_s": 400.0})

    monkeypatch.setattr(B, "scenario_for", slow_start)
    assert B.run_one(spec)["incidents"] == []


def test_a_long_checkpoint_load_before_the_first_step_opens_no_incident() -> None:
    """The false-alarm guard (scenarios/cold-start/healthy-ckpt-load): a 1-GPU job loading its
    checkpoint for 150 s and a 1-node job for 240 s before their first steps, GPUs idle with
    memory held, the log saying 'loading checkpoint'. Fails on the code before: one start-up
    allowance (30 s + 15 s per doubling) from the last start-up line, whatever it said: four
    false incidents, all destructive (requeue, stop)."""
    (spec,) = P.plan_cold(seeds=1, pattern="healthy-ckpt-load")
    assert B.run_one(spec)["incidents"] == []

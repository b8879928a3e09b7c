"""A job stalled inside a pause its log announced (a checkpoint load before the first step, a
save after progress) past the detector's allowance for it: `workload_hang` at a confidence
under the policy's requeue threshold, so a person decides with the pause line as evidence
(pause_overrun, recovery/rules). A restart would redo the same load or save: the cold-start
benchmark's healthy 15-minute load was requeued (a destructive false action) and a 14-minute
save was `unknown` with nothing but the stall. The same stall with no pause open is still a
hang that is requeued."""

from __future__ import annotations

import pytest

from recovery import attribution, decide, ruleset
from recovery.attribution.model import RULES_DIR
from recovery.evidence import Bundle, Context, LogLine, Report, Series
from recovery.policy import Policy

START = 1_735_689_600.0
STEP = 5.0
N = 40  # 200 s of samples
LOAD = " loading checkpoint from /ckpt at iteration 100"
SAVE = "saving checkpoint at iteration     100 to /ckpt"
MILESTONE = "training ..."


def _series(trained: bool) -> list[Series]:
    """One node of 8 GPUs idle with memory held through the window, the detector scoring them
    over the alert level from its middle; `trained`: it iterated before (frozen at 100, its
    last progress 10 s before the window), else never."""

    def s(name: str, vals: list[float], gpu: int | None) -> Series:
        pts = [(START + STEP * i, v) for i, v in enumerate(vals)]
        return Series(name, pts, node="node1", gpu=None if gpu is None else str(gpu), job_id="7")

    out = []
    for g in range(8):
        out += [
            s("DCGM_FI_DEV_GPU_UTIL", [0.0] * N, g),
            s("DCGM_FI_PROF_SM_ACTIVE", [0.0] * N, g),
            s("DCGM_FI_DEV_FB_USED", [60_000.0] * N, g),
            s("goodput_gpu_anomaly_score", [0.0 if i < N // 2 else 1.6 for i in range(N)], g),
        ]
    it = 100.0 if trained else 0.0
    out.append(s("goodput_job_iteration", [it] * N, None))
    if trained:
        last = START - 10.0
        out.append(s("goodput_job_last_progress_timestamp_seconds", [last] * N, None))
    return out


def _doc(series: list[Series], lines: list[str]) -> dict:
    bundle = Bundle(
        series=series,
        lines=[LogLine("job.log", i + 1, t, time=START - 5 + i) for i, t in enumerate(lines)],
        reports=[Report("prometheus", "ok"), Report("logs", "ok"), Report("slurm", "ok")],
    )
    ctx = Context(job_id="7", nodes=["node1"], start=START, end=START + STEP * N)
    return attribution.attribute(bundle, ctx)


def _action(doc: dict) -> decide.Action:
    d = decide.Diagnosis.from_dict({**doc, "incident_id": 1})
    return decide.decide(d, decide.History(now=START + STEP * N), Policy(mode="act"))


@pytest.mark.parametrize(
    ("lines", "trained"),
    [([MILESTONE, LOAD], False), ([MILESTONE, SAVE], True)],
    ids=["load before the first step", "save after progress"],
)
def test_a_stall_inside_an_announced_pause_goes_to_a_person(lines: list[str], trained: bool):
    doc = _doc(_series(trained), lines)
    assert doc["outcome"] == "workload_hang" and doc["affected_nodes"] == []
    (sym,) = [s for s in doc["symptoms"] if s["id"] == "pause_overrun"]
    assert sym["role"] == "initiating" and lines[-1].strip() in sym["detail"]
    assert doc["confidence"] < Policy().min_confidence["requeue"]
    action = _action(doc)
    assert action.kind == "hold_for_person" and "low_confidence" in action.reasons


@pytest.mark.parametrize(
    "lines", [[MILESTONE], ["> building GPT model ...", MILESTONE]], ids=["milestone", "after work"]
)
def test_the_same_stall_with_no_pause_open_is_requeued(lines: list[str]) -> None:
    """After the start-up milestone (a first step that never comes: an NCCL init hang) nothing
    says the job is busy elsewhere: a hang, requeued as before. The milestone ends the
    start-up work announced before it (the simulator's never-started jobs were held for a
    person while `> building GPT model ...` counted as open)."""
    doc = _doc(_series(trained=False), lines)
    assert doc["outcome"] == "workload_hang" and doc["confidence"] >= 0.7
    assert not any(s["id"] == "pause_overrun" for s in doc["symptoms"])
    assert _action(doc).kind == "requeue"


def test_a_pause_that_ended_is_no_overrun() -> None:
    """Progress after the save line: the save ended; the stall after it is no overrun."""
    lines = [SAVE, "successfully saved checkpoint from iteration     100 to /ckpt"]
    doc = _doc(_series(trained=True), lines)
    assert not any(s["id"] == "pause_overrun" for s in doc["symptoms"])


def test_stalls_must_name_earlier_metric_rules(tmp_path) -> None:
    for f in RULES_DIR.glob("*.yaml"):
        (tmp_path / f.name).write_text(f.read_text())
    path = tmp_path / "symptoms.yaml"
    old = "stalls: [job_never_started, progress_stall]"
    path.write_text(path.read_text().replace(old, "stalls: [slowdown]"))
    with pytest.raises(ruleset.RuleError, match="stalls 'slowdown' names no metric rule before"):
        ruleset.load(tmp_path)

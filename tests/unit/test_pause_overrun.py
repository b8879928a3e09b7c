"""A job stalled inside a checkpoint load or save its log announced, past the detector's pause
allowance for it: `workload_hang` at a confidence under the policy's requeue threshold, so a
person decides with the pause line as evidence (pause_overrun, recovery/rules). A restart
would redo the same load or save: the cold-start benchmark's healthy 15-minute load was
requeued (a destructive false action) and a 14-minute save was `unknown` with nothing but the
stall. The same stall with no such pause open (after the start-up milestone, or inside
start-up work where NCCL init hangs) is still a hang that is requeued, and a fault that comes
before the allowance ran out is the root cause."""

from __future__ import annotations

import pytest

from recovery import attribution, decide, ruleset
from recovery.attribution.model import RULES_DIR, load_rules
from recovery.evidence import Bundle, Context, LogLine, Report, Series
from recovery.policy import Policy

START = 1_735_689_600.0
STEP = 5.0
N = 60  # 300 s of samples
ALLOWANCE = 120.0  # the detector's pause allowance for the job, exported while a pause is open
LOAD = " loading checkpoint from /ckpt at iteration 100"
SAVE = "saving checkpoint at iteration     100 to /ckpt"
MILESTONE = "training ..."
PAUSE = "goodput_job_pause_allowance_seconds"


def s(name: str, vals: list[float], gpu: int | None = None) -> Series:
    pts = [(START + STEP * i, v) for i, v in enumerate(vals)]
    return Series(name, pts, node="node1", gpu=None if gpu is None else str(gpu), job_id="7")


def _series(trained: bool, allowance: float | None = ALLOWANCE) -> list[Series]:
    """One node of 8 GPUs idle with memory held through the window, the detector scoring them
    over the alert level from its middle; `trained`: it iterated before (frozen at 100, its
    last progress 10 s before the window), else never; `allowance`: the pause allowance the
    detector exported (None: the detector was down)."""
    out = []
    for g in range(8):
        out += [
            s("DCGM_FI_DEV_GPU_UTIL", [0.0] * N, g),
            s("DCGM_FI_PROF_SM_ACTIVE", [0.0] * N, g),
            s("DCGM_FI_DEV_FB_USED", [60_000.0] * N, g),
            s("goodput_gpu_anomaly_score", [0.0 if i < N // 2 else 1.6 for i in range(N)], g),
        ]
    it = 100.0 if trained else 0.0
    out.append(s("goodput_job_iteration", [it] * N))
    if trained:
        out.append(s("goodput_job_last_progress_timestamp_seconds", [START - 10.0] * N))
    if allowance is not None:
        out.append(s(PAUSE, [allowance] * N))
    return out


def _doc(series: list[Series], lines: list[str], samples: int = N) -> dict:
    """The diagnosis on the first `samples` samples, the log's lines just before them."""
    cut = [Series(x.name, x.points[:samples], x.node, x.gpu, x.job_id) for x in series]
    bundle = Bundle(
        series=cut,
        lines=[LogLine("job.log", i + 1, t, time=START - 5 + i) for i, t in enumerate(lines)],
        reports=[Report("prometheus", "ok"), Report("logs", "ok"), Report("slurm", "ok")],
    )
    ctx = Context(job_id="7", nodes=["node1"], start=START, end=START + STEP * samples)
    return attribution.attribute(bundle, ctx)


def _action(doc: dict) -> decide.Action:
    d = decide.Diagnosis.from_dict({**doc, "incident_id": 1})
    return decide.decide(d, decide.History(now=START + STEP * N), Policy(mode="act"))


def _overrun(doc: dict) -> list[dict]:
    return [x for x in doc["symptoms"] if x["id"] == "pause_overrun"]


@pytest.mark.parametrize(
    ("lines", "trained"),
    [([MILESTONE, LOAD], False), ([MILESTONE, SAVE], True)],
    ids=["load before the first step", "save after progress"],
)
def test_a_stall_inside_an_announced_pause_goes_to_a_person(lines: list[str], trained: bool):
    doc = _doc(_series(trained), lines)
    assert doc["outcome"] == "workload_hang" and doc["affected_nodes"] == []
    (sym,) = _overrun(doc)
    assert sym["role"] == "initiating" and lines[-1].strip() in sym["detail"]
    assert sym["first_seen"] == START - 4 + ALLOWANCE  # the line's time + its allowance
    assert doc["root_cause"].startswith(f"workload hang: {sym['detail'][:40]}")  # not the stall
    assert doc["confidence"] < Policy().min_confidence["requeue"]
    action = _action(doc)
    assert action.kind == "hold_for_person" and "low_confidence" in action.reasons


def test_no_overrun_until_the_allowance_has_run_out() -> None:
    """The same load seen only up to 100 s after its line (allowance 120 s): not yet."""
    doc = _doc(_series(trained=False), [MILESTONE, LOAD], samples=20)
    assert not _overrun(doc)


def test_without_the_detectors_allowance_the_default_applies() -> None:
    """No exported allowance (the detector down): 600 s, the priors' default; 300 s of a load
    is no overrun."""
    doc = _doc(_series(trained=False, allowance=None), [MILESTONE, LOAD])
    assert not _overrun(doc)


@pytest.mark.parametrize(
    "lines",
    [
        [MILESTONE],
        ["> building GPT model ...", MILESTONE],
        ["> initializing torch distributed ..."],
    ],
    ids=["milestone", "after start-up work", "inside start-up work"],
)
def test_the_same_stall_with_no_checkpoint_pause_open_is_requeued(lines: list[str]) -> None:
    """After the start-up milestone (it ends the start-up work before it), or inside start-up
    work (where NCCL init and rendezvous hang, and a restart may get past it): a hang,
    requeued as before."""
    doc = _doc(_series(trained=False), lines)
    assert doc["outcome"] == "workload_hang" and doc["confidence"] >= 0.7
    assert not _overrun(doc)
    assert _action(doc).kind == "requeue"


def test_a_pause_that_ended_is_no_overrun() -> None:
    """Progress after the save line, in the log or in the job's progress metrics: the save
    ended; the stall after it is no overrun."""
    lines = [SAVE, "successfully saved checkpoint from iteration     100 to /ckpt"]
    assert not _overrun(_doc(_series(trained=True), lines))
    series = [x for x in _series(trained=True) if x.name != "goodput_job_iteration"]
    series.append(s("goodput_job_iteration", [100.0 + min(i, 12) for i in range(N)]))
    assert not _overrun(_doc(series, [SAVE]))


def test_a_fault_before_the_allowance_ran_out_is_the_root_cause() -> None:
    """XID 79 on a GPU 60 s into the save (allowance 120 s): the GPU fell off the bus, its node
    named, not a stall held for a person."""
    xid = s("DCGM_FI_DEV_XID_ERRORS", [79.0 if i >= 12 else 0.0 for i in range(N)], 3)
    doc = _doc([*_series(trained=True), xid], [MILESTONE, SAVE])
    assert doc["outcome"] == "gpu_hardware_fault" and doc["affected_nodes"] == ["node1"]


def test_the_rule_stays_under_the_requeue_threshold_with_every_source() -> None:
    """Base confidence + 0.05 per further source of its triggers (log, metrics, Slurm) stays
    under the default requeue threshold: the rule can never requeue by corroboration alone."""
    (rule,) = [r for r in load_rules().outcomes if r.get("symptoms") == ["pause_overrun"]]
    assert rule["confidence"] + 0.05 * 2 < Policy().min_confidence["requeue"]


def test_overrun_rules_are_checked(tmp_path) -> None:
    for f in RULES_DIR.glob("*.yaml"):
        (tmp_path / f.name).write_text(f.read_text())
    path = tmp_path / "symptoms.yaml"
    text = path.read_text()
    path.write_text(
        text.replace("stalls: [job_never_started, progress_stall]", "stalls: [slowdown]")
    )
    with pytest.raises(ruleset.RuleError, match="stalls 'slowdown' names no metric rule before"):
        ruleset.load(tmp_path)
    path.write_text(text.replace("pauses: [checkpoint_start]", "pauses: [training_start]"))
    with pytest.raises(ruleset.RuleError, match=r"pauses \['training_start'\]: no catalogue"):
        ruleset.load(tmp_path)
    path.write_text(text)
    outcomes = tmp_path / "outcomes.yaml"
    outcomes.write_text(
        outcomes.read_text().replace("headline: pause_overrun", "headline: progress_stall")
    )
    with pytest.raises(ruleset.RuleError, match="headline 'progress_stall' is none of its"):
        ruleset.load(tmp_path)

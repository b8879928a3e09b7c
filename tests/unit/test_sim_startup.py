"""The simulated job's start-up follows the measured one (failures.md, the real H200 trace):
the launcher's lines at once, the start-up lines just before the first step (0.3-0.5 s on the
H200), and, when it resumes from a checkpoint it loads, `loading checkpoint` between them with
the GPUs idle and memory held. Fails on the code before: every start-up line, `training ...`
included, came at submission, and there was no checkpoint load."""

from __future__ import annotations

import re

import pytest

import catalogue
from exporters.logmetrics.parser import LogState
from exporters.sim import ScenarioError, parse_scenario
from exporters.sim.gpu import INDEX
from exporters.sim.logs import LogSink
from exporters.sim.runner import Simulation

STEP = re.compile(r"\] iteration +(\d+)/")  # a Megatron progress line
JOB = {
    "name": "resume",
    "nodes": 1,
    "gpus_per_node": 1,
    "step_time_s": 1.0,
    "warmup_s": 0,
    "log_interval": 1,
}


def _sim(**job: float) -> tuple[Simulation, LogSink]:
    sc = parse_scenario({"name": "t", "duration_s": 600, "nodes": 1, "jobs": [JOB | job]})
    sink = LogSink()
    return Simulation(sc, sink=sink), sink


def _gpu(sim: Simulation) -> dict[str, float]:
    g = sim.cluster.nodes["node1"].gpus[0]
    return {k: g.values[INDEX[k]] for k in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED")}


def test_start_up_lines_come_just_before_the_first_step() -> None:
    sim, sink = _sim(init_s=12.0)
    sim.step(5.0)
    (log,) = sink.jobs.values()
    assert log[0].startswith("+ srun") and not any("NCCL INFO" in x for x in log)
    sim.step(5.0)
    assert not any(x == "training ..." for x in log)  # 10 s: still importing, no line
    sim.step(1.75)  # 11.75 s: past the start-up lines (11.5 s), before the first step
    assert "training ..." in log and not any(STEP.search(x) for x in log)
    sim.step(1.0)
    assert any(STEP.search(x) for x in log)


def test_a_checkpoint_load_before_the_first_step_is_logged_and_idle() -> None:
    sim, sink = _sim(init_s=12.0, load_s=60.0, resume_iter=2000)
    logs = LogState()
    for _ in range(8):  # 40 s: the load began at 11.5 s
        sim.step(5.0)
    (job_id,) = sink.jobs
    log = sink.jobs[job_id]
    assert " loading checkpoint from /checkpoints/resume at iteration 2000" in log
    assert "training ..." not in log
    g = _gpu(sim)
    assert g["DCGM_FI_DEV_GPU_UTIL"] == 0 and g["DCGM_FI_DEV_FB_USED"] >= 2048  # idle, held
    logs.feed_job(job_id, log, sim.cluster.now)
    js = logs.jobs[job_id]
    assert js.last_pause is not None and not js.last_progress  # start-up work open
    while not any(STEP.search(x) for x in log):
        sim.step(1.0)
    assert 72.0 <= sim.cluster.now - sim.cluster.start <= 74.0  # init 12 s + load 60 s
    i = log.index("training ...")
    first = next(int(m.group(1)) for x in log[i:] if (m := STEP.search(x)))
    assert first == 2001  # resumed where it saved


def test_a_resume_iteration_past_any_run_is_refused_at_load() -> None:
    """Validated at the edge: before, 10**400 loaded and the simulator's first tick raised
    OverflowError (int too large to convert to float)."""
    with pytest.raises(ScenarioError, match="resume_iter"):
        _sim(resume_iter=10**400, load_s=5.0)
    _sim(resume_iter=10**9, load_s=5.0)[0].step(5.0)


@pytest.mark.parametrize("by", ["all", "rank0"])
def test_a_save_by_rank0_leaves_the_other_ranks_spinning_in_a_barrier(by: str) -> None:
    job = JOB | {"gpus_per_node": 4, "init_s": 5.0, "checkpoint_every_s": 30.0}
    job |= {"checkpoint_s": 60.0, "checkpoint_by": by}
    sc = parse_scenario({"name": "t", "duration_s": 600, "nodes": 1, "jobs": [job]})
    sink = LogSink()
    sim = Simulation(sc, sink=sink)
    while not any("saving checkpoint" in x for log in sink.jobs.values() for x in log):
        sim.step(5.0)
    sim.step(10.0)
    gpus = sim.cluster.nodes["node1"].gpus[:4]  # the job's, rank 0 first
    util = [g.values[INDEX["DCGM_FI_DEV_GPU_UTIL"]] for g in gpus]
    power = [g.values[INDEX["DCGM_FI_DEV_POWER_USAGE"]] for g in gpus]
    assert util[0] == 0
    if by == "rank0":  # the waiting ranks: busy by util at idle-ish power (a spin)
        assert all(u == 100 for u in util[1:]) and all(p < 250 for p in power[1:])
    else:
        assert all(u == 0 for u in util[1:])


def test_an_evaluation_with_a_bar_moves_the_log_and_comes_before_a_save_due_with_it() -> None:
    """The bar's updates are progress lines to the catalogue (liveness, no step); when an
    evaluation and a save fall due together the evaluation runs first and the save right
    after it, as Megatron-LM's loop and Hugging Face's Trainer (log, evaluate, save) do."""
    job = JOB | {"gpus_per_node": 2, "init_s": 5.0, "checkpoint_every_s": 60.0}
    job |= {"checkpoint_s": 20.0, "eval_every_s": 60.0, "eval_s": 30.0, "eval_log": "bar"}
    sc = parse_scenario({"name": "t", "duration_s": 600, "nodes": 1, "jobs": [job]})
    sink = LogSink()
    sim = Simulation(sc, sink=sink)
    for _ in range(40):
        sim.step(5.0)
    (log,) = sink.jobs.values()
    bars = [i for i, x in enumerate(log) if x.startswith("Evaluating:")]
    saves = [i for i, x in enumerate(log) if "saving checkpoint" in x]
    assert bars and saves and bars[0] < saves[0]
    cat = catalogue.default()
    assert all([m.symptom for m in cat.match_line(log[i], "job")] == ["progress"] for i in bars)
    last_bar = max(i for i in bars if i < saves[0])
    assert not any(STEP.search(x) for x in log[last_bar : saves[0]])  # no step between them


@pytest.mark.parametrize("bar", ["bar", "none"])
def test_rank0_tokenises_before_the_first_step_while_the_others_spin(bar: str) -> None:
    """transformers' main_process_first: rank 0 tokenises (its GPU idle), printing the
    tokenizer's bar, a `pause` line to the catalogue (or nothing), while the other ranks wait in
    a barrier, spinning; the milestone and the first step come after it."""
    job = JOB | {"gpus_per_node": 4, "init_s": 5.0, "preprocess_s": 60.0, "preprocess_log": bar}
    sc = parse_scenario({"name": "t", "duration_s": 600, "nodes": 1, "jobs": [job]})
    sink = LogSink()
    sim = Simulation(sc, sink=sink)
    for _ in range(6):  # 30 s: tokenising since 4.5 s
        sim.step(5.0)
    (job_id,) = sink.jobs
    log = sink.jobs[job_id]
    bars = [x for x in log if x.startswith("Running tokenizer on dataset:")]
    assert len(bars) == (6 if bar == "bar" else 0) and "training ..." not in log  # every 5 s
    cat = catalogue.default()
    patterns = {tuple(m.pattern for m in cat.match_line(x, "job")) for x in bars}
    assert patterns <= {("data_preprocessing",)}
    gpus = sim.cluster.nodes["node1"].gpus[:4]
    util = [g.values[INDEX["DCGM_FI_DEV_GPU_UTIL"]] for g in gpus]
    assert util == [0, 100, 100, 100]
    while not any(STEP.search(x) for x in log):
        sim.step(1.0)
    assert 65.0 <= sim.cluster.now - sim.cluster.start <= 67.0  # init 5 s + tokenising 60 s
    assert log.index("training ...") > max((log.index(x) for x in bars), default=-1)


def test_a_first_step_that_compiles_idles_every_gpu_after_the_milestone() -> None:
    """torch.compile's first step: `training ...` is logged, then every GPU idles with its
    memory held for compile_s with nothing in the log, then the steps come."""
    job = JOB | {"gpus_per_node": 2, "init_s": 5.0, "compile_s": 60.0}
    sc = parse_scenario({"name": "t", "duration_s": 600, "nodes": 1, "jobs": [job]})
    sink = LogSink()
    sim = Simulation(sc, sink=sink)
    for _ in range(6):  # 30 s
        sim.step(5.0)
    (job_id,) = sink.jobs
    log = sink.jobs[job_id]
    assert log[-1] == "training ..." and not any(STEP.search(x) for x in log)
    gpus = sim.cluster.nodes["node1"].gpus[:2]
    assert [g.values[INDEX["DCGM_FI_DEV_GPU_UTIL"]] for g in gpus] == [0, 0]
    assert all(g.values[INDEX["DCGM_FI_DEV_FB_USED"]] >= 2048 for g in gpus)
    while not any(STEP.search(x) for x in log):
        sim.step(1.0)
    assert 65.0 <= sim.cluster.now - sim.cluster.start <= 67.0  # init 5 s + compiling 60 s

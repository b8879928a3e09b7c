"""Attribution for jobs without peers (issue 15): a 1-GPU or 1-node job that hangs (spinning,
or idle with its memory held and no pause open), or is slowed by its hardware. Before these
rules the hang rules wanted a busy peer beside an idle GPU, or several GPUs all idle, and the
straggler rules wanted peers, so every case here was `unknown`. The signatures are the H200
measurements of failures.md (training util 100 / SM 0.96; spin util 100 / SM 0.008; host stall
util 0 with memory held) and the simulator's clock-event bits."""

from __future__ import annotations

import pytest

from recovery import attribution, decide
from recovery.evidence import Bundle, Context, LogLine, Report, Series, SlurmFacts
from recovery.policy import Policy

START = 1_735_689_600.0
STEP = 5.0
N = 16  # 80 s of samples
ONSET = 6  # the fault's first sample


def _gpu(
    node: str, gpu: int, util: list[float], sm: list[float], **extra: list[float]
) -> list[Series]:
    def s(name: str, vals: list[float]) -> Series:
        pts = [(START + STEP * i, v) for i, v in enumerate(vals)]
        return Series(name, pts, node=node, gpu=str(gpu), job_id="1001")

    out = [s("DCGM_FI_DEV_GPU_UTIL", util), s("DCGM_FI_PROF_SM_ACTIVE", sm)]
    return out + [s(name, vals) for name, vals in extra.items()]


def _phase(before: float, after: float) -> list[float]:
    return [before if i < ONSET else after for i in range(N)]


def _progress(advancing: bool) -> Series:
    """The job's log-derived iteration counter: frozen from the onset unless `advancing`."""
    pts = [(START + STEP * i, float(i if advancing or i < ONSET else ONSET)) for i in range(N)]
    return Series("goodput_job_iteration", pts, job_id="1001")


def _doc(
    series: list[Series], lines: list[LogLine] | None = None, nodes: list[str] | None = None
) -> dict:
    """The diagnosis; `nodes`: the job's node list as Slurm gives it (none: Slurm said none)."""
    bundle = Bundle(
        series=series,
        lines=lines or [],
        slurm=SlurmFacts(job={"job_id": "1001", "nodes": nodes} if nodes else {}),
        reports=[Report("prometheus", "ok"), Report("logs", "ok"), Report("slurm", "ok")],
    )
    ctx = Context(job_id="1001", nodes=["node1"], start=START, end=START + STEP * N)
    return attribution.attribute(bundle, ctx)


# ------------------------------------------------------------------ spinning, nobody idle


def test_one_gpu_spinning_without_progress_is_a_hang_on_its_node() -> None:
    """Nothing points at the hardware (a kernel busy-waits), but the job's only node and GPU
    are the suspects a restart avoids: a workload verdict, requeued elsewhere, not drained."""
    doc = _doc([*_gpu("node1", 0, _phase(100, 100), _phase(0.96, 0.008)), _progress(False)])
    assert doc["outcome"] == "workload_hang" and doc["category"] == "workload"
    assert doc["affected_nodes"] == ["node1"]
    assert [(g["node"], g["gpu"]) for g in doc["affected_gpus"]] == [("node1", "0")]
    assert any(s["id"] == "job_spin" and s["role"] == "initiating" for s in doc["symptoms"])


def test_one_node_all_spinning_is_a_hang_on_the_node_not_a_gpu() -> None:
    series = [x for g in range(8) for x in _gpu("node1", g, _phase(100, 100), _phase(0.96, 0.01))]
    doc = _doc([*series, _progress(False)])
    assert doc["outcome"] == "workload_hang" and doc["affected_nodes"] == ["node1"]
    assert doc["affected_gpus"] == []


def test_spin_signature_while_the_job_progresses_is_no_hang() -> None:
    doc = _doc([*_gpu("node1", 0, _phase(100, 100), _phase(0.96, 0.008)), _progress(True)])
    assert doc["outcome"] != "workload_hang"


def test_two_node_job_all_spinning_is_left_to_the_peer_rules() -> None:
    """Every rank of a multi-node job spinning is a collective waiting on something the GPUs
    do not show (the network, a rank's host): not called a hang by this rule."""
    series = [
        x
        for n in ("node1", "node2")
        for g in range(2)
        for x in _gpu(n, g, _phase(100, 100), _phase(0.96, 0.01))
    ]
    doc = _doc([*series, _progress(False)])
    assert doc["outcome"] != "workload_hang"


# ------------------------------------------------------------------ idle, memory held


def _idle_gpu(fb_after: float = 60_000) -> list[Series]:
    return _gpu(
        "node1",
        0,
        _phase(100, 0),
        _phase(0.96, 0.0),
        DCGM_FI_DEV_FB_USED=_phase(60_000, fb_after),
    )


def test_one_gpu_idle_with_memory_held_is_a_hang() -> None:
    doc = _doc([*_idle_gpu(), _progress(False)])
    assert doc["outcome"] == "workload_hang" and doc["affected_nodes"] == []
    assert any(s["id"] == "job_idle" for s in doc["symptoms"])


def test_one_gpu_idle_inside_an_open_checkpoint_save_is_no_hang() -> None:
    t = START + STEP * ONSET
    lines = [
        LogLine("job.log", 1, _megatron(100), time=t - 2),
        LogLine("job.log", 2, "saving checkpoint at iteration     100 to /ckpt", time=t - 1),
    ]
    doc = _doc([*_idle_gpu(), _progress(False)], lines)
    assert doc["outcome"] != "workload_hang"


def test_a_pause_that_ended_does_not_hide_the_hang() -> None:
    t = START + STEP * ONSET
    lines = [
        LogLine("job.log", 1, "saving checkpoint at iteration     100 to /ckpt", time=t - 30),
        LogLine("job.log", 2, _megatron(101), time=t - 2),
    ]
    assert _doc([*_idle_gpu(), _progress(False)], lines)["outcome"] == "workload_hang"


def test_one_gpu_idle_with_memory_released_is_no_hang() -> None:
    """The process let go of its memory: it ended (a crash has its own evidence), not hung."""
    assert _doc([*_idle_gpu(fb_after=600), _progress(False)])["outcome"] != "workload_hang"


def _megatron(it: int) -> str:
    return (
        f" iteration {it:>8}/  500000 | consumed samples:       61440 | elapsed time per "
        "iteration (ms): 512.3 | learning rate: 3.000E-04 | lm loss: 2.345678E+00 |"
    )


# ------------------------------------------------------------------ stuck from the start


def test_rank_idle_from_the_start_while_its_peers_spin_is_named() -> None:
    series = []
    for g in range(8):
        if g == 3:
            series += _gpu("node1", g, [0.0] * N, [0.0] * N)
        else:
            series += _gpu("node1", g, [100.0] * N, [0.01] * N)
    doc = _doc([*series, _progress(False)])
    assert doc["outcome"] == "workload_hang" and doc["affected_nodes"] == ["node1"]
    assert [(g["node"], str(g["gpu"])) for g in doc["affected_gpus"]] == [("node1", "3")]


def test_an_unused_gpu_beside_training_peers_is_no_hang() -> None:
    series = []
    for g in range(8):
        idle = g == 3
        series += _gpu("node1", g, [0.0 if idle else 100.0] * N, [0.0 if idle else 0.96] * N)
    assert _doc([*series, _progress(True)])["outcome"] != "workload_hang"


# ------------------------------------------------------------------ slowed by its hardware


@pytest.mark.parametrize(("bits", "straggler"), [(0x40, True), (0x08, True), (0x04, False)])
def test_one_gpu_with_hardware_slowdown_bits_is_a_straggler_on_its_node(
    bits: int, straggler: bool
) -> None:
    """HW thermal (0x40) or HW slowdown (0x08) while busy names the node; a software power cap
    (0x04) is the GPU working as configured."""
    series = _gpu(
        "node1",
        0,
        _phase(100, 99),
        _phase(0.96, 0.95),
        DCGM_FI_DEV_CLOCK_THROTTLE_REASONS=_phase(0, bits),
    )
    doc = _doc(series)
    assert (doc["outcome"] == "straggler") is straggler
    if straggler:
        assert doc["affected_nodes"] == ["node1"]


def _steps(before: float, after: float) -> list[Series]:
    """The job's log: iteration time `before` then `after` from the onset, a line every 5 s."""
    step = [(START + STEP * i, before if i < ONSET else after) for i in range(N)]
    return [Series("goodput_job_iteration_seconds", step, job_id="1001"), _progress(True)]


def test_one_gpu_slower_while_as_busy_goes_to_a_person() -> None:
    """Step time up 60 % with the GPU about as busy (100 -> 80 % explains less than half of
    it): more work per step, the job's own (longer sequences, a bigger model): nothing names
    a node; `unknown` holds it for a person with the slowdown as evidence."""
    doc = _doc([*_gpu("node1", 0, _phase(100, 80), _phase(0.96, 0.7)), *_steps(1.2, 1.9)])
    assert doc["outcome"] == "unknown" and doc["affected_nodes"] == []
    assert any(s["id"] == "slowdown" for s in doc["symptoms"])


def _learned(seconds: float) -> Series:
    """The detector's fitted step time for the job (goodput_job_baseline_iteration_seconds)."""
    pts = [(START + STEP * i, seconds) for i in range(N)]
    return Series("goodput_job_baseline_iteration_seconds", pts, job_id="1001")


@pytest.mark.parametrize(("learned", "slow"), [(None, False), (0.085, True), (0.124, False)])
def test_a_restart_slow_from_its_first_step_is_slower_than_its_learned_step(
    learned: float | None, slow: bool
) -> None:
    """A restart stepping at 124 ms from its first step, the GPU as busy throughout: its own
    window has no faster part, so without the detector's learned step time (85 ms, stored by
    job name) nothing is slower than before (the incident's verdict: `unknown`, no failure
    signature); with it the slowdown is the evidence. A learned step as slow as now is the
    job's pace: no slowdown."""
    series = [*_gpu("node1", 0, _phase(99, 99), _phase(0.96, 0.96)), *_steps(0.124, 0.124)]
    doc = _doc(series + ([_learned(learned)] if learned else []))
    (sym,) = [s for s in doc["symptoms"] if s["id"] == "slowdown"] or [None]
    assert (sym is not None) is slow
    if slow:
        assert "vs 0.085s (the job's learned step time)" in sym["detail"]
        assert sym["first_seen"] == START  # the whole window is slower than it
        assert doc["outcome"] == "unknown" and doc["affected_nodes"] == []


def test_a_restarts_slow_warm_up_that_ended_is_no_slowdown() -> None:
    """A restart's first steps slow (compiling, caches cold) for 30 s, then at the learned pace
    to the end of the window: against the learned step the warm-up is a slow run, but it
    ended: the job is at its pace (fails without the to-the-end check)."""
    step = [(START + STEP * i, 0.124 if i < 7 else 0.085) for i in range(N)]
    series = [
        *_gpu("node1", 0, _phase(99, 99), _phase(0.96, 0.96)),
        Series("goodput_job_iteration_seconds", step, job_id="1001"),
        _progress(True),
        _learned(0.085),
    ]
    assert not any(s["id"] == "slowdown" for s in _doc(series)["symptoms"])


def test_the_learned_step_is_its_lowest_in_the_window() -> None:
    """A baseline refitted upwards during a long slowdown (the detector learns a new normal
    after a sustained shift no incident confirmed) does not hide what the job took before."""
    learned = _learned(0.085)
    learned.points[ONSET:] = [(t, 0.124) for t, _ in learned.points[ONSET:]]
    series = [*_gpu("node1", 0, _phase(99, 99), _phase(0.96, 0.96)), *_steps(0.124, 0.124)]
    (sym,) = [s for s in _doc([*series, learned])["symptoms"] if s["id"] == "slowdown"]
    assert "vs 0.085s (the job's learned step time)" in sym["detail"]


def test_a_learned_step_does_not_change_a_warm_jobs_slowdown() -> None:
    """The job's own history first: with 7 minutes of it in the window at the learned pace,
    the slowdown reads as before (the reference is the early median, from the onset)."""
    base = _doc([*_gpu("node1", 0, _phase(99, 62), _phase(0.96, 0.59)), *_steps(0.085, 0.124)])
    doc = _doc(
        [
            *_gpu("node1", 0, _phase(99, 62), _phase(0.96, 0.59)),
            *_steps(0.085, 0.124),
            _learned(0.085),
        ]
    )
    assert doc["outcome"] == base["outcome"] == "straggler"
    assert doc["symptoms"] == base["symptoms"]


def test_one_gpu_slower_and_starved_is_a_straggler_a_person_decides() -> None:
    """Step time up 46 % while the GPU fell from 99 to 62 % busy (the H200 with its host
    stalling, failures.md): it waits on its host. The node is named, at a confidence under the
    default policy's drain threshold, so the action holds for a person."""
    doc = _doc([*_gpu("node1", 0, _phase(99, 62), _phase(0.96, 0.59)), *_steps(0.085, 0.124)])
    assert doc["outcome"] == "straggler" and doc["affected_nodes"] == ["node1"]
    assert doc["confidence"] < Policy().min_confidence["drain_and_requeue"]
    (sym,) = [s for s in doc["symptoms"] if s["id"] == "host_bound"]
    assert sym["node"] == "node1" and sym["gpu"] == "0" and "99 -> 62 %" in sym["detail"]
    d = decide.Diagnosis.from_dict({**doc, "incident_id": 1})
    action = decide.decide(d, decide.History(now=START + STEP * N), Policy(mode="act"))
    assert action.kind == "hold_for_person" and "low_confidence" in action.reasons


def _learned_busy(percent: float, refit: float | None = None) -> Series:
    """The detector's learned busy utilisation of the job (goodput_job_baseline_gpu_utilization
    _percent); `refit`: what it was refitted to from the onset."""
    pts = [(START + STEP * i, refit if refit and i >= ONSET else percent) for i in range(N)]
    return Series("goodput_job_baseline_gpu_utilization_percent", pts, job_id="1001")


@pytest.mark.parametrize(
    ("busy", "named"),
    [(None, False), (_learned_busy(99), True), (_learned_busy(99, refit=62), True),
     (_learned_busy(70), False)],
    ids=["no learned busy", "learned 99 %", "refitted down to 62 %", "learned 70 %"],
)  # fmt: skip
def test_a_restart_starved_from_its_first_step_is_a_straggler_on_its_node(
    busy: Series | None, named: bool
) -> None:
    """The real-signal restart: 124 ms a step and 62 % busy from its first step, where the job
    was learned at 85 ms and 99 % (its baseline stored by name). Its own window has no busier
    part, so only what the detector learned shows that its GPU waits on the host: the node
    is named as when the job had its own history (a refit down during the slowdown does not
    hide it). Without the learned utilisation, or learned about as busy, the step grew with the
    GPU as busy as the job is used to: no host_bound (the slowdown alone, `unknown`)."""
    series = [*_gpu("node1", 0, _phase(62, 62), _phase(0.59, 0.59)), *_steps(0.124, 0.124)]
    doc = _doc([*series, _learned(0.085), *([busy] if busy else [])])
    starved = [s for s in doc["symptoms"] if s["id"] == "host_bound"]
    assert bool(starved) is named
    if named:
        assert doc["outcome"] == "straggler" and doc["affected_nodes"] == ["node1"]
        assert "99 -> 62 %" in starved[0]["detail"] and "learned" in starved[0]["detail"]
    else:
        assert doc["outcome"] == "unknown" and doc["affected_nodes"] == []


@pytest.mark.parametrize("busy", [None, 99.0], ids=["no learned busy", "learned busy"])
def test_a_warm_job_starved_is_named_whatever_was_learned(busy: float | None) -> None:
    """A job with its own faster history in the window (85 ms at 99 %, then 124 ms at 62 %)
    whose learned step is already much faster (60 ms): without a learned busy utilisation its
    own history is the reference, as before either was exported (the learned step alone
    left host_bound nothing to compare the GPU's busy time with)."""
    series = [*_gpu("node1", 0, _phase(99, 62), _phase(0.96, 0.59)), *_steps(0.085, 0.124)]
    series += [_learned(0.06), *([_learned_busy(busy)] if busy else [])]
    doc = _doc(series)
    assert doc["outcome"] == "straggler" and doc["affected_nodes"] == ["node1"]


def test_one_node_starved_names_the_node_not_a_gpu() -> None:
    series = [x for g in range(8) for x in _gpu("node1", g, _phase(99, 60), _phase(0.96, 0.6))]
    doc = _doc([*series, *_steps(1.2, 1.9)])
    assert doc["outcome"] == "straggler" and doc["affected_nodes"] == ["node1"]
    assert [s["gpu"] for s in doc["symptoms"] if s["id"] == "host_bound"] == [None]


def test_one_gpu_of_eight_busy_as_before_is_no_host_bound() -> None:
    """Every GPU of the job must have lost its busy time: seven starved and one as busy is
    not one host (the peer rules judge a job's GPUs against each other)."""
    series = [x for g in range(7) for x in _gpu("node1", g, _phase(99, 60), _phase(0.96, 0.6))]
    series += _gpu("node1", 7, _phase(99, 99), _phase(0.96, 0.96))
    doc = _doc([*series, *_steps(1.2, 1.9)])
    assert not any(s["id"] == "host_bound" for s in doc["symptoms"])


@pytest.mark.parametrize(("nodes", "named"), [(["node1"], True), (["node1", "node2"], False)])
def test_a_node_without_dcgm_series_still_counts_as_the_jobs(nodes: list[str], named: bool) -> None:
    """Slurm lists the job's nodes: a two-node job whose node2 reports no DCGM series (its
    exporter down) is not a one-node job, and is neither host-bound nor a one-node spin on the
    GPUs node1 shows (before, the node count came from the GPU series alone)."""
    starved = _doc([*_gpu("node1", 0, _phase(99, 62), _phase(0.96, 0.59)), *_steps(0.085, 0.124)],
                   nodes=nodes)  # fmt: skip
    assert any(s["id"] == "host_bound" for s in starved["symptoms"]) is named
    spinning = [x for g in range(8) for x in _gpu("node1", g, _phase(100, 100), _phase(0.96, 0.01))]
    spin = _doc([*spinning, _progress(False)], nodes=nodes)
    assert any(s["id"] == "job_spin" for s in spin["symptoms"]) is named


def test_a_two_node_job_is_left_to_the_peer_rules() -> None:
    series = [x for n in ("node1", "node2") for x in _gpu(n, 0, _phase(99, 60), _phase(0.96, 0.6))]
    doc = _doc([*series, *_steps(1.2, 1.9)])
    assert not any(s["id"] == "host_bound" for s in doc["symptoms"])


def test_starved_soon_after_slow_first_steps_is_a_straggler() -> None:
    """A job whose first steps ran slow (2.1 s, 1.6 s), then at its pace for two log lines
    (1.2 s, 1.21 s), all in the first third of the window (its history), then starved (1.9 s,
    the GPU 99 -> 62 %): that third's median (1.6 s) hides the slowdown; the fastest step it
    held over two lines shows it (the cold-start row host-straggler-1gpu-early: `unknown`, no
    node, before)."""
    n, onset = 30, 10
    first = [2.1] * 3 + [1.6] * 3 + [1.2] * 2 + [1.21] * 2
    step = [(START + STEP * i, first[i] if i < onset else 1.9) for i in range(n)]
    it = [(START + STEP * i, float(i)) for i in range(n)]
    series = [
        *_gpu("node1", 0, [99.0 if i < onset else 62.0 for i in range(n)], [0.9] * n),
        Series("goodput_job_iteration_seconds", step, job_id="1001"),
        Series("goodput_job_iteration", it, job_id="1001"),
    ]
    doc = _doc(series)
    assert doc["outcome"] == "straggler" and doc["affected_nodes"] == ["node1"]
    (sym,) = [s for s in doc["symptoms"] if s["id"] == "host_bound"]
    assert "1.9s vs 1.21s" in sym["detail"]


def test_one_fast_line_over_two_samples_is_not_the_jobs_pace() -> None:
    """One log line 20 % faster than the rest (a real H200's first: 76 ms at 85), read at two
    samples: one line, not two, so not the reference; the job at its pace is not slowed."""
    n = 30
    vals = [1.2, 1.2, 1.0, 1.0, 1.21, 1.21, 1.19, 1.19, 1.2, 1.2] + [1.22, 1.21] * 10
    step = [(START + STEP * i, v) for i, v in enumerate(vals)]
    it = [(START + STEP * i, float(i)) for i in range(n)]
    series = [
        *_gpu("node1", 0, [99.0] * 10 + [90.0] * 20, [0.9] * n),
        Series("goodput_job_iteration_seconds", step, job_id="1001"),
        Series("goodput_job_iteration", it, job_id="1001"),
    ]
    assert not any(s["id"] in ("slowdown", "host_bound") for s in _doc(series)["symptoms"])


def test_a_slowdown_that_ended_is_no_host_bound() -> None:
    """Slow for 35 s, then back to its pace for longer, the GPU 2 points less busy since: no
    longer a straggler (before the slow run had to last to the end, that dip named the node:
    the median step since the onset was the old pace, so any dip counted)."""
    n, onset = 2 * N, 14  # the slow run after the first third (the job's history)
    step = [(START + STEP * i, 1.5 if onset <= i < onset + 8 else 1.0) for i in range(n)]
    it = [(START + STEP * i, float(i)) for i in range(n)]
    series = [
        *_gpu("node1", 0, [96.0 if i < onset else 94.0 for i in range(n)], [0.9] * n),
        Series("goodput_job_iteration_seconds", step, job_id="1001"),
        Series("goodput_job_iteration", it, job_id="1001"),
    ]
    doc = _doc(series)
    assert not any(s["id"] == "host_bound" for s in doc["symptoms"])
    assert doc["affected_nodes"] == []


def test_hardware_evidence_keeps_the_confident_straggler_rule() -> None:
    """Starved first, thermal violation 30 s later on the same GPU: the hardware rule (0.7,
    a drain by default) decides, not the host_bound one (0.5) that started earlier."""
    viol = [0.0 if i < ONSET + 6 else 1e10 for i in range(N)]  # ns (DCGM's unit)
    series = _gpu(
        "node1", 0, _phase(99, 62), _phase(0.96, 0.59), DCGM_FI_DEV_THERMAL_VIOLATION=viol
    )
    doc = _doc([*series, *_steps(0.085, 0.124)])
    assert doc["outcome"] == "straggler" and doc["affected_nodes"] == ["node1"]
    assert doc["confidence"] >= 0.7
    thermal = next(s for s in doc["symptoms"] if s["id"] == "thermal_throttle")
    assert "DCGM_FI_DEV_THERMAL_VIOLATION counted 10.0 s in " in thermal["detail"]


def test_an_evaluation_in_the_window_is_not_read_as_busy() -> None:
    """The GPU busy evaluating (97 %) for a stretch with no iteration line: the busy share is
    read only where the job stepped, so the eval does not hide the starved steps."""
    util = [99.0 if i < ONSET else 62.0 for i in range(N)]
    util[ONSET + 2 : ONSET + 8] = [97.0] * 6  # an evaluation: no iteration line meanwhile
    it = [(START + STEP * i, float(i)) for i in range(N) if not ONSET + 2 < i < ONSET + 8]
    step = [(START + STEP * i, 1.2 if i < ONSET else 1.9) for i in range(N)]
    series = [
        *_gpu("node1", 0, util, _phase(0.96, 0.6)),
        Series("goodput_job_iteration_seconds", step, job_id="1001"),
        Series("goodput_job_iteration", it, job_id="1001"),
    ]
    doc = _doc(series)
    assert doc["outcome"] == "straggler" and doc["affected_nodes"] == ["node1"]


# ------------------------------------------------------------------ the rules file


def test_a_threshold_naming_no_prior_is_refused(tmp_path) -> None:  # noqa: ANN001
    (tmp_path / "r.yaml").write_text(
        "metrics:\n  - {id: x, kind: idle, scope: all, util_max: no_such_prior, min_s: 30}\n"
    )
    with pytest.raises(attribution.RuleError, match="no_such_prior"):
        attribution.load_rules(str(tmp_path))


def test_only_a_counter_that_rises_counts_time(tmp_path) -> None:  # noqa: ANN001
    (tmp_path / "r.yaml").write_text(
        "metrics:\n  - {id: x, kind: above, metric: m, min: 1, seconds_per_unit: 1.0e-6}\n"
    )
    with pytest.raises(attribution.RuleError, match="seconds_per_unit"):
        attribution.load_rules(str(tmp_path))


def test_peers_spin_must_name_an_earlier_rule(tmp_path) -> None:  # noqa: ANN001
    (tmp_path / "r.yaml").write_text(
        "metrics:\n"
        "  - {id: x, kind: idle, scope: some, util_max: 5, peers_spin: later, min_s: 30}\n"
        "  - {id: later, kind: prior, rule: spin_wait, min_s: 30}\n"
    )
    with pytest.raises(attribution.RuleError, match="peers_spin"):
        attribution.load_rules(str(tmp_path))


def test_rule_thresholds_come_from_the_priors() -> None:
    from catalogue import priors

    generic = priors.load().params(priors.GENERIC)
    rules = {r["id"]: r for r in attribution.load_rules().metrics}
    assert rules["job_idle"]["util_max"] == generic["idle_util_max"]
    assert rules["job_idle"]["fb_min"] == generic["fb_held_min_mib"]


def test_a_one_gpu_spin_is_requeued_elsewhere_and_stopped_when_it_hangs_there_too() -> None:
    """The suspect node is avoided, not blamed: the restart excludes node1 without draining
    it; the same spin on node2 is the same cause (a workload's key names no node), so the
    sticky rule stops the job instead of walking it across the cluster (as it did when the
    spin named no node; a key with the node would have requeued it again)."""
    from recovery.decide import Diagnosis, History, JobView, NodeView, Reason, decide
    from recovery.policy import parse_policy

    policy = parse_policy({"mode": "act"}, env={})
    nodes = tuple(NodeView(f"node{i}", "IDLE", ("gpu",)) for i in range(1, 5))
    spin = (_phase(100, 100), _phase(0.96, 0.008))
    first = Diagnosis.from_dict(
        _doc([*_gpu("node1", 0, *spin), _progress(False)], nodes=["node1"]) | {"incident_id": 1}
    )
    job = JobView("RUNNING", 0, None, "gpu", START, node_count=1, nodes=("node1",))
    a = decide(first, History(now=START + 600, job=job, nodes=nodes), policy)
    assert (a.kind, a.nodes, a.exclude) == ("requeue", (), ("node1",))
    second = Diagnosis.from_dict(
        _doc([*_gpu("node2", 0, *spin), _progress(False)], nodes=["node2"]) | {"incident_id": 2}
    )
    assert second.affected_nodes == ("node2",) and second.cause_key == first.cause_key
    # (the same synthetic window: the restart started before its own hang's onset)
    moved = JobView("RUNNING", 1, None, "gpu", START, node_count=1, nodes=("node2",))
    b = decide(
        second,
        History(now=START + 1300, job=moved, restarts_done=1, same_cause_restarts=1,
                nodes=nodes, excluded_before=a.exclude),
        policy,
    )  # fmt: skip
    assert Reason.STICKY_ROOT_CAUSE in b.reasons and b.nodes == ()
    # a stop needs stop's confidence (0.8): below it a person decides, and nothing walks on
    expected = "stop" if second.confidence >= policy.min_confidence["stop"] else "hold_for_person"
    assert b.kind == expected and (expected == "stop" or Reason.LOW_CONFIDENCE in b.reasons)

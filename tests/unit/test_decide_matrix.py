"""decide(): every outcome x mode x budget, plus each adjustment's reason code."""

from __future__ import annotations

import itertools

import pytest

from recovery.decide import Diagnosis, History, JobView, NodeView, Reason, decide
from recovery.policy import MODES, OUTCOMES, RESTARTS, parse_policy

NODES = tuple(NodeView(f"node{i}", "IDLE", ("gpu",)) for i in range(1, 9))
DEFAULTS = parse_policy({}, env={})


def diag(outcome, nodes=("node2",), confidence=0.95, job="42", cause="xid79", onset=1000.0):
    return Diagnosis("7", job, outcome, cause, tuple(nodes), confidence, onset)


def hist(restarts=0, same=0, job=JobView("RUNNING", 0, None, "gpu", 500.0), **kw):
    kw.setdefault("nodes", NODES)
    return History(now=2000.0, job=job, restarts_done=restarts, same_cause_restarts=same, **kw)


EXPECTED_DISPOSITION = {"monitor": "plan_only", "approve": "await_approval", "act": "execute"}


@pytest.mark.parametrize(
    "outcome, mode, budget",
    list(itertools.product(OUTCOMES, MODES, ["fresh", "sticky", "spent"])),
)
def test_matrix(outcome, mode, budget):
    policy = parse_policy({"mode": mode, "retry": {"backoff_s": [0]}}, env={})
    h = {"fresh": hist(), "sticky": hist(1, 1), "spent": hist(3, 0)}[budget]
    a = decide(diag(outcome), h, policy)
    default = policy.action_for(outcome)
    assert a.default_kind == default
    assert a.reasons[0] == Reason.POLICY_DEFAULT
    if default in RESTARTS and budget != "fresh":
        assert a.kind == "stop"
        assert (
            Reason.STICKY_ROOT_CAUSE if budget == "sticky" else Reason.RETRY_BUDGET_SPENT
        ) in a.reasons
        # a node fault keeps its drain even when the job is stopped
        assert a.nodes == (("node2",) if default == "drain_and_requeue" else ())
    else:
        assert a.kind == default
    if a.kind in ("none", "hold_for_person"):
        assert a.disposition in ("none", "notify")
    else:
        assert a.disposition == EXPECTED_DISPOSITION[mode]
        assert f"mode_{mode}" in a.reasons
    if a.kind == "drain_and_requeue":
        assert a.nodes == ("node2",) and a.exclude == ("node2",)
    if a.kind == "requeue":  # the named node is a suspect: the restart avoids it, no drain
        assert a.nodes == () and a.exclude == ("node2",)


def test_pure_and_deterministic():
    d, h = diag("gpu_hardware_fault"), hist()
    assert decide(d, h, DEFAULTS) == decide(d, h, DEFAULTS)


@pytest.mark.parametrize(
    "kind, conf",
    [
        ("gpu_hardware_fault", 0.69),
        ("workload_crash", 0.49),
        ("workload_oom", 0.79),
        ("gpu_degradation", 0.1),
    ],
)
def test_low_confidence_goes_to_a_person(kind, conf):
    a = decide(diag(kind, confidence=conf), hist(), DEFAULTS)
    assert a.kind == "hold_for_person" and Reason.LOW_CONFIDENCE in a.reasons
    assert a.nodes == () and a.disposition == "notify"


def test_exit_code_93_is_never_requeued():
    ended = JobView("FAILED", 0, 93, "gpu", 500.0)
    a = decide(diag("workload_crash"), hist(job=ended), DEFAULTS)
    assert a.kind == "stop" and Reason.EXIT_CODE_93 in a.reasons and Reason.JOB_ENDED in a.reasons
    b = decide(diag("gpu_hardware_fault"), hist(job=ended), DEFAULTS)
    assert b.kind == "drain" and b.nodes == ("node2",)


@pytest.mark.parametrize(
    "job", [JobView("PENDING", 1, None, "gpu", None), JobView("RUNNING", 1, None, "gpu", 1500.0)]
)
def test_never_requeue_what_slurm_requeued(job):
    a = decide(diag("node_lost"), hist(job=job), DEFAULTS)
    assert a.kind == "drain" and Reason.ALREADY_REQUEUED in a.reasons
    b = decide(diag("workload_crash"), hist(job=job), DEFAULTS)
    assert b.kind == "none" and Reason.ALREADY_REQUEUED in b.reasons


def test_running_since_before_onset_is_requeued():
    a = decide(diag("node_lost"), hist(job=JobView("RUNNING", 0, None, "gpu", 999.0)), DEFAULTS)
    assert a.kind == "drain_and_requeue"


def test_backoff_grows_with_restarts():
    delays = [
        decide(diag("workload_crash", cause=f"c{i}"), hist(restarts=i), DEFAULTS).delay_s
        for i in range(3)
    ]
    assert delays == [0.0, 60.0, 300.0]
    assert Reason.BACKOFF in decide(diag("workload_crash"), hist(restarts=1), DEFAULTS).reasons


def test_no_culprit_node_and_no_job():
    a = decide(diag("gpu_hardware_fault", nodes=()), hist(), DEFAULTS)
    assert a.kind == "requeue" and Reason.NO_CULPRIT_NODE in a.reasons
    b = decide(diag("gpu_degradation", nodes=()), hist(), DEFAULTS)
    assert b.kind == "hold_for_person"
    c = decide(diag("gpu_hardware_fault", job=None), hist(job=None), DEFAULTS)
    assert c.kind == "drain" and Reason.NO_JOB in c.reasons
    d = decide(diag("workload_oom", job=None), hist(job=None), DEFAULTS)
    assert d.kind == "none"


def test_paused_plans_only():
    p = parse_policy({"mode": "act"}, env={})
    a = decide(diag("gpu_hardware_fault"), hist(paused=True), p)
    assert a.disposition == "plan_only" and Reason.PAUSED in a.reasons


def test_stop_on_ended_job_stays_ended():
    a = decide(diag("workload_oom"), hist(job=JobView("FAILED", 0, 1, "gpu", 1.0)), DEFAULTS)
    assert a.kind == "stop" and Reason.JOB_ENDED in a.reasons


def test_already_drained_node_is_not_drained_again():
    nodes = (NodeView("node2", "DRAINED", ("gpu",)),) + NODES[2:]
    h = History(now=2000.0, job=JobView("RUNNING", 0, None, "gpu", 500.0), nodes=nodes)
    a = decide(diag("gpu_degradation"), h, DEFAULTS)
    assert a.kind == "none" and Reason.NODES_ALREADY_UNAVAILABLE in a.reasons
    b = decide(diag("gpu_hardware_fault"), h, DEFAULTS)
    assert b.kind == "drain_and_requeue" and b.nodes == () and b.exclude == ("node2",)


@pytest.mark.parametrize(
    "limits, nodes_state, drains, reason",
    [
        ({"max_drains_per_hour": 1}, None, (1500.0,), Reason.BLAST_DRAINS_PER_HOUR),
        (
            {"max_partition_unavailable_fraction": 0.25},
            ("DRAIN", "IDLE", "IDLE", "IDLE"),
            (),
            Reason.BLAST_PARTITION_FRACTION,
        ),
        (
            {"min_healthy_nodes": 1, "max_partition_unavailable_fraction": 1.0},
            ("DOWN", "IDLE", "DOWN", "DOWN"),
            (),
            Reason.BLAST_LAST_HEALTHY,
        ),
    ],
)
def test_blast_radius_limits(limits, nodes_state, drains, reason):
    p = parse_policy({"blast_radius": limits}, env={})
    nodes = (
        NODES
        if nodes_state is None
        else tuple(NodeView(f"node{i + 1}", s, ("gpu",)) for i, s in enumerate(nodes_state))
    )
    h = History(
        now=2000.0, job=JobView("RUNNING", 0, None, "gpu", 500.0), nodes=nodes, drain_times=drains
    )
    a = decide(diag("gpu_hardware_fault"), h, p)
    assert a.kind == "hold_for_person" and reason in a.reasons and a.nodes == ()


def test_drains_older_than_an_hour_do_not_count():
    p = parse_policy({"blast_radius": {"max_drains_per_hour": 1}}, env={})
    h = History(
        now=5000.0,
        job=JobView("RUNNING", 0, None, "gpu", 500.0),
        nodes=NODES,
        drain_times=(1000.0,),
    )
    assert decide(diag("gpu_hardware_fault"), h, p).kind == "drain_and_requeue"


def test_a_drain_takes_the_mode_of_its_nodes_partitions():
    """A node-only alert (no job) drains a node of a partition kept in monitor: it only
    plans; so does a job's drain of a node that is also in that partition."""
    p = parse_policy({"mode": "act", "partition_modes": {"prod": "monitor"}}, env={})
    nodes = (NodeView("node1", "IDLE", ("prod",)), NodeView("node2", "IDLE", ("gpu", "prod")))
    nodes += tuple(NodeView(f"node{i}", "IDLE", ("gpu",)) for i in range(3, 9))
    no_job = decide(diag("gpu_degradation", ("node1",), job=None), History(2000.0, nodes=nodes), p)
    assert (no_job.kind, no_job.disposition) == ("drain", "plan_only")
    for culprit, disposition in (("node2", "plan_only"), ("node3", "execute")):
        a = decide(diag("gpu_hardware_fault", (culprit,)), hist(nodes=nodes), p)
        assert (a.kind, a.disposition) == ("drain_and_requeue", disposition)


def test_unknown_node_states_hold():
    h = History(now=2000.0, job=JobView("RUNNING", 0, None, "gpu", 500.0), nodes=())
    a = decide(diag("gpu_hardware_fault"), h, DEFAULTS)
    assert a.kind == "hold_for_person" and Reason.BLAST_UNKNOWN in a.reasons


@pytest.mark.parametrize(
    "raw, error",
    [
        ({"outcome": "boom"}, "outcome"),
        ({"outcome": "unknown", "confidence": 3}, "confidence"),
        ({"outcome": "unknown", "confidence": "x"}, "confidence"),
        ({"outcome": "unknown", "affected_nodes": "node1"}, "affected_nodes"),
    ],
)
def test_diagnosis_validation(raw, error):
    with pytest.raises(ValueError, match=error):
        Diagnosis.from_dict(raw)


def test_diagnosis_from_receiver_dict():
    d = Diagnosis.from_dict(
        {
            "incident_id": 3,
            "job_id": 17,
            "outcome": "gpu_hardware_fault",
            "root_cause": "xid79",
            "affected_nodes": ["node2", "node2"],
            "confidence": 0.9,
            "onset": 12.5,
        }
    )
    assert d.job_id == "17" and d.affected_nodes == ("node2",) and d.onset == 12.5


def test_root_symptoms_key_the_cause():
    base = {"outcome": "workload_crash", "confidence": 0.9}
    a = Diagnosis.from_dict(
        {
            **base,
            "root_cause": "crash at 12:03 on rank 3",
            "symptoms": [
                {"id": "cuda_illegal_address", "role": "root"},
                {"id": "nccl_timeout", "role": "cascade"},
            ],
        }
    )
    b = Diagnosis.from_dict(
        {
            **base,
            "root_cause": "crash at 14:10 on rank 0",
            "symptoms": [{"id": "cuda_illegal_address", "role": "root"}],
        }
    )
    assert a.cause_key == b.cause_key == "workload_crash:cuda_illegal_address"


def test_a_job_that_ended_long_before_the_decision_is_not_restarted():
    """A late alert (an exporter restart re-reports an hour of failed jobs) must not requeue a
    job whose user has moved on; its culprit node is still drained."""
    window = DEFAULTS.retry.requeue_within_s
    old = JobView("FAILED", 0, 1, "gpu", 100.0, end_time=2000.0 - window - 1)
    a = decide(diag("gpu_hardware_fault"), hist(job=old), DEFAULTS)
    assert a.kind == "drain" and a.nodes == ("node2",) and Reason.ENDED_LONG_AGO in a.reasons
    assert decide(diag("node_lost", nodes=()), hist(job=old), DEFAULTS).kind == "none"
    recent = JobView("FAILED", 0, 1, "gpu", 100.0, end_time=2000.0 - window + 60)
    b = decide(diag("gpu_hardware_fault"), hist(job=recent), DEFAULTS)
    assert b.kind == "drain_and_requeue" and Reason.ENDED_LONG_AGO not in b.reasons


@pytest.mark.parametrize(
    ("outcome", "conf", "restarts", "same_cause"),
    [("workload_hang", 0.55, 3, 0), ("workload_crash", 0.6, 1, 1)],  # budget spent; sticky
)
def test_a_stop_reached_through_the_retry_rules_needs_the_stops_confidence(
    outcome, conf, restarts, same_cause
):
    """min_confidence was checked on the outcome's action only: a requeue (0.5) turned into a
    stop (0.8) by the spent budget or the sticky rule requeue-held a running job at 0.55."""
    act = parse_policy({"mode": "act"}, env={})
    d = Diagnosis("1", "42", outcome, "x", ("node3",), conf, onset=900.0, key=f"{outcome}:x")
    job = JobView("RUNNING", restarts, None, "gpu", 100.0, nodes=("node3",))
    h = History(
        now=1000.0, job=job, restarts_done=restarts, same_cause_restarts=same_cause, nodes=NODES
    )
    a = decide(d, h, act)
    assert a.kind == "hold_for_person" and Reason.LOW_CONFIDENCE in a.reasons, a.reasons
    sure = decide(
        Diagnosis("1", "42", outcome, "x", ("node3",), 0.9, onset=900.0, key=f"{outcome}:x"), h, act
    )
    assert sure.kind == "stop"

"""Policy file loading, validation and directive merging."""

from __future__ import annotations

import pytest

from recovery.directives import check_bounds, merge, parse_directive
from recovery.policy import DEFAULT_FILE, OUTCOMES, PolicyError, load_policy, parse_policy


def test_default_file_matches_ground_truth_table():
    p = load_policy(DEFAULT_FILE, env={})
    assert p.mode == "monitor"
    assert set(p.actions) == set(OUTCOMES)
    assert p.action_for("gpu_hardware_fault") == "drain_and_requeue"
    assert p.action_for("gpu_degradation") == "drain"
    assert p.action_for("filesystem") == "hold_for_person"
    assert p.action_for("workload_oom") == "stop"
    assert p.action_for("workload_hang") == "requeue"
    assert p.action_for("healthy") == "none"
    assert parse_policy({}, env={}) == p  # the file documents the built-in defaults


def test_env_mode_override_and_bad_mode():
    assert parse_policy({}, env={"GOODPUT_MODE": "act"}).mode == "act"
    with pytest.raises(PolicyError, match="GOODPUT_MODE"):
        parse_policy({}, env={"GOODPUT_MODE": "yolo"})


@pytest.mark.parametrize(
    "doc, needle",
    [
        ({"mode": "fast"}, "mode"),
        ({"actions": {"gpu_melted": "drain"}}, "unknown outcomes"),
        ({"actions": {"workload_oom": "explode"}}, "unknown actions"),
        ({"min_confidence": {"drain": 1.5}}, "min_confidence"),
        ({"retry": {"backoff_s": [-1]}}, "backoff"),
        ({"blast_radius": {"max_partition_unavailable_fraction": 2}}, "blast_radius"),
        ({"surprise": 1}, "surprise"),
        ({"job_mode": "act"}, "job_mode"),
        ([1, 2], "mapping"),
    ],
)
def test_invalid_policy_names_the_key(doc, needle):
    with pytest.raises(PolicyError, match=needle):
        parse_policy(doc, env={})


def test_unreadable_and_bad_yaml(tmp_path):
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "missing.yaml", env={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("mode: [unclosed")
    with pytest.raises(PolicyError, match="not valid YAML"):
        load_policy(bad, env={})


def test_partition_canary_and_job_narrowing():
    p = parse_policy({"mode": "monitor", "partition_modes": {"canary": "act"}}, env={})
    assert p.mode_for("gpu") == "monitor"
    assert p.mode_for("canary") == "act"
    d, err = parse_directive('{"goodput": {"mode": "approve"}}')
    assert err is None
    job = merge(p, d)
    assert job.mode_for("canary") == "approve"  # narrowed
    assert job.mode_for("gpu") == "monitor"  # a job can never widen by default
    wide = parse_policy({"directives": {"allow_mode_widening": True}}, env={})
    d2, _ = parse_directive('{"goodput": {"mode": "act"}}')
    assert merge(wide, d2).mode_for(None) == "act"


@pytest.mark.parametrize(
    "comment, error",
    [
        ("not json but goodput", "not JSON"),
        ('{"goodput": 3}', "object"),
        ('{"goodput": {"mode": "turbo"}}', "mode"),
        ('{"goodput": {"max_requeues": -1}}', "max_requeues"),
        ('{"goodput": {"max_requeues": true}}', "max_requeues"),
        ('{"goodput": {"launch": 1}}', "unknown directive keys"),
        ('{"goodput": {"actions": {"bogus": "stop"}}}', "unknown outcome"),
        ('{"goodput": {"on_hang": "reboot"}}', "unknown action"),
        ('{"goodput": {"actions": []}}', "actions"),
        ('{"goodput": {"mode": "act"}, "pad": "' + "x" * 5000 + '"}', "longer"),
    ],
)
def test_invalid_directives_are_reported_not_raised(comment, error):
    d, err = parse_directive(comment)
    assert d is None and err is not None and error in err


@pytest.mark.parametrize("comment", [None, "", "plain text", '{"APS": {"auto_resume_mode": 1}}'])
def test_no_directive(comment):
    assert parse_directive(comment) == (None, None)


def test_directive_bounds_and_caps():
    p = parse_policy({}, env={})
    d, _ = parse_directive('{"goodput": {"max_requeues": 50, "on_hang": "stop"}}')
    assert check_bounds(p, d) is None
    job = merge(p, d)
    assert job.retry.max_requeues_per_job == p.directives.max_requeues_cap
    assert job.action_for("workload_hang") == "stop"
    assert p.action_for("workload_hang") == "requeue"  # the operator's policy is untouched
    d_drain, _ = parse_directive('{"goodput": {"actions": {"workload_crash": "drain"}}}')
    assert "not allowed" in check_bounds(p, d_drain)
    assert merge(p, d_drain) == p
    d_hw, _ = parse_directive('{"goodput": {"actions": {"gpu_hardware_fault": "none"}}}')
    assert "not overridable" in check_bounds(p, d_hw)
    off = parse_policy({"directives": {"enabled": False}}, env={})
    assert "disabled" in check_bounds(off, d)


def test_outcomes_are_the_catalogues():
    import catalogue
    from recovery import diagnosis, policy

    assert set(policy.OUTCOMES) == set(diagnosis.OUTCOMES) == set(catalogue.outcomes())


def test_a_job_in_several_partitions_gets_the_narrowest_mode():
    p = parse_policy({"mode": "act", "partition_modes": {"prod": "monitor"}}, env={})
    assert p.mode_for("prod,debug") == p.mode_for(("debug", "prod")) == "monitor"
    assert p.mode_for("debug") == "act" and p.mode_for(" prod ") == "monitor"
    wide = parse_policy(
        {"mode": "monitor", "partition_modes": {"a": "act", "b": "approve"}}, env={}
    )
    assert wide.mode_for("a") == "act" and wide.mode_for("a,b") == "approve"
    canary = parse_policy(
        {"mode": "act", "canary_partitions": ["c"], "partition_modes": {"d": "approve"}}, env={}
    )
    assert canary.mode_for("c,d") == "approve" and not canary.outside_canary("c,d")
    assert canary.mode_for("c,e") == "monitor" and canary.outside_canary(("c", "e"))


def test_canary_partitions_act_and_the_rest_only_monitors():
    p = parse_policy(
        {"mode": "act", "canary_partitions": ["canary"], "partition_modes": {"debug": "approve"}},
        env={},
    )
    assert p.mode_for("canary") == "act"
    assert p.mode_for("gpu") == "monitor" and p.outside_canary("gpu")
    assert p.mode_for(None) == "monitor"  # a job whose partition is unknown: not on the list
    assert p.mode_for("canary,gpu") == "monitor"  # may run outside the canary
    assert p.mode_for("debug") == "approve" and not p.outside_canary("debug")  # its own mode
    assert parse_policy({"mode": "act"}, env={}).mode_for("gpu") == "act"  # no list: everywhere
    d, _ = parse_directive('{"goodput": {"mode": "approve"}}')
    assert merge(p, d).mode_for("canary") == "approve"  # a job still narrows inside the canary
    with pytest.raises(PolicyError, match="canary_partitions"):
        parse_policy({"canary_partitions": "canary"}, env={})


def test_a_fault_outside_the_canary_is_planned_and_says_why():
    from recovery.decide import Diagnosis, History, JobView, NodeView, decide

    p = parse_policy({"mode": "act", "canary_partitions": ["canary"]}, env={})
    nodes = tuple(NodeView(f"n{i}", "IDLE", ("gpu" if i < 4 else "canary",)) for i in range(8))

    def plan(part: str, node: str):
        h = History(now=2000.0, job=JobView("RUNNING", 0, None, part, 100.0), nodes=nodes)
        return decide(
            Diagnosis("1", "7", "gpu_hardware_fault", "xid79", (node,), 0.95, 1500.0), h, p
        )

    out = plan("gpu", "n1")
    assert out.disposition == "plan_only" and "outside_canary_partitions" in out.reasons
    inside = plan("canary", "n5")
    assert inside.disposition == "execute" and "outside_canary_partitions" not in inside.reasons

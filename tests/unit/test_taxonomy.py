"""One taxonomy, generated outward: every copy of the catalogue's facts is derived or guarded.

The catalogue (catalogue/*.yaml) holds outcomes with their default action, the action
vocabulary, the XID classes with their detector weight and alert, and the patterns' alert flag.
These tests fail when a derived copy drifts, and show that a signature's action hint reaches
the decision (policy switch `honour_catalogue_hints`).
"""

from __future__ import annotations

import shutil
import typing
from pathlib import Path

import pytest

import catalogue
from alertdsl import spec as A
from catalogue.loader import HERE, load
from recovery import attribution, decide, diagnosis, policy
from recovery.evidence import Bundle, Context, Report, Series

XID = "DCGM_FI_DEV_XID_ERRORS"


def test_action_vocabulary_is_the_catalogues():
    vocab = catalogue.actions()
    assert policy.ACTIONS == tuple(vocab)
    assert set(typing.get_args(policy.ActionKind)) == set(vocab)  # the type checker's copy
    assert set(policy.DESTRUCTIVE) == {a for a, x in vocab.items() if x.destructive}
    assert set(policy.RESTARTS) == {"requeue", "drain_and_requeue"}
    assert set(policy.DRAINS) == {"drain", "drain_and_requeue"}


def test_policy_defaults_are_the_catalogues_outcome_actions():
    defaults = parse = policy.parse_policy({}, env={})
    assert {o: defaults.action_for(o) for o in catalogue.outcomes()} == {
        o.id: o.action for o in catalogue.outcomes().values()
    }
    assert set(typing.get_args(diagnosis.Outcome)) == set(catalogue.outcomes())
    assert set(typing.get_args(diagnosis.Category)) == set(catalogue.categories())
    # the documented file stays equal to the built-in defaults (and so to the catalogue)
    assert policy.load_policy(policy.DEFAULT_FILE, env={}) == parse


def test_detector_xid_weights_are_the_catalogues():
    from detector import fields as F
    from detector import hardware

    xids = catalogue.default().xids
    assert F.XID_SCORES == {c: x.weight for c, x in xids.items() if x.weight}
    assert all(hardware._XID_TABLE[c] == x.weight for c, x in xids.items())
    assert F.XID_SCORES[79] == 2.0 and F.XID_SCORES[63] == 1.0 and 13 not in F.XID_SCORES


def test_alert_xid_lists_are_filled_from_the_catalogue():
    spec = A.load()
    fatal = {c.signal: c for c in spec.alert("GoodputGPUFatalXid").conditions}
    want = sorted(c for c, x in catalogue.default().xids.items() if x.cls == "hardware")
    assert [int(v) for v in fatal["dcgm_xid"].values] == want
    assert dict(fatal["kernel_log_xid"].labels)["xid"] == "=~" + "|".join(map(str, want))
    deg = {c.signal: c for c in spec.alert("GoodputGPUDegradation").conditions}
    assert {int(v) for v in deg["degradation_xid"].values} == {54, 63, 92, 94, 185}
    log = {c.signal: c for c in spec.alert("GoodputJobLogFault").conditions}["log_pattern"]
    flagged = {p.id for p in catalogue.load_patterns() if p.alert}
    assert set(dict(log.labels)["pattern"][2:].split("|")) == flagged
    text = A.DEFAULT_PATH.read_text()
    assert "values: catalogue" in text and "79, 95" not in text  # no hand copy left


def test_a_catalogue_placeholder_for_anything_else_is_an_error():
    doc = {
        "version": 1,
        "alerts": [
            {
                "name": "GoodputX",
                "severity": "warning",
                "scope": "gpu",
                "summary": "s",
                "description": "d",
                "conditions": [
                    {
                        "kind": "threshold",
                        "metric": "m",
                        "labels": {"gpu": "catalogue"},
                        "threshold": 0,
                    }
                ],
            }
        ],
    }
    with pytest.raises(A.AlertsError, match="xid or pattern"):
        A.parse(doc)


def test_a_class_change_in_the_catalogue_moves_every_copy(tmp_path: Path):
    """Editing one class in xid.yaml is all it takes: weight and alert follow."""
    for f in ("outcomes.yaml", "xid.yaml", "patterns.yaml"):
        shutil.copy(HERE / f, tmp_path / f)
    path = tmp_path / "xid.yaml"
    text = path.read_text()
    path.write_text(text.replace("detector_weight: 1.0, alert: GoodputGPUDegradation", ""))
    cat = load(tmp_path)
    assert cat.xids[94].weight == 0.0 and cat.xids[94].alert == ""
    assert load().xids[94].weight == 1.0


# ------------------------------------------------------------------------ action hints


def _xid_bundle(*codes: int) -> Bundle:
    points = [(1000.0 + 5 * i, float(c)) for i, c in enumerate(codes)]
    return Bundle(
        series=[Series(XID, points, node="node2", gpu="3", job_id="12")],
        reports=[Report("prometheus", "ok"), Report("logs", "ok"), Report("slurm", "ok")],
    )


def _ctx() -> Context:
    return Context(job_id="12", job_name="train", nodes=["node1", "node2"], start=900.0, end=1100.0)


def test_xid94_carries_its_catalogue_action_into_the_diagnosis():
    doc = attribution.attribute(_xid_bundle(94), _ctx())
    assert doc["outcome"] == "gpu_degradation" and doc["affected_nodes"] == ["node2"]
    assert doc["action_hint"] == catalogue.xid_info(94).job_action == "requeue"
    # XID 63 is degradation too, but its catalogue action is the outcome's default
    assert attribution.attribute(_xid_bundle(63), _ctx())["action_hint"] == "drain"


def test_the_kernel_line_of_xid94_carries_the_same_hint():
    """The driver's own format (NVIDIA open-gpu-kernel-modules, error containment)."""
    from recovery.evidence import LogLine

    text = (
        "2026-01-01T00:16:50+0000 node2 kernel: NVRM: Xid (PCI:0000:01:00): 94, pid=7062, "
        "Contained: CE User Channel (0x9). RST: No, D-RST: No"
    )
    line = LogLine("kernel/node2.log", 1, text, 1010.0, "node2", None, "kernel")
    reports = [Report("prometheus", "ok"), Report("logs", "ok"), Report("slurm", "ok")]
    doc = attribution.attribute(Bundle(lines=[line], reports=reports), _ctx())
    assert doc["outcome"] == "gpu_degradation" and doc["action_hint"] == "requeue"
    both = Bundle(lines=[line], series=_xid_bundle(94).series, reports=reports)
    assert attribution.attribute(both, _ctx())["action_hint"] == "requeue"  # they agree


def _decide(doc: dict, pol: policy.Policy) -> decide.Action:
    d = decide.Diagnosis.from_dict(doc)
    nodes = tuple(decide.NodeView(f"node{i}", "IDLE", ("gpu",)) for i in range(1, 9))
    h = decide.History(now=2000.0, job=decide.JobView("FAILED", 0, 1, "gpu", 900.0), nodes=nodes)
    return decide.decide(d, h, pol)


def test_policy_honours_the_hint_unless_switched_off_or_overridden():
    doc = attribution.attribute(_xid_bundle(94), _ctx())
    act = _decide(doc, policy.parse_policy({"mode": "act"}, env={}))
    # the job the contained error killed restarts (the outcome alone drains and leaves it dead),
    # away from the GPU's node (its row remap waits for a GPU reset), which is not drained
    assert act.kind == "requeue" and act.nodes == () and act.exclude == ("node2",)
    assert decide.Reason.CATALOGUE_HINT in act.reasons
    off = policy.parse_policy({"mode": "act", "honour_catalogue_hints": False}, env={})
    plain = _decide(doc, off)
    assert plain.kind == "drain" and decide.Reason.CATALOGUE_HINT not in plain.reasons
    # an operator who set the outcome's action keeps it
    mine = policy.parse_policy({"mode": "act", "actions": {"gpu_degradation": "none"}}, env={})
    assert _decide(doc, mine).kind == "none"


def test_a_hint_outside_the_vocabulary_is_rejected():
    doc = attribution.attribute(_xid_bundle(94), _ctx())
    with pytest.raises(ValueError, match="action_hint"):
        decide.Diagnosis.from_dict({**doc, "action_hint": "reboot_everything"})


# ------------------------------------------------------- a signature as a simulator fault


def test_log_signature_faults_take_their_truth_from_the_scenario_not_the_catalogue(
    tmp_path, monkeypatch
):
    """The catalogue supplies the line; the truth is the scenario's. Before, the truth was
    read from the same catalogue entry the receiver classifies with, so a mislabelled entry
    moved the truth with it and outcome accuracy could not fail."""
    from exporters.sim import Simulation, load_scenario, signature
    from exporters.sim.model import SchedulerError
    from exporters.sim.scenario import FaultTruth, ScenarioError, parse_scenario

    stated = FaultTruth(outcome="workload_crash", action="stop", culprit="none")
    assert signature.truth({"pattern": "missing_file"}, stated) == {
        "kind": "log_signature:missing_file",
        "outcome": "workload_crash",
        "action": "stop",
        "culprit": "none",
        "root_cause": "missing file",
        "truth_source": "scenario",
    }
    # a run-time request that states none has no truth to score against (never the catalogue's)
    unstated = signature.truth({"pattern": "missing_file"})
    assert unstated["outcome"] is None and unstated["action"] is None
    for bad in ({"pattern": "no_such_pattern"}, {"pattern": "megatron_progress"}, {}):
        with pytest.raises(SchedulerError, match="params.pattern"):
            signature.truth(bad, stated)

    # a mislabelled catalogue (missing_file as a GPU fault) leaves the scenario's truth alone
    bad_dir = tmp_path / "catalogue"
    shutil.copytree(HERE, bad_dir, ignore=shutil.ignore_patterns("__pycache__"))
    text = (bad_dir / "patterns.yaml").read_text()
    head, sep, tail = text.partition("  - id: missing_file\n")
    (bad_dir / "patterns.yaml").write_text(
        head + sep + tail.replace("outcome: workload_crash", "outcome: gpu_hardware_fault", 1)
    )
    wrong = load(bad_dir)
    assert next(p for p in wrong.patterns if p.id == "missing_file").outcome == (
        "gpu_hardware_fault"
    )
    monkeypatch.setattr(catalogue, "load_patterns", lambda: wrong.patterns)
    monkeypatch.setattr(catalogue, "outcomes", lambda: wrong.outcomes)
    sc = load_scenario(HERE.parent / "scenarios" / "log-signature.yaml")
    sim = Simulation(sc)
    while sim.elapsed < sc.faults[0].at_s:
        sim.step(5.0)
    (fault,) = sim.cluster.faults.values()
    assert (fault["outcome"], fault["action"], fault["culprit"], fault["nodes"]) == (
        "workload_crash",
        "stop",  # failures.md: a missing dataset is a STOP case (a retry cannot help)
        "none",
        [],
    )

    # a scenario must state a log_signature's truth, and only a log_signature's
    data = sc.model_dump()
    data["faults"][0]["truth"] = None
    with pytest.raises(ScenarioError, match="faults.0.truth"):
        parse_scenario(data)
    data = load_scenario(HERE.parent / "scenarios" / "spin-hang.yaml").model_dump()
    data["faults"][0]["truth"] = {"outcome": "healthy", "action": "none", "culprit": "none"}
    with pytest.raises(ScenarioError, match="truth"):
        parse_scenario(data)


def test_a_new_signature_is_one_catalogue_entry_and_one_scenario():
    """nvswitch_sxid_fatal (a real fatal NVSwitch SXid line) through the fault benchmark:
    simulated kernel line, alerts, attribution, decision, simulated scheduler."""
    from bench import faults as B
    from bench.faults_plan import plan

    (spec,) = plan(seeds=1, pattern="nvswitch-sxid-fatal")
    (fault,) = B.run_one(spec)["faults"]
    assert fault["kind"] == "log_signature:nvswitch_sxid_fatal" and fault["detected"]
    assert fault["truth"] == {
        "outcome": "gpu_hardware_fault",
        "action": "drain_and_requeue",
        "nodes": [fault["nodes"][0]],
    }
    assert fault["outcome_ok"] and fault["action_ok"] and fault["result"] == "executed"
    assert fault["latency_s"] <= 15

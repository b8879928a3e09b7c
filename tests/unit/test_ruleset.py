"""Typed attribution rules: each bad entry is an error naming its file and entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery import attribution, ruleset

RULES = Path(attribution.RULES_DIR)


def _copy(tmp_path: Path) -> Path:
    for f in RULES.glob("*.yaml"):
        (tmp_path / f.name).write_text(f.read_text())
    return tmp_path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_the_packaged_rules_load_and_every_named_symptom_is_produced():
    rules, tolerance = ruleset.load(RULES)
    assert tolerance == 20.0 and len(rules["outcomes"]) >= 10
    assert {"gpu_hardware_fault", "workload_crash"} <= {r["outcome"] for r in rules["outcomes"]}


def test_built_in_symptoms_are_the_ones_attribution_makes():
    assert set(attribution._XID_KIND.values()) <= ruleset.BUILT_IN
    for code in (43, 1, 999):  # cascade, needs a person, unknown to the table
        kind = attribution._xid_symptom(code)
        assert kind is not None and kind[0] in ruleset.BUILT_IN


@pytest.mark.parametrize(
    "file, old, new, message",
    [
        # a misspelt key was silently ignored before (the rule then never fired)
        ("outcomes.yaml", "    culprit: symptom\n", "    culprit: symptom\n    expains: [abort]\n",
         r"outcomes.yaml: outcomes\[0\] \(node_lost\): expains: Extra inputs"),
        ("outcomes.yaml", "symptoms: [network_error]", "symptoms: [network_eror]",
         r"outcomes\[2\] \(network_fault\): symptoms \['network_eror'\]: no pattern"),
        ("outcomes.yaml", "host_bound, spin_wait, job_spin, suspect_score]",
         "host_bound, spin_wait, job_spin, suspect_scor]", r"\(straggler\): explains"),
        ("outcomes.yaml", "unless: [nccl_timeout, nccl_error]", "unless: [nccl_timout]",
         r"unless \['nccl_timout'\]"),
        ("outcomes.yaml", "  - outcome: filesystem\n", "  - outcome: disk_on_fire\n",
         "unknown outcome 'disk_on_fire'"),
        ("outcomes.yaml", "confidence: 0.9\n", "confidence: 9\n", "confidence: Input should"),
        ("outcomes.yaml", "culprit: none\n", "culprit: everyone\n", "culprit: Input should"),
        ("symptoms.yaml", "ECC_DBE_VOL_TOTAL, min: 1,", "ECC_DBE_VOL_TOTAL,",
         r"metrics\[1\] \(ecc_dbe\): .*needs \['min'\]"),
        ("symptoms.yaml", "{id: job_oom, job_state: [OUT_OF_MEMORY],", "{id: job_oom,",
         r"slurm\[5\] \(job_oom\): .*needs job_state"),
        ("symptoms.yaml", "kind: idle, scope: some,", "kind: idle, scope: few,", "scope: Input"),
        ("symptoms.yaml", "role: initiating, outcome: node_lost}", "role: root, outcome: x}",
         "role: Input"),
        ("outcomes.yaml", "tolerance_s: 20", "tolerance_s: -5", "tolerance_s"),
    ],
)  # fmt: skip
def test_bad_rules_name_file_and_entry(tmp_path, file, old, new, message):
    base = _copy(tmp_path)
    _edit(base / file, old, new)
    with pytest.raises(ruleset.RuleError, match=message) as info:
        attribution.load_rules(str(base))
    assert str(info.value).startswith(file)


def test_a_symptom_dropped_from_its_producer_breaks_the_rules_that_name_it(tmp_path):
    """Removing the metric rule that makes `thermal_throttle` leaves the rules that name it
    orphaned (the first one in the file is reported)."""
    base = _copy(tmp_path)
    text = (base / "symptoms.yaml").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("  - {id: thermal_throttle,"))
    (base / "symptoms.yaml").write_text(text.replace(line + "\n", ""))
    orphan = r"\(gpu_hardware_fault\): explains \['thermal_throttle'\]"
    with pytest.raises(ruleset.RuleError, match=orphan):
        ruleset.load(base)


def test_every_series_a_metric_rule_reads_is_queried_by_the_receiver():
    """A rule reads only what `recovery.evidence.prometheus.queries` fetches for a job's
    incident (`node_presence` is its GPU-presence query by node): a series named in a rule
    but left out of the queries would make the rule silent in production, while unit tests
    that build the series by hand pass (the learned step time of the `slowdown` rule)."""
    from recovery.evidence import Context
    from recovery.evidence import prometheus as prom

    rules, _ = ruleset.load(RULES)
    asked = " ".join(prom.queries(Context(job_id="7", nodes=["node1"], start=0.0, end=60.0)))
    for rule in rules["metrics"]:
        for key in ("metric", "reference", "busy_reference", "confirm"):
            name = rule.get(key)
            if name and name != "node_presence":
                assert f"{name}{{" in asked, f"{rule['id']}: {key} {name} is never queried"


def test_a_reference_is_read_by_the_kinds_that_compare_with_one_only(tmp_path):
    d = _copy(tmp_path)
    old = "kind: stall, metric: goodput_job_last_progress_timestamp_seconds,"
    _edit(d / "symptoms.yaml", old, old + " reference: goodput_job_baseline_iteration_seconds,")
    with pytest.raises(ruleset.RuleError, match="reads no `reference`"):
        ruleset.load(d)
    (tmp_path / "busy").mkdir()
    d = _copy(tmp_path / "busy")
    old = "kind: slowdown, metric: goodput_job_iteration_seconds,"
    _edit(d / "symptoms.yaml", old, old + " busy_reference: DCGM_FI_DEV_GPU_UTIL,")
    with pytest.raises(ruleset.RuleError, match="reads no `busy_reference`"):
        ruleset.load(d)

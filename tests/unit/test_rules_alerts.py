"""alerts.yaml: schema, generated rule files, promtool unit tests, and the in-process evaluator."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import catalogue
from alertdsl import evaluation as E
from alertdsl import rules
from alertdsl import spec as A
from goodput.commands import rules as rules_cmd

ROOT = Path(__file__).resolve().parents[2]
AM = ROOT / "alertmanager"
ALL_CASES = yaml.safe_load((AM / "tests" / "cases.yaml").read_text())
CASES = [c for c in ALL_CASES if "alert" in c]
BRIEF_NAMES = {
    "GoodputGPUFatalXid", "GoodputGPUDoubleBitECC", "GoodputGPUMissing", "GoodputNodeLost",
    "GoodputJobHung", "GoodputJobSlow", "GoodputJobStraggler", "GoodputJobAnomaly",
    "GoodputGPUAnomaly",
    "GoodputGPUDegradation", "GoodputJobLogFault", "GoodputJobFailed", "GoodputDetectorDown",
    "GoodputExporterDown", "GoodputActionsRetrying", "GoodputReceiverDown",
    "GoodputAlertsNotDelivered",
}  # fmt: skip


def promtool() -> str:
    path = shutil.which("promtool")
    if not path:
        pytest.skip("promtool not installed (Debian package 'prometheus'; stack.sh installs it)")
    return path


@pytest.fixture(scope="module")
def spec() -> A.Spec:
    return A.load()


def test_every_agreed_alert_exists_with_annotations(spec):
    assert {a.name for a in spec.alerts} == BRIEF_NAMES
    runbooks = (AM / "runbooks.md").read_text()
    anchors = {h.strip().lower() for h in re.findall(r"^## (\S+)\s*$", runbooks, re.M)}
    for a in spec.alerts:
        assert a.summary and a.description, a.name
        assert a.name.lower() in anchors, f"runbooks.md lacks a '## {a.name}' section"


def test_generated_files_are_up_to_date():
    for path, text in rules_cmd.outputs().items():
        assert path.read_text() == text, f"{path} is stale: run `goodput rules generate`"


def test_promtool_check_rules_is_clean():
    out = subprocess.run(
        [promtool(), "check", "rules", str(AM / "rules" / "goodput.yml")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_promtool_unit_tests_pass():
    from goodput.commands import rules as rules_cmd

    files = sorted(p.name for p in rules_cmd.outputs() if p.parent.name == "tests")
    out = subprocess.run(
        [promtool(), "test", "rules", *files],
        cwd=AM / "tests", capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_has_a_firing_and_a_quiet_case(spec):
    fires = {c["alert"] for c in CASES if c.get("expect")}
    quiet = {c["alert"] for c in CASES if not c.get("expect")}
    names = {a.name for a in spec.alerts}
    assert names - fires == set(), "alerts without a firing case"
    assert names - quiet == set(), "alerts without a quiet case"
    signals = {(c["alert"], e.get("signal")) for c in CASES for e in c.get("expect") or []}
    for a in spec.alerts:
        for cond in a.conditions:
            multi = len(a.conditions) > 1
            assert (a.name, cond.signal if multi else None) in signals, (a.name, cond.signal)


def test_fatal_xids_follow_the_catalogue(spec):
    xids = catalogue.default().xids
    critical = {c for c, x in xids.items() if x.severity == "critical"}
    degradation = {
        c for c, x in xids.items() if x.severity == "warning" and x.outcome == "gpu_degradation"
    }
    conds = {c.signal: c for c in spec.alert("GoodputGPUFatalXid").conditions}
    assert {int(v) for v in conds["dcgm_xid"].values} == critical
    kernel = dict(conds["kernel_log_xid"].labels)["xid"]
    assert {int(x) for x in kernel.removeprefix("=~").split("|")} == critical
    deg = {c.signal: c for c in spec.alert("GoodputGPUDegradation").conditions}
    assert {int(v) for v in deg["degradation_xid"].values} == degradation


def test_log_fault_patterns_exist_in_the_catalogue(spec):
    (cond,) = spec.alert("GoodputJobLogFault").conditions
    ids = dict(cond.labels)["pattern"].removeprefix("=~").split("|")
    known = {p.id for p in catalogue.load_patterns()}
    assert set(ids) - known == set()
    # one list: the patterns the catalogue flags `alert: true`
    assert set(ids) == {p.id for p in catalogue.load_patterns() if p.alert}
    roles = {p.id: p.role for p in catalogue.load_patterns()}
    assert all(roles[i] != "info" for i in ids), "progress/info patterns must not alert"


def test_every_alert_carries_severity_scope_and_runbook(spec):
    doc = yaml.safe_load((AM / "rules" / "goodput.yml").read_text())
    alerting = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
    assert {r["alert"] for r in alerting} == BRIEF_NAMES
    for r in alerting:
        assert r["labels"]["severity"] in ("critical", "warning", "info")
        assert r["annotations"]["runbook_url"].startswith("alertmanager/runbooks.md#")


def test_dcgm_conditions_map_host_and_job_labels(spec):
    expr = rules.condition_expr(spec.alert("GoodputGPUFatalXid").conditions[0])
    for needle in ('"node", "$1", "Hostname"', '"node", "$1", "hostname"',
                   '"job_id", "$1", "hpc_job"', "group_left (job_id)", rules.JOB_INFO):  # fmt: skip
        assert needle in expr


def test_threshold_reads_the_single_source(spec):
    raw = {a["name"]: a for a in yaml.safe_load(A.DEFAULT_PATH.read_text())["alerts"]}
    for name in ("GoodputJobAnomaly", "GoodputGPUAnomaly", "GoodputJobStraggler"):
        (cond,) = [c for c in raw[name]["conditions"] if "threshold" in c]
        assert A.threshold(name, spec) == float(cond["threshold"]) > 0
    with pytest.raises(KeyError):
        A.threshold("NoSuchAlert", spec)


BASE = {
    "version": 1,
    "alerts": [
        {
            "name": "GoodputX",
            "severity": "warning",
            "scope": "job",
            "summary": "s",
            "description": "d",
            "conditions": [{"kind": "threshold", "metric": "goodput_x", "op": ">", "threshold": 1}],
        }
    ],
}


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"severity": "page"}, "severity"),
        ({"scope": "cluster"}, "scope"),
        ({"name": "CPUHot"}, "Goodput"),
        ({"for": "5 minutes"}, "duration"),
        ({"conditions": []}, "condition"),
        ({"conditions": [{"kind": "magic", "metric": "x"}]}, "kind"),
        ({"conditions": [{"kind": "threshold", "metric": "x", "op": "~", "threshold": 1}]}, "op"),
        ({"conditions": [{"kind": "threshold", "metric": "x", "threshold": "high"}]}, "number"),
        ({"conditions": [{"kind": "threshold", "metric": "bad-name", "threshold": 1}]}, "metric"),
        ({"conditions": [{"kind": "increase", "metric": "x", "threshold": 1}]}, "window"),
        ({"conditions": [{"kind": "gone", "metric": "x", "window": "1m"}]}, "by"),
        ({"conditions": [{"kind": "promql", "expr": "up == 0"}]}, "signal"),
        (
            {"conditions": [{"kind": "threshold", "metric": "x", "threshold": 1, "typo": 1}]},
            "unknown",
        ),
        (
            {
                "conditions": [
                    {
                        "kind": "threshold",
                        "metric": "x",
                        "threshold": 1,
                        "labels": {"a": 'x"} or vector(1) #'},
                    }
                ]
            },  # fmt: skip
            "label",
        ),
    ],
)
def test_schema_errors_are_clear(patch, message):
    doc = yaml.safe_load(yaml.safe_dump(BASE))
    doc["alerts"][0].update(patch)
    with pytest.raises(A.AlertsError, match=message):
        A.parse(doc)


def test_duplicate_alert_names_are_rejected():
    doc = yaml.safe_load(yaml.safe_dump(BASE))
    doc["alerts"].append(doc["alerts"][0])
    with pytest.raises(A.AlertsError, match="duplicate"):
        A.parse(doc)


# ----------------------------------------------- the evaluator agrees with promtool's cases

_TOKEN = re.compile(r"^(-?[0-9.]+(?:e[+-]?[0-9]+)?)(?:([+-])([0-9.]+))?x([0-9]+)$")


def expand(values: str) -> list[float | None]:
    """promtool's series notation -> one value (or None for missing/stale) per step."""
    out: list[float | None] = []
    for tok in values.split():
        if tok in ("_", "stale"):
            out.append(None)
        elif tok.startswith("_x"):
            out.extend([None] * int(tok[2:]))
        elif m := _TOKEN.match(tok):
            start, sign, step, n = m.groups()
            d = float(step or 0) * (-1 if sign == "-" else 1)
            out.extend(float(start) + d * i for i in range(int(n) + 1))
        else:
            out.append(float(tok))
    return out


def case_frame(case: dict) -> pd.DataFrame:
    """The case's input series as a recording-style wide frame (dcgm labels mapped)."""
    rows = []
    for s in case["series"]:
        name, _, rest = s["series"].partition("{")
        labels = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        labels["node"] = labels.pop("Hostname", labels.pop("hostname", labels.get("node", "")))
        labels["job_id"] = labels.pop("hpc_job", labels.get("job_id", ""))
        for i, v in enumerate(expand(s["values"])):
            if v is not None:
                rows.append({"timestamp": float(i), **labels, name: v})
    return pd.DataFrame(rows)


def _seconds(text: str) -> float:
    return A.duration_seconds(text)


EVALUABLE_CASES = [
    c
    for c in CASES
    # skip cases that need what a recording already resolves (the Slurm job join) or raw PromQL
    if not any("goodput_slurm_job_node_info" in s["series"] for s in c["series"])
    and all(
        A.load().alert(c["alert"]).conditions[0].evaluable
        if "signal" not in e
        else {x.signal: x for x in A.load().alert(c["alert"]).conditions}[e["signal"]].evaluable
        for e in c.get("expect") or []
    )
]


@pytest.mark.parametrize("case", EVALUABLE_CASES, ids=lambda c: f"{c['alert']}: {c['name']}")
def test_in_process_evaluation_agrees_with_promtool_cases(case, spec):
    frame = case_frame(case)
    fired = E.evaluate(case["alert"], frame, spec)
    at = fired[np.isclose(fired["timestamp"].astype(float), _seconds(case["eval_time"]))]
    expected = case.get("expect") or []
    if not expected:
        assert at.empty, at.to_dict("records")
        return
    assert len(at) >= 1
    for exp in expected:
        want = {k: str(v) for k, v in exp.items() if k in ("node", "gpu", "job_id", "pattern")}
        match = at
        for k, v in want.items():
            match = match[match[k].fillna("").astype(str) == v]
        assert not match.empty, (want, at.to_dict("records"))


def test_evaluate_respects_for_and_reports_first_firing(spec):
    t = np.arange(0, 60, 1.0)
    score = np.where(t >= 10, 1.5, 0.2)
    frame = pd.DataFrame(
        {"timestamp": t, "job_id": "7", "detector": "combined", "goodput_job_anomaly_score": score}
    )
    fired = E.evaluate("GoodputJobAnomaly", frame, spec)
    assert fired["timestamp"].min() == 10 + _seconds(spec.alert("GoodputJobAnomaly").for_)
    assert set(fired["job_id"]) == {"7"}
    assert E.evaluate("GoodputJobAnomaly", frame.assign(detector="progress"), spec).empty


def test_evaluate_skips_missing_metrics_and_needs_timestamps(spec):
    frame = pd.DataFrame({"timestamp": [0.0], "node": ["node1"], "goodput_other": [1.0]})
    assert E.evaluate("GoodputGPUFatalXid", frame, spec).empty
    with pytest.raises(ValueError, match="timestamp"):
        E.evaluate("GoodputGPUFatalXid", frame.drop(columns="timestamp"), spec)


def test_a_counter_rise_is_seen_when_the_job_label_changes_at_the_fault(spec):
    t = np.arange(0.0, 60.0, 5.0)
    frame = pd.DataFrame(
        {
            "timestamp": t,
            "node": "node2",
            "gpu": "5",
            "job_id": np.where(t < 30, "1001", ""),  # the job dies with the error
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": np.where(t < 30, 0.0, 1.0),
        }
    )
    fired = E.evaluate("GoodputGPUDoubleBitECC", frame, spec)
    assert fired["timestamp"].min() == 35.0  # first sample at 1 (t=30) + `for` (2s) -> next one
    reset = frame.assign(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL=np.where(t < 30, 3.0, 0.0))
    assert E.evaluate("GoodputGPUDoubleBitECC", reset, spec).empty


def test_evaluate_all_names_each_firing_alert(spec):
    t = np.arange(0.0, 40.0, 5.0)
    frame = pd.DataFrame(
        {
            "timestamp": t,
            "node": "node2",
            "gpu": "3",
            "job_id": "1001",
            "DCGM_FI_DEV_XID_ERRORS": np.where(t >= 10, 79.0, 0.0),
        }
    )
    fired = E.evaluate_all(frame, spec)
    assert set(fired["alertname"]) == {"GoodputGPUFatalXid"}
    assert fired["timestamp"].min() == 15.0 and set(fired["severity"]) == {"critical"}
    assert E.evaluate_all(frame.assign(DCGM_FI_DEV_XID_ERRORS=13.0), spec).empty

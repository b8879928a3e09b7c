"""`promtool test rules` documents from hand-written cases (alertmanager/tests/cases.yaml)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from alertdsl.rules import HEADER, Dumper, described, fmt_number
from alertdsl.spec import AlertsError, Spec, required

_DURATION = re.compile(r"[1-9][0-9]*[smh]")  # one unit: one spelling, one file name per interval
_TEMPLATE = re.compile(r"\{\{\s*\$(labels\.([a-zA-Z_][a-zA-Z0-9_]*)|value)\s*\}\}")
# `{{ with $labels.x }} ... {{ . }} ... {{ end }}`: the middle, with `.` as x, where x is set
_WITH = re.compile(
    r"\{\{\s*with \$labels\.([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}(.*?)\{\{\s*end\s*\}\}", re.S
)
_DOT = re.compile(r"\{\{\s*\.\s*\}\}")


def expand(template: str, labels: Mapping[str, str], value: float) -> str:
    """Prometheus' annotation templating, for the forms alerts.yaml uses."""

    def sub(m: re.Match[str]) -> str:
        return fmt_number(value) if m.group(1) == "value" else str(labels.get(m.group(2), ""))

    def with_(m: re.Match[str]) -> str:
        got = str(labels.get(m.group(1), ""))
        return _DOT.sub(lambda _: got, m.group(2)) if got else ""

    return _TEMPLATE.sub(sub, _WITH.sub(with_, template))


DEFAULT_EVALUATION = "1s"


def evaluations(cases: Any) -> list[str]:
    """The rule evaluation intervals the cases ask for (`evaluation_interval`, default 1 s), in
    first-use order: promtool evaluates every rule at each step up to a test's eval time, so a
    case that waits out a long `for` takes a coarser interval, in a file of its own."""
    if not isinstance(cases, list):
        raise AlertsError("cases: expected a list")
    found = [str(c.get("evaluation_interval", DEFAULT_EVALUATION)) for c in cases]
    for ev in found:
        if not _DURATION.fullmatch(ev):
            raise AlertsError(f"cases: evaluation_interval {ev!r} is not a duration like 15s or 1m")
    return list(dict.fromkeys([DEFAULT_EVALUATION, *found]))


def promtool_tests(
    spec: Spec, cases: Any, rule_file: str, evaluation: str = DEFAULT_EVALUATION
) -> dict[str, Any]:
    """A `promtool test rules` document from the hand-written cases (see tests/cases.yaml) whose
    evaluation interval is `evaluation`.

    Each case names an alert, its input series, an eval time and the alerts expected then
    (labels without severity/scope, plus `value` for the annotations; empty = stays quiet).
    """
    if not isinstance(cases, list):
        raise AlertsError("cases: expected a list")
    tests = []
    records = {r["record"] for r in spec.recording}
    for i, case in enumerate(cases):
        where = f"case {i} ({case.get('name', '?')})"
        if str(case.get("evaluation_interval", DEFAULT_EVALUATION)) != evaluation:
            continue
        if "record" in case:  # a recording rule: the samples it must produce
            if case["record"] not in records:
                raise AlertsError(f"{where}: no recording rule {case['record']!r}")
            tests.append(
                {
                    "name": f"{case['record']}: {required(case, 'name', where)}",
                    "interval": case.get("interval", "1s"),
                    "input_series": required(case, "series", where),
                    "promql_expr_test": [
                        {
                            "expr": case["record"],
                            "eval_time": required(case, "eval_time", where),
                            "exp_samples": required(case, "expect", where),
                        }
                    ],
                }
            )
            continue
        alert = spec.alert(required(case, "alert", where))
        expected = []
        for exp in case.get("expect") or []:
            value = float(exp.get("value", 1))
            labels = {str(k): str(v) for k, v in exp.items() if k != "value"}
            if "signal" not in labels:
                if len(alert.conditions) != 1:
                    raise AlertsError(f"{where}: say which condition fires ('signal')")
                labels["signal"] = alert.conditions[0].signal
            labels |= {"severity": alert.severity, "scope": alert.scope}
            ann_labels = labels | {"alertname": alert.name}
            cond = next(c for c in alert.conditions if c.signal == labels["signal"])
            expected.append(
                {
                    "exp_labels": labels,
                    "exp_annotations": {
                        "summary": expand(alert.summary, ann_labels, value),
                        "description": expand(
                            described(alert.description, cond), ann_labels, value
                        ),
                        "runbook_url": spec.runbook_url(alert.name),
                    },
                }
            )
        tests.append(
            {
                "name": f"{alert.name}: {required(case, 'name', where)}",
                "interval": case.get("interval", "1s"),
                "input_series": required(case, "series", where),
                "alert_rule_test": [
                    {
                        "eval_time": required(case, "eval_time", where),
                        "alertname": alert.name,
                        "exp_alerts": expected,
                    }
                ],
            }
        )
    return {"rule_files": [rule_file], "evaluation_interval": evaluation, "tests": tests}


def dump_promtool_tests(spec: Spec, cases_path: str | Path, rule_file: str) -> dict[str, str]:
    """One `promtool test rules` file's text per evaluation interval the cases use."""
    try:
        cases = yaml.safe_load(Path(cases_path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise AlertsError(f"cannot read {cases_path}: {e}") from e
    header = HEADER.replace("alertmanager/alerts.yaml", "alerts.yaml and tests/cases.yaml")
    return {
        ev: header
        + yaml.dump(
            promtool_tests(spec, cases, rule_file, ev), Dumper=Dumper, sort_keys=False, width=100
        )
        for ev in evaluations(cases)
    }

"""`goodput bench e2e`: faults through the real stack, timed on the wall clock.

The simulator runs in real time under real Slurm; real Prometheus evaluates the generated alert
rules, real Alertmanager delivers to the receiver, and the receiver acts on real Slurm. For each
fault: onset → first alert at the receiver → diagnosis → action done in Slurm → job running
again. The intervals the stack ran with are read from its own configuration files.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from goodput import demo, stack

RESULTS = Path(__file__).resolve().parent / "results"


def intervals() -> dict[str, str]:
    """Scrape and evaluation intervals (Prometheus) and grouping delays (Alertmanager)."""
    prom = yaml.safe_load((stack.REPO / "compose" / "local" / "prometheus.yml").read_text())
    am = yaml.safe_load((stack.REPO / "alertmanager" / "alertmanager.yml").read_text())
    route = am.get("route", {})
    return {
        "scrape_interval": prom["global"]["scrape_interval"],
        "evaluation_interval": prom["global"]["evaluation_interval"],
        "group_wait": route.get("group_wait", "30s"),
        "group_interval": route.get("group_interval", "5m"),
        "detector_interval": "2s",
    }


def _since(onset: float, t: float | None) -> float | None:
    return round(t - onset, 1) if t else None


def row(o: demo.Outcome) -> dict[str, Any]:
    return {
        "fault": o.fault.kind,
        "job_id": o.job_id,
        "node": o.node,
        "to_alert_s": _since(o.onset, o.detected),
        "to_diagnosis_s": _since(o.onset, o.diagnosed),
        "to_action_s": _since(o.onset, o.acted),
        "to_running_again_s": _since(o.onset, o.recovered),
        "to_node_back_s": _since(o.onset, o.back_in_service),
        "outcome": o.outcome,
        "culprits": o.culprits,
        "action": f"{o.action} ({o.action_state})",
        "expected_action": o.fault.expect_action,
        "handled": o.action == o.fault.expect_action and o.action_state == "executed",
    }


def markdown(report: dict[str, Any]) -> str:
    cols = ("fault", "to_alert_s", "to_diagnosis_s", "to_action_s", "to_running_again_s",
            "to_node_back_s", "outcome", "action", "handled")  # fmt: skip
    lines = [
        "# End-to-end benchmark (real stack, wall clock)",
        "",
        f"Ran {report['ran_at']} on {report['machine']}. Intervals: "
        + ", ".join(f"{k} {v}" for k, v in report["intervals"].items())
        + ".",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for r in report["faults"]:
        lines.append("| " + " | ".join("-" if r[c] is None else str(r[c]) for c in cols) + " |")
    s = report["summary"]
    lines += [
        "",
        f"Handled as expected: {s['handled']}/{s['faults']}; median onset → action "
        f"{s['median_to_action_s']} s; median onset → alert {s['median_to_alert_s']} s.",
    ]
    return "\n".join(lines) + "\n"


def run(
    say: Callable[[str], None], faults: tuple[demo.Fault, ...] = demo.FAULTS,
    out: Path | None = RESULTS, warmup_s: float = 45.0,
) -> dict[str, Any]:  # fmt: skip
    """Run `faults` through the real stack; write JSON and markdown to `out` (None: don't)."""
    results = demo.run(say, faults=faults, warmup_s=warmup_s)
    rows = [row(o) for o in results]

    def median(key: str) -> float | None:
        vals = [r[key] for r in rows if r[key] is not None]
        return round(statistics.median(vals), 1) if vals else None

    report = {
        "ran_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": f"{platform.machine()}, {stack.cpu_count()} cores",
        "intervals": intervals(),
        "faults": rows,
        "summary": {
            "faults": len(faults),
            "handled": sum(r["handled"] for r in rows),
            "median_to_alert_s": median("to_alert_s"),
            "median_to_action_s": median("to_action_s"),
        },
    }
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "e2e.json").write_text(json.dumps(report, indent=2) + "\n")
        (out / "e2e.md").write_text(markdown(report))
    return report

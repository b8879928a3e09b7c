"""Attribution must recognise what the alerts fire on: a rise that fires an alert is evidence.

Found by `goodput bench faults`: GoodputGPUDegradation fires on a correctable-ECC rise > 10 in
5 min, but the attribution asked for 20, so an early diagnosis said `unknown` (hold_for_person).
"""

from __future__ import annotations

from catalogue import alerts as A
from recovery import attribution
from recovery.evidence import Bundle, Context, Report, Series

START = 1_735_689_600.0


def _thresholds() -> dict[str, float]:
    """metric -> the alert threshold of every DCGM `increase` condition in alerts.yaml."""
    return {
        c.metric: c.threshold
        for a in A.load().alerts
        for c in a.conditions
        if c.kind == "increase" and c.source == "dcgm" and c.threshold is not None
    }


def test_increase_symptoms_are_no_stricter_than_the_alerts() -> None:
    rules = attribution.load_rules()
    alert = _thresholds()
    checked = 0
    for rule in rules.metrics:
        if rule.get("kind") == "increase" and rule.get("metric") in alert:
            assert rule["min"] <= max(alert[rule["metric"]], 1), rule
            checked += 1
    assert checked >= 2


def test_a_correctable_ecc_rise_that_fires_the_alert_is_a_degradation() -> None:
    sbe = Series(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        [(START + 5 * i, float(max(0, i - 2))) for i in range(15)],  # rises by 12 (> 10)
        node="node2",
        gpu="3",
        job_id="1001",
    )
    flat = Series(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        [(START + 5 * i, 0.0) for i in range(15)],
        node="node1",
        gpu="0",
        job_id="1001",
    )
    bundle = Bundle(
        series=[sbe, flat],
        reports=[Report("prometheus", "ok"), Report("logs", "ok"), Report("slurm", "ok")],
    )
    ctx = Context(job_id="1001", nodes=["node1", "node2"], start=START, end=START + 70)
    doc = attribution.attribute(bundle, ctx)
    assert doc["outcome"] == "gpu_degradation"
    assert doc["affected_nodes"] == ["node2"]

"""Alertmanager's inhibition as the fault benchmark applies it (bench.inhibition): the rules of
alertmanager/alertmanager.yml, Alertmanager's matcher and `equal` semantics, and the bench's
receiver holding a muted alert back. The same answers as a real Alertmanager:
tests/integration/test_alerting_alertmanager.py."""

from __future__ import annotations

from typing import Any

import pytest

from bench.inhibition import Inhibition, Matcher, Rule
from bench.receiver import Receiver
from recovery.clock import ManualClock

XID = {"alertname": "GoodputGPUFatalXid", "node": "node2", "gpu": "3", "job_id": "42"}
HUNG = {"alertname": "GoodputJobHung", "scope": "job", "job_id": "42"}
ANOMALY = {"alertname": "GoodputJobAnomaly", "scope": "job", "job_id": "42"}


def test_matchers_are_anchored_and_an_absent_label_is_empty() -> None:
    assert Matcher.parse('alertname=~"GoodputJob.+"').matches(HUNG)
    assert not Matcher.parse('alertname=~"GoodputJob"').matches(HUNG)  # anchored: whole value
    assert Matcher.parse('job_id!~".+"').matches({"alertname": "x"})
    assert Matcher.parse('node=""').matches(HUNG)
    assert Matcher.parse("node!=node2").matches(HUNG)  # unquoted value
    assert Matcher.parse(r'summary="say \"hi\""').matches({"summary": 'say "hi"'})
    with pytest.raises(ValueError, match="not an Alertmanager matcher"):
        Matcher.parse("alertname ~ GoodputJobHung")


def test_equal_labels_absent_on_both_sides_count_as_the_same() -> None:
    rule = Rule.from_config(
        {"source_matchers": ['alertname="A"'], "target_matchers": ['alertname="B"'],
         "equal": ["job_id"]}
    )  # fmt: skip
    assert rule.mutes({"alertname": "B"}, [{"alertname": "A"}])
    assert not rule.mutes({"alertname": "B", "job_id": "1"}, [{"alertname": "A"}])
    with pytest.raises(ValueError, match="source_match"):
        Rule.from_config({"source_match": {"alertname": "A"}, "target_match": {}})


def test_an_alert_on_both_sides_is_not_muted_by_itself() -> None:
    rule = Rule.from_config(
        {"source_matchers": ['severity="critical"'], "target_matchers": ['job_id=~".+"'],
         "equal": ["job_id"]}
    )  # fmt: skip
    both = {"severity": "critical", "job_id": "7"}
    assert not rule.mutes(both, [both])
    assert rule.mutes({"job_id": "7"}, [both])


def test_our_rules_mute_a_jobs_alerts_under_its_hardware_alert_only() -> None:
    inhibition = Inhibition.load()
    other = dict(HUNG, job_id="43")
    slow = {"alertname": "GoodputJobSlow", "scope": "job", "job_id": "44"}
    slow_anomaly = dict(ANOMALY, job_id="44")
    assert inhibition.muted([XID, HUNG, ANOMALY, other, slow, slow_anomaly]) == [
        False, True, True, False, False, True,
    ]  # fmt: skip
    assert inhibition.muted([HUNG, ANOMALY]) == [False, True]  # Hung mutes the combined score
    assert inhibition.muted([ANOMALY]) == [False]


class _Nothing:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the receiver asked for {name} while alerts were only posted")


def test_the_benchs_receiver_holds_a_muted_alert_back_until_it_is_not(tmp_path) -> None:
    rx = Receiver(tmp_path, ManualClock(1000.0), _Nothing(), tmp_path, _Nothing())  # type: ignore[arg-type]
    try:
        assert rx.deliver(1000.0, [HUNG, ANOMALY]) == 1  # the Hung alert; the anomaly muted
        assert rx.deliver(1005.0, [ANOMALY]) == 2  # Hung resolved; the anomaly no longer muted
        (inc,) = rx.http.get("/api/v1/incidents").json()["items"]
        detail = rx.http.get(f"/api/v1/incidents/{inc['id']}").json()
        starts = {a["labels"]["alertname"]: a["starts_at"] for a in detail["alerts"]}
        assert starts["GoodputJobAnomaly"] == starts["GoodputJobHung"]  # it fired since 1000
    finally:
        rx.close()


def test_a_muted_alerts_resolve_waits_for_its_source_to_end(tmp_path) -> None:
    rx = Receiver(tmp_path, ManualClock(1000.0), _Nothing(), tmp_path, _Nothing())  # type: ignore[arg-type]
    try:
        assert rx.deliver(1000.0, [HUNG]) == 1
        assert rx.deliver(1005.0, [XID]) == 1  # the XID; Hung's resolve muted under it
        assert rx.deliver(1010.0, []) == 2  # the XID ended: both resolves go out
    finally:
        rx.close()

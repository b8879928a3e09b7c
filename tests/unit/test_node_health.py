"""A node's way back to service: checks run as argv with bounds, their verdicts, and the
repeat-offender rules over a node's history."""

from __future__ import annotations

import sys

import pytest

from recovery import node_health as nh
from recovery.policy import PolicyError, load_policy, parse_policy

DAY = 86400.0
PY = sys.executable


def _cfg(**kw) -> nh.ReturnToService:
    checks = {"quick": nh.Command(argv=(PY, "-c", "0")), "deep": nh.Command(argv=(PY, "-c", "0"))}
    return nh.ReturnToService(enabled=True, checks=checks, **kw)


def test_a_check_runs_as_argv_with_the_node_filled_in_and_no_shell():
    cmd = nh.Command(argv=(PY, "-c", "import sys; print(sys.argv[1:])", "{node}", "$(id)"))
    r = nh.run(cmd, "node-1.rack", level="quick")
    assert r.passed and r.exit_code == 0
    assert r.output.strip() == "['node-1.rack', '$(id)']"  # no shell ever saw "$(id)"


def test_a_failing_check_keeps_its_exit_code_and_output():
    cmd = nh.Command(argv=(PY, "-c", "import sys; print('DCGM diag: FAIL'); sys.exit(3)"))
    r = nh.run(cmd, "node1")
    assert not r.passed and r.exit_code == 3 and "FAIL" in r.output


def test_a_check_that_hangs_is_cut_at_its_time_limit():
    r = nh.run(nh.Command(argv=(PY, "-c", "import time; time.sleep(30)"), timeout_s=0.5), "n1")
    assert not r.passed and r.exit_code is None and "timed out" in r.output
    assert r.duration_s < 10


def test_output_is_cut_to_its_bound_and_a_missing_program_is_a_failed_check():
    big = nh.run(nh.Command(argv=(PY, "-c", "print('x' * 100000)"), max_output_bytes=1000), "node1")
    assert big.passed and len(big.output) == 1000
    gone = nh.run(nh.Command(argv=("/nonexistent/dcgmi", "diag")), "node1")
    assert not gone.passed and "could not run" in gone.output


def test_the_node_name_is_validated_before_anything_runs():
    with pytest.raises(ValueError):
        nh.expand(("ssh", "{node}"), "-oProxyCommand=evil")


def _result(passed: bool) -> nh.CheckResult:
    return nh.CheckResult("node1", "quick", passed, 0 if passed else 1, "", 0.0, 1.0)


def test_verdicts_resume_keep_drained_rma_and_never_touch_a_persons_drain():
    cfg = _cfg(rma_after_failures=2)
    assert nh.after_check(_result(True), 0, True, cfg) == nh.Step("resume", "goodput: passed quick")
    assert nh.after_check(_result(False), 0, True, cfg) == nh.Step(
        "keep_drained", "goodput: failed quick"
    )
    assert nh.after_check(_result(False), 1, True, cfg).kind == "rma"
    assert nh.after_check(_result(True), 0, False, cfg).kind == "leave"
    assert nh.after_check(_result(False), 5, False, cfg).kind == "leave"


def _inc(at: float, gpu: str | None = None, xid: int | None = None, user: str | None = None):
    return nh.NodeEvent(at=at, node="node1", kind="incident", gpu=gpu, xid=xid, user=user)


def test_repeat_offender_rules_from_the_default_policy():
    rules = load_policy(env={}).return_to_service.repeat_offenders
    now = 30 * DAY
    five = [_inc(now - i * DAY) for i in range(5)]
    names = lambda ev: {r.name for r, _ in nh.escalations(ev, rules, now)}  # noqa: E731
    assert names(five) == {"five-in-a-week"}
    assert names(five[:4]) == set()
    assert names([_inc(now - 8 * DAY - i) for i in range(9)]) == set()  # outside the window
    same = [_inc(now - 3600, "3", 79), _inc(now - 60, "3", 79)]
    assert names(same) == {"same-xid-same-gpu"}
    assert names([_inc(now - 3600, "3", 79), _inc(now - 60, "4", 79)]) == set()
    users = [_inc(now - i * 3600, user=u) for i, u in enumerate(["ana", "bo", "cy"])]
    hits = nh.escalations(users, rules, now)
    assert [r.name for r, _ in hits] == ["several-users"] and "ana, bo, cy" in hits[0][1]


def test_the_same_xid_twice_on_one_gpu_asks_for_the_deep_check():
    cfg = _cfg(repeat_offenders=load_policy(env={}).return_to_service.repeat_offenders)
    now = 10 * DAY
    assert nh.check_level([_inc(now - 10, "0", 48)], cfg, now) == "quick"
    assert nh.check_level([_inc(now - 10, "0", 48), _inc(now - 5, "0", 48)], cfg, now) == "deep"


def test_mtbi():
    assert nh.mtbi_s([_inc(0), _inc(100), _inc(400)]) == 200
    assert nh.mtbi_s([_inc(5)]) is None


@pytest.mark.parametrize(
    "doc, needle",
    [
        ({"enabled": True, "checks": {}}, "has no entry under checks"),
        ({"checks": {"quick": {"argv": []}}}, "argv"),
        ({"checks": {"quick": {"argv": ["x"], "timeout_s": -1}}}, "timeout_s"),
        ({"repeat_offenders": [{"name": "r", "window_s": 1, "then": "rma"}]}, "exactly one"),
        ({"repeat_offenders": [{"name": "r", "window_s": 1, "incidents": 2, "then": "x"}]}, "then"),
        ({"shell": "dcgmi diag"}, "shell"),
    ],
)
def test_bad_policy_sections_are_errors_that_name_the_key(doc, needle):
    with pytest.raises(PolicyError, match=needle):
        parse_policy({"return_to_service": doc})

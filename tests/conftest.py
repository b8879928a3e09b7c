"""Shared fixtures: the local stack starts once per session (or is reused) for integration."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
import requests

from goodput import stack

ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/integration/" in str(item.fspath) or "/chaos/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


def strict_ci() -> bool:
    """Under CI=true a test that skips (a missing tool, a missing package) is a failure."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def _fail_skip(report) -> None:
    if strict_ci() and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which counts as a failure: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_skip(outcome.get_result())


def _ready(url: str) -> bool:
    try:
        return requests.get(f"{url}/-/ready", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def _stack_running() -> bool:
    env = stack.stack_env()
    prom = env.get("GOODPUT_PROMETHEUS_URL")
    if not prom or not _ready(prom):
        return False
    check = subprocess.run(
        ["scontrol", "ping"], env={**os.environ, **env}, capture_output=True, text=True, timeout=10
    )
    return "UP" in check.stdout


@pytest.fixture(scope="session")
def local_stack():
    """The real local stack's environment (SLURM_CONF, URLs), held by this session alone,
    with no Slurm job on it. Started here if not running, and stopped at the end only if this
    session started it."""
    with stack.in_use():  # one test session on the stack at a time
        started = False
        if not _stack_running():
            if stack.run_stack("start") != 0:
                pytest.fail("the local stack failed to start: see compose/local/stack.sh output")
            started = True
        if stack.run_stack("clear") != 0:  # jobs of a run that died before its stop
            pytest.fail("could not cancel the jobs left on the local stack")
        env = stack.stack_env()
        os.environ.update(env)
        yield env
        if started and not os.environ.get("GOODPUT_KEEP_STACK"):
            stack.run_stack("stop")


@pytest.fixture(scope="session")
def prometheus_url(local_stack) -> str:
    return local_stack["GOODPUT_PROMETHEUS_URL"]


@pytest.fixture(scope="session")
def alertmanager_url(local_stack) -> str:
    return local_stack["GOODPUT_ALERTMANAGER_URL"]


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.25, what: str = "condition"):
    """Poll `predicate` until it returns a truthy value; fail the test with `what` on timeout."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {what} (last: {last!r})")

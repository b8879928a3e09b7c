"""Shared fixtures: the local stack starts once per session (or is reused) for integration."""

from __future__ import annotations

import contextlib
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


def pytest_collection_finish(session):
    """One test session on the local stack at a time: one whose selected tests use
    `local_stack` holds it from here (before any test's timeout runs) to its exit."""
    if not any("local_stack" in getattr(i, "fixturenames", ()) for i in session.items):
        return
    hold = contextlib.ExitStack()
    try:
        hold.enter_context(stack.in_use())
    except stack.StackBusy as exc:
        pytest.exit(str(exc), returncode=3)
    session.config.add_cleanup(hold.close)


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
    """The real local stack's environment (SLURM_CONF, URLs), held by this session alone
    (`pytest_collection_finish`), with this checkout's Slurm hooks and no Slurm job on it.
    Stopped at the end only if it was not running before."""
    assert os.environ.get(stack.HOLDER_ENV), "the session holds the stack (collection hook)"
    started = not _stack_running()
    # start even when running: this checkout's Slurm hooks, not another's
    if stack.run_stack("start") != 0:
        pytest.fail("the local stack failed to start: see compose/local/stack.sh output")
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

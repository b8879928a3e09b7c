"""One test session on the local stack at a time (goodput.stack.in_use and stack.sh's
wait_turn): two runs of the suite on one machine once shared a stack, rewrote each other's
Slurm hooks and stopped it under each other. Exercised on a private state dir: the lock, not
the daemons."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from goodput import stack

HOLD = """from goodput import stack; import time
with stack.in_use():
    print("held", flush=True)
    time.sleep({s})"""


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("GOODPUT_STACK_DIR", str(tmp_path))
    monkeypatch.delenv(stack.HOLDER_ENV, raising=False)
    return tmp_path


def _holder(seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD.format(s=seconds)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=stack.REPO,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _stack_sh(verb: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(stack.STACK_SCRIPT), verb],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_second_session_is_refused_naming_the_first(state):
    holder = _holder(60)
    try:
        with pytest.raises(stack.StackBusy, match=f"in use by pid {holder.pid}-"):
            with stack.in_use(wait_s=1):
                pass
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("verb", ["stop", "clear"])
def test_stack_sh_waits_for_the_holder_and_then_gives_up(state, verb):
    # start and restart take the same case line (were it broken, a start here would start
    # real daemons); a wait given in seconds with a fraction is taken too
    holder = _holder(60)
    try:
        out = _stack_sh(verb, GOODPUT_STACK_WAIT_S="1.5")
        assert out.returncode != 0
        assert f"in use by pid {holder.pid}-" in out.stderr
        assert "nothing to stop" not in out.stdout  # cmd_stop never ran
    finally:
        holder.kill()
        holder.wait()


def test_the_holders_own_children_go_on_and_no_one_else(state):
    holder = _holder(60)
    try:
        token = (state / stack.LOCK_FILE).read_text().split()[0]
        out = _stack_sh("stop", GOODPUT_STACK_WAIT_S="1", GOODPUT_STACK_HOLDER=token)
        assert out.returncode == 0 and "nothing to stop" in out.stdout, out.stderr
        # the pid alone is no token (the same pid in another PID namespace sharing /tmp)
        out = _stack_sh("stop", GOODPUT_STACK_WAIT_S="1", GOODPUT_STACK_HOLDER=str(holder.pid))
        assert out.returncode != 0 and "nothing to stop" not in out.stdout
    finally:
        holder.kill()
        holder.wait()


def test_stack_sh_goes_on_once_the_holder_is_done(state):
    holder = _holder(2)
    out = _stack_sh("stop", GOODPUT_STACK_WAIT_S="30")
    holder.wait()
    assert out.returncode == 0, out.stderr
    assert f"waiting for pid {holder.pid}-" in out.stdout and "nothing to stop" in out.stdout


def test_a_killed_holder_frees_the_stack(state):
    holder = _holder(60)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    t0 = time.monotonic()
    out = _stack_sh("stop", GOODPUT_STACK_WAIT_S="30")
    assert out.returncode == 0 and "nothing to stop" in out.stdout, out.stderr
    assert time.monotonic() - t0 < 10  # no wait for a dead holder
    with stack.in_use(wait_s=0):
        assert os.environ[stack.HOLDER_ENV].startswith(f"{os.getpid()}-")
    assert stack.HOLDER_ENV not in os.environ


def test_a_test_session_holds_the_stack_only_when_its_tests_use_it(state):
    """The session takes the lock once its tests are selected: a run of tests using
    `local_stack` is refused while another holds the stack; a unit run (deselected, on every
    xdist worker) never waits for it."""
    holder = _holder(60)
    try:

        def collect(*marks: str) -> subprocess.CompletedProcess[str]:
            argv = ["--collect-only", "-q", "-p", "no:cacheprovider", *marks, "tests/integration"]
            return subprocess.run(
                [sys.executable, "-m", "pytest", *argv],
                env={**os.environ, "GOODPUT_STACK_WAIT_S": "1"},
                capture_output=True,
                text=True,
                timeout=120,
                cwd=stack.REPO,
            )

        busy = collect("-m", "integration")
        assert busy.returncode == 3 and f"in use by pid {holder.pid}-" in busy.stdout
        assert collect("-m", "not integration").returncode in (0, 5)  # nothing selected: 5
    finally:
        holder.kill()
        holder.wait()

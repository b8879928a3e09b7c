"""The local stack (compose/local/stack.sh) and Goodput's own background services."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STACK_SCRIPT = REPO / "compose" / "local" / "stack.sh"
LOCK_FILE = "in-use.lock"  # stack.sh's hold_turn takes it too
HOLDER_ENV = "GOODPUT_STACK_HOLDER"  # the holder's token (pid-random), inherited by its children


class StackBusy(RuntimeError):
    """Another process held the local stack for longer than we would wait."""


def state_dir() -> Path:
    return Path(os.environ.get("GOODPUT_STACK_DIR", "/tmp/goodput-stack"))  # noqa: S108


def run_stack(verb: str) -> int:
    """Run `stack.sh VERB`, streaming its output; returns its exit status."""
    return subprocess.call(["bash", str(STACK_SCRIPT), verb])


@contextmanager
def in_use(wait_s: float | None = None) -> Iterator[None]:
    """Hold the local stack for this process (a test session), waiting up to `wait_s`
    (GOODPUT_STACK_WAIT_S, default 1800) for another holder. While it is held, `stack.sh
    start|stop|restart|clear` from anyone but this process and its children waits. The kernel
    drops the lock when the process exits, however it exits."""
    wait_s = float(os.environ.get("GOODPUT_STACK_WAIT_S", 1800)) if wait_s is None else wait_s
    state_dir().mkdir(parents=True, exist_ok=True)
    path = state_dir() / LOCK_FILE
    deadline, told = time.monotonic() + wait_s, False
    with open(path, "a+") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = path.read_text(errors="replace").strip() or "another process"
                if time.monotonic() >= deadline:
                    raise StackBusy(
                        f"the local stack ({state_dir()}) is in use by pid {holder}; "
                        f"waited {wait_s:.0f} s (GOODPUT_STACK_WAIT_S)"
                    ) from None
                if not told:
                    print(f"[stack] waiting for pid {holder} to finish", file=sys.__stderr__)
                    told = True
                time.sleep(0.5)
        token = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"  # a pid alone: another namespace's
        lock.truncate(0)
        lock.write(f"{token} {' '.join(sys.argv)[:200]}\n")
        lock.flush()
        before = os.environ.get(HOLDER_ENV)
        os.environ[HOLDER_ENV] = token
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(HOLDER_ENV, None)
            else:
                os.environ[HOLDER_ENV] = before
            lock.truncate(0)


def stack_env() -> dict[str, str]:
    """The variables the stack wrote to $GOODPUT_STACK_DIR/env (SLURM_CONF, URLs, …)."""
    env: dict[str, str] = {}
    path = state_dir() / "env"
    if path.exists():
        for line in path.read_text().splitlines():
            if line.startswith("export ") and "=" in line:
                key, _, value = line[len("export ") :].partition("=")
                env[key] = value
    return env


def start_service(name: str, argv: list[str], url: str, env: dict[str, str] | None = None) -> int:
    """Start a Goodput service in the background with a pidfile the stack script knows."""
    run = state_dir() / "run"
    logs = state_dir() / "logs"
    run.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    pidfile = run / f"{name}.pid"
    if pidfile.exists() and _alive(int(pidfile.read_text() or 0)):
        return int(pidfile.read_text())
    with open(logs / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(  # noqa: S603 - argv list, no shell
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **stack_env(), **(env or {})},
            start_new_session=True,
        )
    pidfile.write_text(str(proc.pid))
    (run / f"{name}.url").write_text(url)
    return proc.pid


def stop_service(name: str, timeout: float = 5.0) -> bool:
    """Stop a service started by `start_service`; True if it was running."""
    pidfile = state_dir() / "run" / f"{name}.pid"
    if not pidfile.exists():
        return False
    pid = int(pidfile.read_text() or 0)
    was = _alive(pid)
    if was:
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
    pidfile.unlink(missing_ok=True)
    return was


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return stat != "Z"


def python() -> str:
    """The interpreter running Goodput, for starting sibling services."""
    return sys.executable


def cpu_count() -> int:
    return os.cpu_count() or 1

"""kill -9 of the real `goodput exporter logs --loki-url` process, again and again, while its
job log grows: at the end Loki holds every line once, with its own time.

The shipper saves its read position only after the lines are in its spool, so a kill between
the two ships a few lines twice, with the same time; Loki keeps one copy of an identical entry
(tests/lokifake.py cites why), so nothing is lost and nothing is doubled.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.lokifake import FakeLoki

ROOT = Path(__file__).resolve().parents[2]
NOW = float(int(time.time()))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(loki: FakeLoki, logs: Path, state: Path) -> tuple[subprocess.Popen, int]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    port = _free_port()
    cmd = [sys.executable, "-c", "from goodput.cli import app; app()", "exporter", "logs"]
    cmd += ["--log-dir", str(logs), "--port", str(port), "--loki-url", loki.url]
    cmd += ["--loki-state-dir", str(state)]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return p, port


def _serving(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def _wait(cond, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_kill_9_loses_and_doubles_nothing(tmp_path):
    rng = random.Random(16)
    loki = FakeLoki()
    logs, state = tmp_path / "logs", tmp_path / "state"
    (logs / "jobs").mkdir(parents=True)
    (logs / "kernel").mkdir()
    job = logs / "jobs" / "slurm-5.out"
    want: list[str] = []
    try:
        for round_ in range(5):
            with open(job, "a") as f:
                for i in range(40):
                    t = NOW - 600 + len(want)
                    line = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) + f" r{round_} {i}"
                    f.write(line + "\n")
                    want.append(line)
            pushes = len(loki.pushes)
            p, _port = _start(loki, logs, state)
            assert _wait(lambda: len(loki.pushes) > pushes, 30), "the shipper never pushed"
            time.sleep(rng.uniform(0.0, 1.2))
            p.send_signal(signal.SIGKILL)
            p.wait(10)
        p, port = _start(loki, logs, state)
        assert _wait(lambda: len(loki.lines()) >= len(want), 30)
        assert _wait(lambda: _serving(port), 30)  # its SIGTERM handler is in place
        p.send_signal(signal.SIGTERM)
        assert p.wait(20) == 0
        assert loki.lines() == want  # each once, in the order of their own times
        print(f"{len(want)} lines, {loki.received} received by Loki over {len(loki.pushes)} pushes")
        times = [ts for _labels, ts, _line in loki.entries()]
        assert times == [int(NOW - 600 + k) * 10**9 for k in range(len(want))]
    finally:
        loki.close()

"""Failpoints: named points between two durable steps where a test makes the process die.

`hit(name)` does nothing unless the point is armed:

- in-process, by `arm(name)` (tests): `hit` raises `Crash`, a BaseException that no `except
  Exception` swallows, so nothing after the point runs, as after a kill -9;
- in a child process, by `GOODPUT_TEST_CRASH_AT=name` or `name@N` (the Nth hit): the process
  SIGKILLs itself there (the chaos suite and the integration tests use this).

`POINTS` lists every point; `hits()` counts the points reached in this process.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

POINTS = (
    "ingested",  # the webhook's alerts are committed, the 200 not yet sent
    "diagnosed",  # the final diagnosis and its outbox row are committed, not yet planned
    "waiting",  # the plan waits for the scheduler (committed)
    "planned",  # the plan (and its audit events) is committed, nothing executed
    "approved",  # a person's approval is committed, not yet executed
    "claimed",  # the action is `executing` (committed), no scheduler call yet
    "drained",  # the nodes are drained, the job not yet requeued or stopped
    "requeue_held",  # Slurm: the job is requeue-held, its exclusion not yet set
    "excluded",  # Slurm: the exclusion is set, the job not yet released
    "executed",  # every scheduler step is done, the outcome not yet recorded
    "finished",  # the outcome is recorded, on-call not yet told
)


class Crash(BaseException):
    """The in-process stand-in for a kill -9 at a failpoint."""


_armed: dict[str, int] = {}
_hits: Counter[str] = Counter()


def arm(name: str, nth: int = 1) -> None:
    if name not in POINTS:
        raise ValueError(f"unknown failpoint {name!r}")
    _armed[name] = nth


def disarm() -> None:
    _armed.clear()
    _hits.clear()


def hits() -> dict[str, int]:
    return dict(_hits)


def _from_env() -> tuple[str, int] | None:
    spec = os.environ.get("GOODPUT_TEST_CRASH_AT", "")
    if not spec:
        return None
    name, _, nth = spec.partition("@")
    return name, int(nth) if nth.isdigit() else 1


def hit(name: str) -> None:
    """Reach the point `name`: die here if a test armed it."""
    _hits[name] += 1
    if name in _armed and _hits[name] >= _armed[name]:
        del _armed[name]
        raise Crash(name)
    env = _from_env()
    if env is not None and env[0] == name and _hits[name] == env[1]:
        os.kill(os.getpid(), signal.SIGKILL)

"""A node's way back to service, and its history, as policy data and pure decisions.

After Goodput drains a node, a health check (policy: an argv per check level, e.g.
`["srun", "-w", "{node}", "dcgmi", "diag", "-r", "2"]`) decides what happens next:

- passed → resume the node, but only a drain of Goodput's own (never a person's);
- failed → keep it drained with reason `goodput: failed <level>`, and once it has failed
  `rma_after_failures` times, call the RMA hook (a command: open a ticket, page a vendor).

Repeat-offender rules over the node's history (N incidents in a window, the same XID twice on
one GPU, failures of jobs of several users) escalate: a deeper check, a hold for a person, or
RMA. `run` is the one side effect here (argv only, bounded time and output).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from recovery.scheduler.base import check_node

PLACEHOLDERS = ("{node}", "{level}", "{reason}")
Escalation = Literal["deep_check", "hold_for_person", "rma"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Command(_Frozen):
    """An argv (never a shell) with `{node}`, `{level}`, `{reason}` placeholders, bounded."""

    argv: tuple[str, ...] = Field(min_length=1)
    timeout_s: float = Field(default=600.0, gt=0, le=86400)
    max_output_bytes: int = Field(default=65536, ge=0, le=16 * 2**20)

    @field_validator("argv")
    @classmethod
    def _no_empty(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v[0].strip():
            raise ValueError("the program (argv[0]) is empty")
        return v


class OffenderRule(_Frozen):
    """`incidents` or more in `window_s` (on one GPU with one XID when `same_gpu_xid`) → `then`;
    `distinct_users` counts failed jobs of different users instead."""

    name: str = Field(min_length=1, max_length=64)
    window_s: float = Field(gt=0, le=366 * 86400)
    incidents: int = Field(default=0, ge=0, le=10000)
    same_gpu_xid: bool = False
    distinct_users: int = Field(default=0, ge=0, le=10000)
    then: Escalation

    @model_validator(mode="after")
    def _one_count(self) -> OffenderRule:
        if (self.incidents > 0) == (self.distinct_users > 0):
            raise ValueError(f"rule {self.name!r}: set exactly one of incidents, distinct_users")
        return self


class ReturnToService(_Frozen):
    enabled: bool = False
    level: str = "quick"  # the check after a drain
    deep_level: str = "deep"  # the check a `deep_check` escalation asks for
    checks: dict[str, Command] = Field(default_factory=dict)
    rma_after_failures: int = Field(default=2, ge=1, le=100)
    # a node that failed is checked again this long after (a technician may have repaired it)
    recheck_failed_after_s: float | None = Field(default=None, gt=0, le=30 * 86400)
    rma_hook: Command | None = None
    capture: Command | None = None  # diagnostics taken before a drain (nvidia-bug-report, dmesg)
    repeat_offenders: tuple[OffenderRule, ...] = (  # policy.default.yaml documents these
        OffenderRule(
            name="five-in-a-week", incidents=5, window_s=7 * 86400, then="hold_for_person"
        ),
        OffenderRule(
            name="same-xid-same-gpu",
            incidents=2,
            same_gpu_xid=True,
            window_s=86400,
            then="deep_check",
        ),
        OffenderRule(
            name="several-users", distinct_users=3, window_s=7 * 86400, then="hold_for_person"
        ),
    )

    @model_validator(mode="after")
    def _levels_exist(self) -> ReturnToService:
        if self.enabled:
            for lvl in {self.level, self.deep_level}:
                if lvl not in self.checks:
                    raise ValueError(f"check level {lvl!r} has no entry under checks")
        return self


@dataclass(frozen=True)
class CheckResult:
    node: str
    level: str
    passed: bool
    exit_code: int | None  # None: timed out or could not start
    output: str  # stdout and stderr, cut to the command's max_output_bytes
    started_at: float
    duration_s: float


@dataclass(frozen=True)
class NodeEvent:
    """One entry of a node's history (from incidents, actions and checks)."""

    at: float
    node: str
    kind: Literal["incident", "job_failed", "drain", "check_passed", "check_failed", "resume"]
    gpu: str | None = None
    xid: int | None = None
    user: str | None = None


@dataclass(frozen=True)
class Step:
    kind: Literal["resume", "keep_drained", "hold", "rma", "leave"]
    reason: str


HELD_PREFIX = "goodput: held for a person"  # a repeat offender's verdict: a person decides


def expand(argv: Sequence[str], node: str, level: str = "", reason: str = "") -> list[str]:
    """The argv with its placeholders filled; `node` must be a valid node name."""
    values = {"{node}": check_node(node), "{level}": level, "{reason}": reason}
    out = []
    for arg in argv:
        for key in PLACEHOLDERS:
            arg = arg.replace(key, values[key])
        out.append(arg)
    return out


def run(
    cmd: Command,
    node: str,
    level: str = "",
    reason: str = "",
    clock: Callable[[], float] = time.time,
) -> CheckResult:
    """Run a check (or hook) for `node`: argv only, bounded time (the whole process group is
    killed at the limit and once the check ends), output read within its bound."""
    argv, t0 = expand(cmd.argv, node, level, reason), clock()
    code: int | None
    try:
        code, raw = _capture(argv, cmd.timeout_s, cmd.max_output_bytes)
        if code is None:
            raw += f"\n[timed out after {cmd.timeout_s:g}s]".encode()
    except OSError as e:
        code, raw = None, f"[could not run {argv[0]}: {e}]".encode()
    text = raw.decode("utf-8", errors="replace")
    return CheckResult(node, level, code == 0, code, text, t0, max(0.0, clock() - t0))


def _capture(argv: list[str], timeout_s: float, limit: int) -> tuple[int | None, bytes]:
    """(exit code or None on timeout, the first `limit` bytes of stdout and stderr)."""
    kept = bytearray()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: what it starts goes with it
    )
    pipe = proc.stdout
    assert pipe is not None  # noqa: S101 - stdout=PIPE

    def drain() -> None:  # the reader closes the pipe: no fd is closed under it
        try:
            while chunk := os.read(pipe.fileno(), 65536):
                if len(kept) < limit:
                    kept.extend(chunk[: limit - len(kept)])
        finally:
            pipe.close()

    reader = threading.Thread(target=drain, name="check-output", daemon=True)
    reader.start()
    try:
        code: int | None = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        code = None
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    reader.join(5.0)  # a process outside the group may hold the pipe: the reader ends later
    return code, bytes(kept)


def after_check(
    result: CheckResult,
    failures_before: int,
    drained_by_goodput: bool,
    cfg: ReturnToService,
    broken: Sequence[tuple[OffenderRule, str]] = (),
) -> Step:
    """What a finished check means for its node; `broken`: the repeat-offender rules the node's
    history breaks (`escalations`), which keep even a node that passed out of service."""
    if not drained_by_goodput:
        return Step("leave", "the node was drained by a person; Goodput does not resume it")
    if result.passed:
        for then, kind in (("rma", "rma"), ("hold_for_person", "hold")):
            hits = [f"{r.name}: {why}" for r, why in broken if r.then == then]
            if hits:
                head = "goodput: repeat offender, RMA" if kind == "rma" else HELD_PREFIX
                return Step(kind, f"{head} ({'; '.join(hits)})")  # type: ignore[arg-type]
        return Step("resume", f"goodput: passed {result.level}")
    failures = failures_before + 1
    if failures >= cfg.rma_after_failures:
        return Step("rma", f"goodput: failed {result.level} {failures} times: RMA")
    return Step("keep_drained", f"goodput: failed {result.level}")


def escalations(
    events: Iterable[NodeEvent], rules: Sequence[OffenderRule], now: float
) -> list[tuple[OffenderRule, str]]:
    """The repeat-offender rules that `events` (one node's history) break at `now`, each with
    the evidence in words."""
    events = list(events)
    out = []
    for rule in rules:
        recent = [e for e in events if e.kind == "incident" and now - rule.window_s <= e.at <= now]
        if rule.distinct_users:  # a failed job counts here even when the node was not blamed
            window = [e for e in events if now - rule.window_s <= e.at <= now]
            users = {e.user for e in window if e.kind in ("incident", "job_failed") and e.user}
            if len(users) >= rule.distinct_users:
                out.append((rule, f"failed jobs of {len(users)} users: {', '.join(sorted(users))}"))
            continue
        if rule.same_gpu_xid:
            groups: dict[tuple[str, int], int] = {}
            for e in recent:
                if e.gpu is not None and e.xid is not None:
                    groups[(e.gpu, e.xid)] = groups.get((e.gpu, e.xid), 0) + 1
            hits = [(k, n) for k, n in sorted(groups.items()) if n >= rule.incidents]
            if hits:
                (gpu, xid), n = hits[0]
                out.append((rule, f"XID {xid} {n} times on GPU {gpu}"))
        elif len(recent) >= rule.incidents:
            out.append((rule, f"{len(recent)} incidents in {rule.window_s / 86400:g} d"))
    return out


def check_level(events: Iterable[NodeEvent], cfg: ReturnToService, now: float) -> str:
    """The check a drained node gets: the deep one when a rule asks for it, else the usual."""
    wanted = {rule.then for rule, _ in escalations(events, cfg.repeat_offenders, now)}
    return cfg.deep_level if "deep_check" in wanted else cfg.level


def mtbi_s(events: Iterable[NodeEvent]) -> float | None:
    """Mean time between incidents on a node (None with fewer than two)."""
    times = sorted(e.at for e in events if e.kind == "incident")
    return (times[-1] - times[0]) / (len(times) - 1) if len(times) >= 2 else None

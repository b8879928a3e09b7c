"""The scheduler port: what recovery may ask of a scheduler, with the safety rules built in.

Adapters implement the primitive `_`-methods and the two readers; the public methods here read
state before acting, refuse what must never happen (resuming a node a person drained,
requeueing a job that was already requeued), and verify the result after acting.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from catalogue import names

REASON_PREFIX = "goodput:"
NODE_RE = names.NODE
JOB_RE = names.JOB_ID
ACTIVE = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED")


class SchedulerError(RuntimeError):
    """The scheduler refused or failed a request (permanent for this attempt)."""


class SchedulerUnavailable(SchedulerError):
    """The scheduler could not be reached; retry later."""


class SchedulerBusy(SchedulerUnavailable):
    """The scheduler answered but asked to be asked again shortly (Slurm: "try again")."""


class NotConfirmed(SchedulerBusy):
    """A change was asked for and not seen yet (a requeued job still completing: a stuck CUDA
    process, a long epilog); the action is tried again soon, its guards see what was done."""


class GuardRefused(SchedulerError):
    """A safety rule refused the request (e.g. resuming a node a person drained)."""


def check_node(node: str) -> str:
    if not isinstance(node, str) or not NODE_RE.match(node):
        raise ValueError(f"invalid node name {node!r}")
    return node


def check_job(job_id: str) -> str:
    job_id = str(job_id)
    if not JOB_RE.match(job_id):
        raise ValueError(f"invalid job id {job_id!r}")
    return job_id


def clean_reason(text: str) -> str:
    """A drain reason: `goodput:` prefix, printable, bounded."""
    text = "".join(c if c.isprintable() and c not in "\"'`\\" else " " for c in text).strip()
    if not text.startswith(REASON_PREFIX):
        text = f"{REASON_PREFIX} {text}"
    return text[:200]


# Reasons slurmctld itself gives a node it marks DOWN because it stopped answering
SLURM_DOWN_REASONS = ("not responding",)


@dataclass(frozen=True)
class JobState:
    job_id: str
    name: str
    state: str
    nodes: tuple[str, ...] = ()
    restarts: int = 0
    exit_code: int | None = None
    comment: str = ""
    excluded: tuple[str, ...] = ()
    held: bool = False
    reason: str = ""
    partition: str | None = None
    start_time: float | None = None
    gpus: int = 0
    end_time: float | None = None  # when an ended job ended (None while active)
    node_count: int = 0  # nodes the job asks for (0: unknown)
    signal: int = 0  # the signal that ended it (0: none)
    user: str | None = None  # who submitted it (a valid user name, else None)
    required: tuple[str, ...] = ()  # nodes it must run on (`--nodelist`)

    @property
    def active(self) -> bool:
        return self.state.upper() in ACTIVE


@dataclass(frozen=True)
class NodeState:
    node: str
    state: str
    reason: str = ""
    partitions: tuple[str, ...] = ()

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.state.upper()

    @property
    def drained_by_goodput(self) -> bool:
        return self.drained and self.reason.startswith(REASON_PREFIX)

    @property
    def down_by_other(self) -> bool:
        """DOWN with a reason that is neither Goodput's nor Slurm's own for a node that stopped
        answering ("Not responding"): a person's (an RMA, maintenance), left to them."""
        reason = self.reason.strip()
        return (
            "DOWN" in self.state.upper()
            and bool(reason)
            and not reason.startswith(REASON_PREFIX)
            and reason.lower() not in SLURM_DOWN_REASONS
        )


@dataclass(frozen=True)
class OpResult:
    changed: bool
    detail: str
    restarts: int | None = None  # a job's restart count as the scheduler showed it after


class Scheduler(ABC):
    """The port. `verify_timeout_s` bounds the wait for the scheduler to show a change."""

    verify_timeout_s: float = 10.0
    verify_interval_s: float = 0.2

    # ---- adapters implement these -------------------------------------------------------
    @abstractmethod
    def job_state(self, job_id: str) -> JobState | None: ...

    @abstractmethod
    def node_states(self) -> list[NodeState]: ...

    @abstractmethod
    def _drain(self, node: str, reason: str) -> None: ...

    @abstractmethod
    def _resume(self, node: str) -> None: ...

    @abstractmethod
    def _requeue(
        self, job_id: str, exclude: tuple[str, ...] | None, hold: bool, delay_s: float
    ) -> None:
        """Requeue; `exclude` (when not None) becomes the job's exclusion list exactly."""

    @abstractmethod
    def _set_exclude(self, job_id: str, exclude: tuple[str, ...] | None, delay_s: float) -> None:
        """Set the excluded nodes (exactly `exclude`, () clears; None: leave them) and begin
        time of a pending job."""

    @abstractmethod
    def _hold(self, job_id: str) -> None: ...

    @abstractmethod
    def _release(self, job_id: str) -> None: ...

    @abstractmethod
    def _cancel(self, job_id: str) -> None: ...

    def controller_started(self) -> str | None:
        """When the scheduler's controller last started, as the scheduler prints it (compared
        for equality only), or None where the adapter cannot say (then what a restarted
        controller may have forgotten is not checked)."""
        return None

    # ---- the safe public operations -------------------------------------------------------
    def reachable(self) -> bool:
        """Does the scheduler answer now? One cheap read; any failure is a no."""
        try:
            self.node_states()
        except Exception:  # noqa: BLE001 - a probe: every failure reads as not answering
            return False
        return True

    def node_state(self, node: str) -> NodeState | None:
        return next((n for n in self.node_states() if n.node == node), None)

    def _await(self, check: Callable[[], bool], what: str, retry: bool = False) -> None:
        """Wait for `check`; past `verify_timeout_s` a SchedulerError, or where the step is
        known to come (`retry`: a requeue-hold while the job completes) NotConfirmed."""
        deadline = time.monotonic() + self.verify_timeout_s
        while not check():
            if time.monotonic() > deadline:
                error = NotConfirmed if retry else SchedulerError
                raise error(f"not confirmed within {self.verify_timeout_s}s: {what}")
            time.sleep(self.verify_interval_s)

    def drain(self, node: str, reason: str) -> OpResult:
        """Drain `node` with a `goodput:` reason; a node already drained keeps its reason."""
        check_node(node)
        before = self.node_state(node)
        if before is None:
            raise SchedulerError(f"node {node} is unknown to the scheduler")
        if before.drained:
            who = "Goodput" if before.drained_by_goodput else "a person"
            return OpResult(False, f"{node} already drained by {who} ({before.reason})")
        if before.down_by_other:  # a drain would replace the reason with Goodput's, and
            # Goodput would later check the node and return it to service
            return OpResult(False, f"{node} is already down ({before.reason}): left as it is")
        self._drain(node, clean_reason(reason))
        self._await(lambda: bool((s := self.node_state(node)) and s.drained), f"{node} drained")
        return OpResult(True, f"{node} drained")

    def relabel(self, node: str, reason: str) -> OpResult:
        """Change the reason of a node Goodput drained (a check's verdict); never a person's."""
        check_node(node)
        before = self.node_state(node)
        if before is None:
            raise SchedulerError(f"node {node} is unknown to the scheduler")
        if not before.drained_by_goodput:
            raise GuardRefused(f"{node} is not drained by Goodput ({before.reason!r}); not changed")
        reason = clean_reason(reason)
        self._drain(node, reason)
        self._await(lambda: bool((s := self.node_state(node)) and s.reason == reason), "reason")
        return OpResult(True, f"{node}: {reason}")

    def resume(self, node: str) -> OpResult:
        """Return a node Goodput drained to service; never one a person drained."""
        check_node(node)
        before = self.node_state(node)
        if before is None:
            raise SchedulerError(f"node {node} is unknown to the scheduler")
        if not before.drained and "DOWN" not in before.state.upper():
            return OpResult(False, f"{node} is not drained ({before.state})")
        if not before.drained_by_goodput:
            raise GuardRefused(f"{node} was drained by a person ({before.reason!r}); not resuming")
        self._resume(node)
        self._await(lambda: bool((s := self.node_state(node)) and not s.drained), f"{node} resumed")
        return OpResult(True, f"{node} resumed")

    def requeue(
        self,
        job_id: str,
        exclude: tuple[str, ...] = (),
        hold: bool = False,
        expected_restarts: int | None = None,
        delay_s: float = 0.0,
        drop: tuple[str, ...] = (),
    ) -> OpResult:
        """Requeue a job, excluding nodes, without racing the restart.

        The job's exclusions become its current ones less `drop` (earlier Goodput exclusions
        the plan left out) plus `exclude`, set only where that differs from the current ones:
        a dropped exclusion is cleared, a person's own (`--exclude`) is kept.

        `expected_restarts` is the job's restart count when the action was planned: a job
        whose count has moved on was already requeued (by Slurm, a person, or an earlier
        attempt of this action) and is not requeued again. If that earlier attempt died
        mid-way (requeue-held, exclusion maybe not set), the job is pending, held, and its
        count moved by exactly one: the exclusion is completed and it is released. Only these
        structured facts decide it (Slurm 22.05 says `JobHeldUser` in `state_reason`, later
        versions other words), never the wording of a reason.
        """
        check_job(job_id)
        exclude = tuple(check_node(n) for n in exclude)
        gone = {check_node(n) for n in drop} - set(exclude)
        before = self.job_state(job_id)
        if before is None:
            raise SchedulerError(f"job {job_id} is unknown to the scheduler")
        want = tuple(dict.fromkeys([*(n for n in before.excluded if n not in gone), *exclude]))
        target = want if set(want) != set(before.excluded) else None
        if before.exit_code == 93 and not before.active:
            raise GuardRefused(f"job {job_id} exited with 93: do not requeue")
        if before.state.upper() == "COMPLETED" and before.exit_code == 0:
            raise GuardRefused(f"job {job_id} completed (exit 0): not run again")
        if bad := sorted(set(want) & set(before.required)):
            raise GuardRefused(f"job {job_id} requires {bad}: excluded, it would never start")
        if exclude and (unknown := sorted(set(exclude) - {n.node for n in self.node_states()})):
            raise GuardRefused(f"nodes {unknown} are unknown to the scheduler: not excluded")
        if expected_restarts is not None and before.restarts > expected_restarts:
            ours = (
                before.held
                and before.reason != "JobHeldAdmin"  # a person's hold (Goodput's is JobHeldUser)
                and before.restarts == expected_restarts + 1
                and not hold
            )
            if ours and before.active and before.state.upper() != "PENDING":
                raise NotConfirmed(f"job {job_id} is {before.state}: its requeue-hold completes")
            if ours and before.state.upper() == "PENDING":
                self._set_exclude(job_id, target, delay_s)
                self._release(job_id)
                detail = f"job {job_id} was requeued-held; exclusion set, released"
                return OpResult(True, detail, before.restarts)
            detail = f"job {job_id} already requeued (restarts {before.restarts})"
            return OpResult(False, detail, before.restarts)
        if before.state.upper() == "PENDING" and not before.held and not hold:
            # nothing runs (not started yet, or a restarted controller forgot that it had):
            # the pending job gets the exclusions; never held here, so never left held
            self._set_exclude(job_id, target, delay_s)
            self._await(
                lambda: bool((s := self.job_state(job_id)) and set(s.excluded) == set(want)),
                f"job {job_id} excludes {sorted(want)}",
            )
            detail = f"job {job_id} is pending: not requeued, excluding {list(want)}"
            return OpResult(target is not None or delay_s > 0, detail, before.restarts)
        self._requeue(job_id, target, hold, delay_s)

        after: list[JobState] = []

        def done() -> bool:
            s = self.job_state(job_id)
            after[:] = [s] if s else []
            return bool(
                s
                and s.restarts > before.restarts
                and set(s.excluded) == set(want)
                and (s.held if hold else not s.held)
            )

        self._await(done, f"job {job_id} requeued")
        return OpResult(True, f"job {job_id} requeued excluding {list(want)}", after[0].restarts)

    def stop(self, job_id: str, expected_restarts: int | None = None) -> OpResult:
        """Stop: a running job is requeue-held (a person releases or cancels it); a pending
        one is held; an ended one stays ended."""
        check_job(job_id)
        s = self.job_state(job_id)
        if s is None or not s.active:
            detail = f"job {job_id} has ended ({s.state if s else 'gone'})"
            return OpResult(False, detail, s.restarts if s else None)
        if s.held:
            return OpResult(False, f"job {job_id} is already held", s.restarts)
        if s.state.upper() == "PENDING" or (
            expected_restarts is not None and s.restarts > expected_restarts
        ):
            self._hold(job_id)
            self._await(lambda: bool((x := self.job_state(job_id)) and x.held), "job held")
            return OpResult(True, f"job {job_id} held", s.restarts)
        return self.requeue(job_id, (), hold=True, expected_restarts=s.restarts)

    def hold(self, job_id: str) -> OpResult:
        check_job(job_id)
        self._hold(job_id)
        return OpResult(True, f"job {job_id} held")

    def release(self, job_id: str) -> OpResult:
        check_job(job_id)
        self._release(job_id)
        return OpResult(True, f"job {job_id} released")

    def cancel(self, job_id: str) -> OpResult:
        check_job(job_id)
        s = self.job_state(job_id)
        if s is not None and not s.active:
            return OpResult(False, f"job {job_id} already ended")
        self._cancel(job_id)
        return OpResult(True, f"job {job_id} cancelled")

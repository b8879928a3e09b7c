"""Slurm adapter: scontrol / scancel / squeue / sinfo / sacct as argv lists, never a shell.

Every call has a timeout; transient failures (controller unreachable, socket timeouts) are
retried with exponential backoff and then raised as `SchedulerUnavailable` (`SchedulerBusy`
when the controller answered "try again"), so the caller keeps the action pending.
Requeue-with-exclusion is requeuehold -> update ExcNodeList -> release.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Sequence

from catalogue import names
from recovery import failpoints
from recovery.scheduler.base import (
    ACTIVE,
    JobState,
    NodeState,
    Scheduler,
    SchedulerBusy,
    SchedulerError,
    SchedulerUnavailable,
    check_job,
    check_node,
)

TRANSIENT = re.compile(
    r"unable to contact slurm controller|socket timed out|connection refused|"
    r"zero bytes were transmitted|communication connection failure|slurm_receive_msg|"
    r"slurmctld is not responding|try again|db index is being set|retry momentarily|"
    # a controller that is stopping or starting answers so (SLURM_UNEXPECTED_MSG_ERROR): seen
    # here when slurmctld got SIGTERM mid-requeue, and at start-up in
    # stackhpc/ansible-slurm-appliance#443 ("failed to fetch remote configs: ...")
    r"unexpected message received",
    re.IGNORECASE,
)
# The controller answered and asked to be asked again: ESLURM_JOB_SETTING_DB_INX ("Job update
# not available right now, the DB index is being set, try again in a bit"; seen here after a
# slurmctld restart in CI, on a job requeue-held just before slurmctld stopped, through more
# than one retry), ESLURM_TRANSITION_STATE_NO_UPDATE ("Job can not be altered now, try again
# later"), SLURMCTLD_COMMUNICATIONS_BACKOFF (23.02+'s RPC rate limit: "Rate limit exceeded,
# please retry momentarily").
BUSY = re.compile(r"try again|db index is being set|retry momentarily", re.IGNORECASE)
# Failures that say the request never took effect: the client could not connect, or the
# controller refused it for now. Any other transient failure (a timeout, a dropped answer)
# may follow a request that was applied.
NOT_APPLIED = re.compile(
    r"unable to contact slurm controller|connection refused|" + BUSY.pattern, re.IGNORECASE
)


_BOOT_TIME = re.compile(r"^BOOT_TIME\s*=\s*(\S+)", re.MULTILINE)
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}")


def user_name(raw: object) -> str | None:
    """`alice` (or scontrol's `alice(1000)`) → `alice`; junk → None."""
    name = str(raw or "").split("(", 1)[0].strip()
    return name if _USER.fullmatch(name) else None


def expand_hostlist(text: str | None) -> tuple[str, ...]:
    """`node[1-3,5],gpu7` -> (node1, node2, node3, node5, gpu7), leaving out invalid names;
    `ValueError` if malformed."""
    return tuple(names.expand_hostlist(text, skip_invalid=True))


def _exit_code(raw: object) -> int | None:
    """The job's return code from any of Slurm's shapes (`names.slurm_exit`); None when a
    signal ended it or it cannot be read."""
    code, sig = names.slurm_exit(raw)
    return None if sig else code


HELD_REASONS = ("JobHeldUser", "JobHeldAdmin")  # Slurm's WAIT_HELD_USER / WAIT_HELD


def held(job: dict[str, object]) -> bool:
    """Slurm holds the job: priority 0, the `hold` flag (23.02+), a REQUEUE_HOLD state flag
    (23.02+ lists the flags in `job_state`) or a held state_reason: structured fields only."""
    states = job.get("job_state")
    flags = {str(f).upper() for f in (states if isinstance(states, list) else [states])}
    return (
        names.slurm_int(job.get("priority")) == 0
        or job.get("hold") is True
        or "REQUEUE_HOLD" in flags
        or str(job.get("state_reason") or "") in HELD_REASONS
    )


def _ended_at(state: str, end: int | None) -> float | None:
    """An ended job's end; squeue's `end_time` of an active job is its time limit, not an end."""
    return float(end) if end and state.upper() not in ACTIVE else None


def _first(raw: object) -> str:
    return (names.slurm_states(raw) or [""])[0].upper()


class SlurmScheduler(Scheduler):
    def __init__(
        self,
        timeout_s: float = 15.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        env: dict[str, str] | None = None,
        json_filters: bool | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.env = dict(os.environ if env is None else env)
        self._json_filters = json_filters  # None: ask `squeue --version` (`json_filters()`)

    def _run(self, argv: Sequence[str], once: bool = False) -> str:
        """Run a Slurm command, retrying transient failures. `once`: a command that must not
        run twice (a requeue increments the restart count and a second one is refused); it is
        retried only where it certainly did not take effect, else the caller decides from
        the job's state (`Scheduler.requeue`'s restart count)."""
        argv = list(argv)
        last = ""
        for attempt in range(self.retries + 1):
            try:
                out = subprocess.run(
                    argv,
                    capture_output=True,
                    text=True,
                    errors="replace",
                    timeout=self.timeout_s,
                    env=self.env,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                last = f"{argv[0]} timed out after {self.timeout_s}s"
            except FileNotFoundError:
                raise SchedulerError(f"{argv[0]} is not installed") from None
            else:
                if out.returncode == 0:
                    return out.stdout
                last = (out.stderr or out.stdout).strip()[:500]
                if not TRANSIENT.search(last):
                    raise SchedulerError(f"{' '.join(argv[:2])} failed: {last}")
            if once and not NOT_APPLIED.search(last):
                break
            if attempt < self.retries:
                time.sleep(self.backoff_s * (2**attempt))
        kind = SchedulerBusy if BUSY.search(last) else SchedulerUnavailable
        raise kind(f"{' '.join(argv[:2])}: {last}")

    def reachable(self) -> bool:
        """`scontrol ping` once, without retries, within the adapter's timeout: exit 0 and "is
        UP" while slurmctld answers (22.05 prints "... is DOWN" and exits 1 when it does not)."""
        try:
            out = subprocess.run(
                ["scontrol", "ping"],
                capture_output=True,
                text=True,
                errors="replace",
                timeout=self.timeout_s,
                env=self.env,
                check=False,
            )
        except (subprocess.TimeoutExpired, OSError):
            return False
        return out.returncode == 0 and " is UP" in out.stdout

    # ---- readers ----------------------------------------------------------------------------
    def controller_started(self) -> str | None:
        """slurmctld's `BOOT_TIME` in `scontrol show config` as printed (a backup that took
        over has its own; never converted, so receivers in other time zones agree); None when
        the line is missing."""
        found = _BOOT_TIME.search(self._run(["scontrol", "show", "config"]))
        return found.group(1) if found else None

    def node_states(self) -> list[NodeState]:
        out = self._run(["sinfo", "-N", "-h", "-o", "%N|%T|%P|%E"])
        nodes: dict[str, NodeState] = {}
        for line in out.splitlines():
            parts = line.split("|", 3)
            if len(parts) < 4:
                continue
            name, state, part, reason = parts
            part = part.rstrip("*")
            prev = nodes.get(name)
            parts_all = (*(prev.partitions if prev else ()), part)
            reason = "" if reason.strip() == "none" else reason.strip()
            nodes[name] = NodeState(name, state.upper().rstrip("*~#!%$@^-"), reason, parts_all)
        return list(nodes.values())

    def json_filters(self) -> bool:
        """Whether `squeue --json -j` returns the one job (23.02 and later, from `squeue
        --version`, asked once); unknown (the command failed) reads as yes, this time."""
        if self._json_filters is None:
            try:
                found = re.search(r"(\d+)\.(\d+)", self._run(["squeue", "--version"]))
            except SchedulerError:
                return True
            self._json_filters = not found or (int(found[1]), int(found[2])) >= (23, 2)
        return self._json_filters

    def job_state(self, job_id: str) -> JobState | None:
        job_id = check_job(job_id)
        if not self.json_filters():  # 22.05: one job from the text output, not the queue
            try:
                found = self._text_state(job_id)
            except SchedulerError as exc:  # slurmctld forgot it (ended, purged)
                if "invalid job id" not in str(exc).lower():
                    raise
                return self._sacct_state(job_id)
            if found is not None:
                return found
        try:
            text = self._run(["squeue", "--json", "-j", job_id])
        except SchedulerError as exc:  # 23.02 and later refuse a job slurmctld forgot
            if "invalid job id" not in str(exc).lower():
                raise
            text = ""
        doc = json.loads(text or "{}")
        errors = json.dumps(doc.get("errors") or "")
        if doc.get("errors") and not doc.get("jobs") and "invalid job id" not in errors.lower():
            # 22.05 with slurmctld down: exit 0, no jobs, an error (not a forgotten job)
            raise SchedulerUnavailable(f"squeue: {errors[:300]}")
        for j in doc.get("jobs", []):  # 22.05 ignores -j with --json (its fallback): filter
            jid = str(names.slurm_int(j.get("job_id")))
            task = names.slurm_int(j.get("array_task_id"))  # 23.02+: {"set", "number"}
            if task is not None and task != names.SLURM_NO_VAL and "_" in job_id:
                jid = f"{names.slurm_int(j.get('array_job_id'))}_{task}"
            if jid != job_id:
                continue
            reason = str(j.get("state_reason") or "")
            gres = re.search(r"gres/gpu(?::[^=,]+)?=(\d+)", str(j.get("tres_alloc_str") or ""))
            return JobState(
                job_id=job_id,
                name=str(j.get("name") or ""),
                state=_first(j.get("job_state")).upper(),
                nodes=expand_hostlist(j.get("nodes")),
                restarts=names.slurm_int(j.get("restart_cnt")) or 0,
                exit_code=_exit_code(j.get("exit_code")),
                signal=names.slurm_exit(j.get("exit_code"))[1],
                user=user_name(j.get("user_name")),
                comment=str(j.get("comment") or ""),
                excluded=expand_hostlist(j.get("excluded_nodes")),
                held=held(j),
                reason=reason,
                partition=str(j.get("partition") or "") or None,
                start_time=float(t) if (t := names.slurm_int(j.get("start_time"))) else None,
                gpus=int(gres.group(1)) if gres else 0,
                end_time=_ended_at(_first(j.get("job_state")), names.slurm_int(j.get("end_time"))),
                node_count=names.slurm_int(j.get("node_count")) or 0,
                required=expand_hostlist(j.get("required_nodes")),
            )
        return self._sacct_state(job_id)

    # `squeue -O` fields (the `|` after each is its separator); the free text last: a `|` in
    # the comment stays in it. The excluded nodes (no -O field in 22.05) and the name: -o.
    TEXT_FIELDS = (
        "JobArrayID", "State", "RestartCnt", "exit_code", "Reason", "NodeList", "ReqNodes",
        "UserName", "Partition", "StartTime", "EndTime", "NumNodes", "tres-alloc",
        "PriorityLong", "Comment",
    )  # fmt: skip

    def _text_state(self, job_id: str) -> JobState | None:
        """The job from squeue's text output (Slurm 22.05, whose `--json` ignores `-j`); None
        where it is not one plain record of this job (an array's pending meta-job, a newline
        in its comment): the caller reads the JSON then."""
        spec = ",".join(f"{f}:|" for f in self.TEXT_FIELDS[:-1]) + f",{self.TEXT_FIELDS[-1]}:"
        out = self._run(["squeue", "-h", "-t", "all", "-j", job_id, "-O", spec])
        more = self._run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%i|%x|%j"])
        lines, extra = out.rstrip("\n").split("\n"), more.rstrip("\n").split("\n")
        fields = lines[0].split("|", len(self.TEXT_FIELDS) - 1)
        exc = extra[0].split("|", 2)
        if len(lines) != 1 or len(extra) != 1 or len(fields) != len(self.TEXT_FIELDS):
            return None
        if fields[0] != job_id or len(exc) != 3 or exc[0] != job_id:
            return None
        f = dict(zip(self.TEXT_FIELDS, fields, strict=True))
        state, reason = f["State"].upper(), f["Reason"]
        code = int(f["exit_code"]) if f["exit_code"].isdigit() else None
        gres = re.search(r"gres/gpu(?::[^=,]+)?=(\d+)", f["tres-alloc"])
        end = names.slurm_time(f["EndTime"])
        return JobState(
            job_id=job_id,
            name=exc[2],
            state=state,
            nodes=expand_hostlist(f["NodeList"]),
            restarts=int(f["RestartCnt"]) if f["RestartCnt"].isdigit() else 0,
            exit_code=_exit_code(code),
            signal=names.slurm_exit(code)[1],
            user=user_name(f["UserName"]),
            comment="" if f["Comment"] == "(null)" else f["Comment"],
            excluded=expand_hostlist(exc[1]),
            held=f["PriorityLong"] == "0" or reason in HELD_REASONS,
            reason=reason,
            partition=f["Partition"] or None,
            start_time=names.slurm_time(f["StartTime"]),
            gpus=int(gres.group(1)) if gres else 0,
            end_time=_ended_at(state, int(end) if end else None),
            node_count=int(f["NumNodes"]) if f["NumNodes"].isdigit() else 0,
            required=expand_hostlist(f["ReqNodes"]),
        )

    SACCT_FIELDS = "JobID,State,ExitCode,NodeList,Partition,Start,End,User,JobName"

    def _sacct_state(self, job_id: str) -> JobState | None:
        """A job slurmctld forgot, from the accounting: the free text (its name, its comment)
        each last on its own line, since sacct does not escape a `|` or a newline in them."""
        fields = self._sacct_line(job_id, self.SACCT_FIELDS)
        if fields is None:
            return None
        raw_state, code, nodes, partition, start, end, user, name = fields.split("|", 7)
        state = (raw_state.split() or ["UNKNOWN"])[0].upper()  # `CANCELLED by 0`
        comment = self._sacct_line(job_id, "JobID,Comment")
        return JobState(
            job_id=job_id,
            name=name,
            state=state,
            nodes=expand_hostlist(nodes),
            exit_code=_exit_code(code),
            signal=names.slurm_exit(code)[1],
            user=user_name(user),
            partition=partition or None,
            comment=comment or "",
            start_time=names.slurm_time(start),
            end_time=None if state in ACTIVE else names.slurm_time(end),  # else a time limit
        )

    def _sacct_line(self, job_id: str, fields: str) -> str | None:
        """What follows `<job_id>|` on the first line of `sacct -o <fields>` for the job: its
        own (a newline in its name or comment only adds lines after it)."""
        out = self._run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", fields])
        want = fields.count(",")
        for line in out.splitlines():
            head, _, rest = line.partition("|")
            if head == job_id and rest.count("|") >= want - 1:
                return rest
        return None

    # ---- primitives -------------------------------------------------------------------------
    def _drain(self, node: str, reason: str) -> None:
        self._run(
            [
                "scontrol",
                "update",
                f"NodeName={check_node(node)}",
                "State=DRAIN",
                f"Reason={reason}",
            ]
        )

    def _resume(self, node: str) -> None:
        self._run(["scontrol", "update", f"NodeName={check_node(node)}", "State=RESUME"])

    def _requeue(
        self, job_id: str, exclude: tuple[str, ...] | None, hold: bool, delay_s: float
    ) -> None:
        if exclude is None and not hold and delay_s <= 0:
            self._run(["scontrol", "requeue", job_id], once=True)
            return
        self._run(["scontrol", "requeuehold", job_id], once=True)
        self._await(  # a job whose processes are slow to die (the fault) completes later
            lambda: bool((s := self.job_state(job_id)) and s.held and s.state == "PENDING"),
            f"job {job_id} requeue-held",
            retry=True,
        )
        failpoints.hit("requeue_held")
        if exclude is not None or delay_s > 0:
            try:
                self._set_exclude(job_id, exclude, delay_s)
            except SchedulerUnavailable:
                raise  # the action's retry finishes it (held, one restart on)
            except SchedulerError:
                if not hold:  # refused for good: a held job would wait for nobody
                    self._release(job_id)
                raise
        failpoints.hit("excluded")
        if not hold:
            self._release(job_id)

    def _set_exclude(self, job_id: str, exclude: tuple[str, ...] | None, delay_s: float) -> None:
        argv = ["scontrol", "update", f"JobId={job_id}"]
        if exclude is not None:  # exactly this list; `ExcNodeList=` clears it (Slurm 22.05)
            argv.append("ExcNodeList=" + ",".join(check_node(n) for n in exclude))
        if delay_s > 0:
            argv.append(f"StartTime=now+{int(delay_s)}")
        if len(argv) > 3:
            self._run(argv)
            want = set(exclude) if exclude is not None else None
            self._await(
                lambda: bool(
                    (s := self.job_state(job_id)) and (want is None or set(s.excluded) == want)
                ),
                f"job {job_id} excludes {sorted(want or ())}",
            )

    def _hold(self, job_id: str) -> None:
        self._run(["scontrol", "hold", job_id])

    def _release(self, job_id: str) -> None:
        self._run(["scontrol", "release", job_id])

    def _cancel(self, job_id: str) -> None:
        self._run(["scancel", job_id])

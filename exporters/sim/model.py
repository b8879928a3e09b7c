"""The cluster: nodes of GPUs, jobs, the simulated scheduler (Slurm semantics) and the clock."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from exporters.sim import background as bg
from exporters.sim import gpu as G
from exporters.sim import logs
from exporters.sim.jobs import END_STATES, Job
from exporters.sim.logs import LogSink

FB_MIB = {"NVIDIA H200": 143771, "NVIDIA H100 80GB HBM3": 81559}


class SchedulerError(ValueError):
    """A scheduler verb that Slurm would refuse (unknown job/node, wrong state)."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Node:
    name: str
    gpus: list[G.GPU]
    alive: bool = True
    down: bool = False
    drain: bool = False
    reason: str = ""
    lost_t: float = 0.0
    down_after_s: float = 10.0
    drained_by: str = ""
    host_slow: float = 1.0
    ib_down: bool = False
    jobs: list[str] = field(default_factory=list)


class Cluster:
    """A stepping simulated cluster. `step(dt)` advances the clock, jobs and GPU metrics."""

    def __init__(
        self,
        nodes: int | list[str] = 4,
        gpus_per_node: int = 8,
        model_name: str = "NVIDIA H200",
        seed: int = 0,
        start: float = 1735689600.0,
        sink: LogSink | None = None,
        scheduler: str = "sim",
        job_id_base: int = 1000,
        background: Any = None,
    ):
        names = [f"node{i + 1}" for i in range(nodes)] if isinstance(nodes, int) else list(nodes)
        fb = FB_MIB.get(model_name, 81559)
        self.nodes = {
            n: Node(n, [G.GPU(n, i, model_name, fb) for i in range(gpus_per_node)]) for n in names
        }
        self.gpus_per_node = gpus_per_node
        self.rng = random.Random(seed)
        self.now = start
        self.start = start
        self.sink = sink or LogSink()
        self.scheduler = scheduler
        self.jobs: dict[str, Job] = {}
        self.faults: dict[str, dict[str, Any]] = {}
        self._next_id = job_id_base
        # kernel-log events planted by faults: (t, node, lines, fault_id)
        self.kevents: list[tuple[float, str | None, list[str], str]] = []
        self.fs_stall: tuple[str, float] | None = None  # (fault_id, until)
        # the scheduler verbs as they ran: (time, verb, node or job id), e.g. (t, "drain", n)
        self.verbs: list[tuple[float, str, str]] = []
        self._lustre_t = 0.0
        # side-effect hooks for real-Slurm mode (set by the server): node lost / repaired
        self.on_node_lost: Callable[[str, list[Job]], None] | None = None
        self.on_node_repaired: Callable[[str], None] | None = None
        # benign background errors and stale XIDs (a scenario's `background`; None: clean)
        bg.apply(self, background, seed)
        self._update_gpus(0.0)

    # ---------------------------------------------------------------- clock
    def step(self, dt: float) -> None:
        """Advance by dt seconds: node timeouts, placement, jobs, then GPU samples."""
        self.now += dt
        for node in self.nodes.values():
            if not node.alive and not node.down and self.now - node.lost_t >= node.down_after_s:
                self._node_down(node)
        due = [e for e in self.kevents if e[0] <= self.now]
        for ev in sorted(due, key=lambda e: e[0]):
            self.kevents.remove(ev)
            if ev[1] is not None:
                self.sink.node(ev[1], ev[2])
        if self.scheduler == "sim":
            self._schedule()
        self._filesystem()
        for job in list(self.jobs.values()):
            if (
                job.state == "RUNNING"
                and job.external
                and job.os_pid > 1
                and all(self.nodes[n].alive for n in job.nodes)  # a lost node's: NODE_FAIL
                and not _alive(job.os_pid)
            ):
                job.end(self.now, "CANCELLED", 0)  # its process went away (scancel, kill)
                self._release(job)
            if job.state == "RUNNING":
                job.advance(self.now, dt, self.sink, self.rng)
                if job.state != "RUNNING":
                    self._release(job)
        self._update_gpus(dt)
        self.sink.flush()

    def _filesystem(self) -> None:
        """A shared-filesystem stall: every running job stops on the host; Lustre complains."""
        if self.fs_stall is None:
            for job in self.jobs.values():
                if job.stall == "fs":
                    job.stall = None
            return
        fid, until = self.fs_stall
        if self.now >= until:
            self.fs_stall = None
            self.faults.get(fid, {})["active"] = False
            return self._filesystem()
        for job in self.jobs.values():
            if job.state == "RUNNING" and job.stall is None:
                job.stall = "fs"
        if self.now - self._lustre_t >= 30:
            self._lustre_t = self.now
            for node in self.nodes.values():
                if node.alive:
                    self.sink.node(node.name, logs.lustre(self.now, node.name))

    def _update_gpus(self, dt: float) -> None:
        loads: dict[tuple[str, int], G.Load] = {}
        for job in self.jobs.values():
            if job.state == "RUNNING":
                for name, gi in job.alloc:
                    loads[(name, gi)] = job.load(name, gi, self.now)
        for node in self.nodes.values():
            if not node.alive:
                continue
            for g in node.gpus:
                g.update(loads.get((node.name, g.index), G.IDLE), self.now, dt, self.rng)

    # ---------------------------------------------------------------- jobs
    def submit(
        self,
        name: str,
        nodes: int = 1,
        gpus_per_node: int | None = None,
        job_id: str | None = None,
        **spec: Any,
    ) -> Job:
        """Queue a job (PENDING); placement happens on the next step."""
        if job_id is None:
            self._next_id += 1
            job_id = str(self._next_id)
        if job_id in self.jobs:
            raise SchedulerError(f"job_id: {job_id} already exists")
        gpn = gpus_per_node or self.gpus_per_node
        job = Job(
            job_id=job_id,
            name=name,
            nodes_wanted=nodes,
            gpus_per_node=gpn,
            submit_t=self.now,
            **spec,
        )
        self.jobs[job_id] = job
        return job

    def register(
        self,
        job_id: str,
        name: str,
        nodes: list[str],
        gpus: list[int],
        restarts: int = 0,
        pid: int = 0,
        **timing: float,
    ) -> Job:
        """A real Slurm job announces its placement; it (re)starts RUNNING there. `pid` is its
        process: watched for liveness, killed with its node. `timing` overrides the job's
        step_time_s, init_s, warmup_s, log_interval or checkpoint_every_s."""
        for n in nodes:
            if n not in self.nodes:
                raise SchedulerError(f"nodes: unknown node {n!r}", 422)
            have = len(self.nodes[n].gpus)
            if len(set(gpus)) != len(gpus) or not all(0 <= g < have for g in gpus):
                raise SchedulerError(f"gpus: want distinct GPU indices 0..{have - 1} of {n}", 422)
        old = self.jobs.get(job_id)
        if old is not None and old.state == "RUNNING":
            self._release(old)
        job = Job(
            job_id=job_id,
            name=name,
            nodes_wanted=len(nodes),
            gpus_per_node=len(gpus),
            external=True,
            restarts=restarts,
            os_pid=pid,
            submit_t=self.now,
            duration_s=10**9,
            **timing,  # type: ignore[arg-type]
        )
        if old is not None:
            job.ckpt_iter = old.ckpt_iter
        job.alloc = [(n, g) for n in nodes for g in gpus]
        self.jobs[job_id] = job
        self._place(job)
        self._start(job)
        return job

    def _schedule(self) -> None:
        for job in sorted(self.jobs.values(), key=lambda j: int(j.job_id.split("_")[0])):
            if job.state != "PENDING" or job.held or job.external or job.not_before > self.now:
                continue
            free = [
                n
                for n in self.nodes.values()
                if n.alive
                and not n.down
                and not n.drain
                and not n.jobs
                and n.name not in job.excluded
            ]
            if len(free) < job.nodes_wanted:
                job.reason = "Resources"
                continue
            chosen = free[: job.nodes_wanted]
            job.alloc = [(n.name, g) for n in chosen for g in range(job.gpus_per_node)]
            self._place(job)
            self._start(job)

    def _start(self, job: Job) -> None:
        """Start a run of `job` where it is placed; a fault of it whose cause persists comes
        back with it (exporters/sim/inject.py `relapse`)."""
        from exporters.sim.inject import relapse  # inject imports this module

        job.start(self.now, self.sink)
        relapse(self, job)

    def _place(self, job: Job) -> None:
        for node, gi in job.alloc:
            n = self.nodes[node]
            if job.job_id not in n.jobs:
                n.jobs.append(job.job_id)
            n.gpus[gi].job_id = job.job_id

    def _release(self, job: Job) -> None:
        for node, gi in job.alloc:
            n = self.nodes[node]
            if job.job_id in n.jobs:
                n.jobs.remove(job.job_id)
            g = n.gpus[gi]
            if g.job_id == job.job_id:
                g.job_id = ""
                g.exit_t = self.now

    def job(self, job_id: str) -> Job:
        try:
            return self.jobs[job_id]
        except KeyError:
            raise SchedulerError(f"job_id: no job {job_id!r}", 404) from None

    def node(self, name: str) -> Node:
        try:
            return self.nodes[name]
        except KeyError:
            raise SchedulerError(f"node: no node {name!r}", 404) from None

    def _node_down(self, node: Node) -> None:
        node.down, node.reason = True, node.reason or "Not responding"
        for jid in list(node.jobs):
            job = self.jobs[jid]
            self.sink.job(jid, logs.node_fail_cancel(self.now, jid, node.name))
            job.end(self.now, "NODE_FAIL", 1)
            self._release(job)
            if job.requeue and not job.external:
                self._requeue(job, hold=False, reason="NodeFail")

    # ---------------------------------------------------------------- scheduler verbs
    def node_state(self, node: Node) -> str:
        if node.down:
            return "DOWN"
        if node.drain:
            return "DRAIN" if node.jobs else "DRAINED"
        if not node.jobs:
            return "IDLE"
        used = sum(1 for g in node.gpus if g.job_id)
        return "ALLOCATED" if used == len(node.gpus) else "MIXED"

    def drain(self, name: str, reason: str) -> None:
        node = self.node(name)
        node.drain, node.reason = True, reason or "drained"
        self.verbs.append((self.now, "drain", name))

    def resume(self, name: str) -> None:
        node = self.node(name)
        if not node.drain and not node.down:
            raise SchedulerError(f"node {name} is not drained or down")
        if node.down and not node.alive:
            raise SchedulerError(f"node {name} is not responding; repair it first")
        node.drain, node.down, node.reason = False, False, ""
        self.verbs.append((self.now, "resume", name))

    def requeue(
        self, job_id: str, exclude: list[str] | None = None, hold: bool = False, delay_s: float = 0
    ) -> Job:
        """Slurm's requeue: end the run, set the excluded nodes (exactly `exclude`, as
        `scontrol update ExcNodeList=`; None keeps them), pend (held, or not before now+delay)."""
        job = self.job(job_id)
        if job.state == "PENDING":
            raise SchedulerError(f"job {job_id} is pending: nothing to requeue")
        for n in exclude or []:
            self.node(n)
        if job.state == "RUNNING":
            self.sink.job(
                job_id, logs.cancelled(self.now, job_id, job.nodes[0], "DUE TO JOB REQUEUE")
            )
            job.end(self.now, "CANCELLED", 0)
            self._release(job)
        if exclude is not None:
            job.excluded = sorted(set(exclude))
        self._requeue(job, hold, "JobHeldUser" if hold else "BeginTime")
        job.not_before = self.now + delay_s
        self.verbs.append((self.now, "requeue_hold" if hold else "requeue", job_id))
        return job

    def _requeue(self, job: Job, hold: bool, reason: str) -> None:
        job.state, job.held, job.reason = "PENDING", hold, reason
        job.restarts += 1
        job.alloc = []

    def hold(self, job_id: str) -> Job:
        job = self.job(job_id)
        if job.state != "PENDING":
            raise SchedulerError(f"job {job_id} is {job.state}: only pending jobs can be held")
        job.held, job.reason = True, "JobHeldUser"
        self.verbs.append((self.now, "hold", job_id))
        return job

    def release(self, job_id: str) -> Job:
        job = self.job(job_id)
        if not job.held:
            raise SchedulerError(f"job {job_id} is not held")
        job.held, job.reason = False, "None"
        self.verbs.append((self.now, "release", job_id))
        return job

    def cancel(self, job_id: str) -> Job:
        job = self.job(job_id)
        if job.state in END_STATES:
            raise SchedulerError(f"job {job_id} already ended ({job.state})")
        if job.state == "RUNNING":
            self.sink.job(job_id, logs.cancelled(self.now, job_id, job.nodes[0]))
            self._release(job)
        job.end(self.now, "CANCELLED", 0)
        job.held = False
        self.verbs.append((self.now, "cancel", job_id))
        return job

    # ---------------------------------------------------------------- views
    def node_view(self, node: Node) -> dict[str, Any]:
        return {
            "node": node.name,
            "state": self.node_state(node),
            "reason": node.reason,
            "alive": node.alive,
            "jobs": list(node.jobs),
        }

    def job_view(self, job: Job) -> dict[str, Any]:
        return {
            "job_id": job.job_id,
            "name": job.name,
            "state": job.state,
            "nodes": job.nodes,
            "restarts": job.restarts,
            "exit_code": job.exit_code,
            "comment": job.comment,
            "excluded": job.excluded,
            "held": job.held,
            "reason": job.reason,
            "iteration": int(job.iteration),
            "external": job.external,
            "start": job.start_t if job.state != "PENDING" else None,
            "end": job.end_t if job.state in END_STATES else None,
        }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

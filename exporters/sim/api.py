"""The simulator's control API (FastAPI): cluster, jobs, faults, registration of real Slurm jobs,
and the scheduler verbs with Slurm semantics when the scheduler is simulated."""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from catalogue import names
from exporters.sim.inject import clear, repair
from exporters.sim.model import SchedulerError
from exporters.sim.runner import Simulation
from exporters.sim.scenario import FaultSpec, ScenarioError, parse_fault

_NODE = f"^{names.NODE_PATTERN}$"  # pydantic's (Rust) regex: '$' is the end of the text
_JOB = f"^{names.JOB_ID_PATTERN}$"


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DrainIn(_In):
    reason: str = Field(default="drained by goodput", max_length=256)


class RequeueIn(_In):
    exclude: list[str] | None = None  # the job's exclusions become these ([] clears); None keeps
    hold: bool = False
    delay_s: float = Field(default=0.0, ge=0.0, le=86400.0)  # Slurm's StartTime=now+delay


class SubmitIn(_In):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    nodes: int = Field(default=1, ge=1, le=1024)
    gpus_per_node: int = Field(default=8, ge=1, le=8)
    comment: str = Field(default="", max_length=4096)
    duration_s: float = Field(default=86400.0, gt=0)
    step_time_s: float = Field(default=1.2, gt=0.01)


PID_MAX = 1 << 22  # Linux's PID_MAX_LIMIT: a larger pid overflowed os.kill in the tick


class RegisterIn(_In):
    job_id: str = Field(pattern=_JOB)
    name: str = Field(min_length=1, max_length=128)
    nodes: list[str] = Field(min_length=1, max_length=1024)
    gpus: list[int] = Field(min_length=1, max_length=8)
    restarts: int = Field(default=0, ge=0, le=10**6)
    pid: int = Field(default=0, ge=0, le=PID_MAX)
    # optional job timing (default: the simulator's; short ones make fast tests)
    step_time_s: float | None = Field(default=None, gt=0.01, le=3600)
    init_s: float | None = Field(default=None, ge=0, le=3600)
    warmup_s: float | None = Field(default=None, ge=0, le=86400)
    log_interval: int | None = Field(default=None, ge=1, le=100000)
    checkpoint_every_s: float | None = Field(default=None, ge=0, le=10**7)


TIMING = ("step_time_s", "init_s", "warmup_s", "log_interval", "checkpoint_every_s")


class ExitIn(_In):
    state: str = Field(pattern=r"^(COMPLETED|FAILED|CANCELLED)$")
    exit_code: int = 0


def build_app(sim: Simulation, stats: dict[str, float] | None = None) -> FastAPI:
    """The control app over one Simulation (handlers are async: they run on the tick's loop)."""
    app = FastAPI(title="Goodput simulator", version="1")
    c = sim.cluster
    stats = stats if stats is not None else {}

    @app.exception_handler(SchedulerError)
    async def _sched(_: Request, err: SchedulerError) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=err.status)

    @app.exception_handler(ScenarioError)
    async def _scen(_: Request, err: ScenarioError) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=422)

    def sim_scheduler() -> None:
        if c.scheduler != "sim":
            raise SchedulerError("the scheduler is real Slurm here: use Slurm", 409)

    @app.get("/api/v1/cluster")
    async def cluster() -> dict[str, Any]:
        return {
            "now": c.now,
            "scheduler": c.scheduler,
            "scenario": sim.scenario.name,
            "nodes": [c.node_view(n) for n in c.nodes.values()],
            "jobs": [c.job_view(j) for j in c.jobs.values()],
            "faults": list(c.faults.values()),
        }

    @app.get("/api/v1/faults")
    async def faults() -> list[dict[str, Any]]:
        return list(c.faults.values())

    @app.post("/api/v1/faults", status_code=201)
    async def inject_fault(request: Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError:
            raise ScenarioError("fault: body is not JSON") from None
        spec: FaultSpec = parse_fault(body)
        rec = sim.inject(spec)
        if "error" in rec:
            sim.errors.remove(rec)
            raise SchedulerError(rec["error"], 422)
        return rec

    @app.delete("/api/v1/faults/{fault_id}")
    async def clear_fault(fault_id: str) -> dict[str, Any]:
        return clear(c, fault_id)

    @app.post("/api/v1/nodes/{node}/repair")
    async def repair_node(node: str) -> dict[str, Any]:
        repair(c, node)
        for rec in c.faults.values():
            if rec.get("target", {}).get("node") == node:
                rec["active"] = False
        return c.node_view(c.node(node))

    @app.get("/api/v1/jobs")
    async def jobs() -> list[dict[str, Any]]:
        return [c.job_view(j) for j in c.jobs.values()]

    @app.get("/api/v1/jobs/{job_id}")
    async def job(job_id: str) -> dict[str, Any]:
        return c.job_view(c.job(job_id))

    @app.get("/api/v1/jobs/{job_id}/log")
    async def job_log(job_id: str, offset: int = 0) -> dict[str, Any]:
        j = c.job(job_id)
        lines = c.sink.jobs.get(job_id, [])
        offset = max(0, min(offset, len(lines)))
        return {**c.job_view(j), "lines": lines[offset:], "offset": len(lines)}

    @app.post("/api/v1/register")
    async def register(body: RegisterIn) -> dict[str, Any]:
        before = len(c.sink.jobs.get(body.job_id, []))
        timing = body.model_dump(include=set(TIMING), exclude_none=True)
        j = c.register(
            body.job_id, body.name, body.nodes, body.gpus, body.restarts, body.pid, **timing
        )
        return {**c.job_view(j), "offset": before}

    @app.post("/api/v1/jobs/{job_id}/exit")
    async def job_exit(job_id: str, body: ExitIn) -> dict[str, Any]:
        j = c.job(job_id)
        if j.state == "RUNNING":
            c._release(j)
            j.end(c.now, body.state, body.exit_code)
        return c.job_view(j)

    # ------------------------------------------------------------ scheduler verbs (simulated)
    @app.get("/api/v1/scheduler/nodes")
    async def s_nodes() -> list[dict[str, Any]]:
        return [
            {"node": n.name, "state": c.node_state(n), "reason": n.reason} for n in c.nodes.values()
        ]

    @app.get("/api/v1/scheduler/jobs")
    async def s_jobs() -> list[dict[str, Any]]:
        return [_sjob(c.job_view(j)) for j in c.jobs.values()]

    @app.get("/api/v1/scheduler/jobs/{job_id}")
    async def s_job(job_id: str) -> dict[str, Any]:
        return _sjob(c.job_view(c.job(job_id)))

    @app.post("/api/v1/scheduler/nodes/{node}/drain")
    async def s_drain(node: str, body: DrainIn | None = None) -> dict[str, Any]:
        sim_scheduler()
        c.drain(node, (body or DrainIn()).reason)
        return {"node": node, "state": c.node_state(c.node(node)), "reason": c.node(node).reason}

    @app.post("/api/v1/scheduler/nodes/{node}/resume")
    async def s_resume(node: str) -> dict[str, Any]:
        sim_scheduler()
        c.resume(node)
        return {"node": node, "state": c.node_state(c.node(node)), "reason": c.node(node).reason}

    @app.post("/api/v1/scheduler/jobs/{job_id}/requeue")
    async def s_requeue(job_id: str, body: RequeueIn | None = None) -> dict[str, Any]:
        sim_scheduler()
        b = body or RequeueIn()
        return _sjob(c.job_view(c.requeue(job_id, b.exclude, b.hold, b.delay_s)))

    @app.post("/api/v1/scheduler/jobs/{job_id}/hold")
    async def s_hold(job_id: str) -> dict[str, Any]:
        sim_scheduler()
        return _sjob(c.job_view(c.hold(job_id)))

    @app.post("/api/v1/scheduler/jobs/{job_id}/release")
    async def s_release(job_id: str) -> dict[str, Any]:
        sim_scheduler()
        return _sjob(c.job_view(c.release(job_id)))

    @app.post("/api/v1/scheduler/jobs/{job_id}/cancel")
    async def s_cancel(job_id: str) -> dict[str, Any]:
        sim_scheduler()
        return _sjob(c.job_view(c.cancel(job_id)))

    @app.post("/api/v1/scheduler/jobs", status_code=201)
    async def s_submit(body: SubmitIn) -> dict[str, Any]:
        sim_scheduler()
        if body.nodes > len(c.nodes):
            raise SchedulerError(f"nodes: {body.nodes} > cluster size {len(c.nodes)}", 422)
        j = c.submit(
            body.name,
            body.nodes,
            body.gpus_per_node,
            comment=body.comment,
            duration_s=body.duration_s,
            step_time_s=body.step_time_s,
        )
        return _sjob(c.job_view(j))

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> str:
        return own_metrics(sim, stats)

    return app


def _sjob(v: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "job_id",
        "name",
        "state",
        "nodes",
        "restarts",
        "exit_code",
        "comment",
        "excluded",
        "held",
        "reason",
    )
    return {k: v[k] for k in keys}


def own_metrics(sim: Simulation, stats: dict[str, float]) -> str:
    """The simulator's own `goodput_sim_*` metrics in the text format."""
    c = sim.cluster
    states: dict[str, int] = {}
    for j in c.jobs.values():
        states[j.state] = states.get(j.state, 0) + 1
    out = [
        "# HELP goodput_sim_nodes Simulated nodes by liveness.",
        "# TYPE goodput_sim_nodes gauge",
        f'goodput_sim_nodes{{alive="true"}} {sum(n.alive for n in c.nodes.values())}',
        f'goodput_sim_nodes{{alive="false"}} {sum(not n.alive for n in c.nodes.values())}',
        "# HELP goodput_sim_gpus Simulated GPUs.",
        "# TYPE goodput_sim_gpus gauge",
        f"goodput_sim_gpus {sum(len(n.gpus) for n in c.nodes.values())}",
        "# HELP goodput_sim_jobs Simulated jobs by state.",
        "# TYPE goodput_sim_jobs gauge",
        *(f'goodput_sim_jobs{{state="{s}"}} {n}' for s, n in sorted(states.items())),
        "# HELP goodput_sim_faults_active Injected faults still active.",
        "# TYPE goodput_sim_faults_active gauge",
        f"goodput_sim_faults_active {sum(1 for f in c.faults.values() if f.get('active'))}",
        "# HELP goodput_sim_faults_injected_total Faults injected since start.",
        "# TYPE goodput_sim_faults_injected_total counter",
        f"goodput_sim_faults_injected_total {len(c.faults)}",
        "# HELP goodput_sim_tick_seconds Duration of the last simulation tick.",
        "# TYPE goodput_sim_tick_seconds gauge",
        f"goodput_sim_tick_seconds {stats.get('tick_seconds', 0.0):.6f}",
        "# HELP goodput_sim_scrapes_total dcgm endpoint requests served.",
        "# TYPE goodput_sim_scrapes_total counter",
        f"goodput_sim_scrapes_total {int(stats.get('scrapes', 0))}",
        "# HELP goodput_sim_time_seconds The simulated clock (unix seconds).",
        "# TYPE goodput_sim_time_seconds gauge",
        f"goodput_sim_time_seconds {c.now:.3f}",
        "# HELP goodput_sim_up_timestamp_seconds When this simulator started.",
        "# TYPE goodput_sim_up_timestamp_seconds gauge",
        f"goodput_sim_up_timestamp_seconds {stats.get('started', time.time()):.3f}",
    ]
    return "\n".join(out) + "\n"

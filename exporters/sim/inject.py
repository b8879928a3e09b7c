"""Fault injection: resolve a fault's target, apply its effects, plant its log events, and
record its ground truth. Effects per kind live in the small appliers below."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exporters.sim import logs, signature
from exporters.sim.faults import FAULT_KINDS, FaultKind
from exporters.sim.jobs import Event, Job
from exporters.sim.model import Cluster, SchedulerError
from exporters.sim.scenario import FaultSpec


class Target:
    def __init__(self, cluster: Cluster, spec: FaultSpec, kind: FaultKind) -> None:
        self.job = _find_job(cluster, spec)
        node = spec.node
        if node is None and self.job is not None and self.job.alloc:
            node = self.job.alloc[0][0]
        if node is None and kind.needs != "none":
            raise SchedulerError(f"node: required for kind {spec.kind} (or a running job)", 422)
        if node is not None:
            cluster.node(node)
            if self.job is None:
                running = [cluster.jobs[j] for j in cluster.nodes[node].jobs]
                self.job = running[0] if running else None
        if kind.needs == "job" and self.job is None:
            raise SchedulerError(f"job_id: kind {spec.kind} needs a running job", 422)
        gpu = spec.gpu
        if gpu is None and node is not None:
            mine = [g for n, g in (self.job.alloc if self.job else []) if n == node]
            gpu = mine[0] if mine else 0
        if node is not None and gpu is not None and gpu >= cluster.gpus_per_node:
            raise SchedulerError(f"gpu: {gpu} out of range on {node}", 422)
        self.node, self.gpu = node, gpu
        self.rank = 0
        if self.job is not None and node is not None and (node, gpu) in self.job.alloc:
            self.rank = self.job.rank_of(node, gpu)  # type: ignore[arg-type]


def _find_job(cluster: Cluster, spec: FaultSpec) -> Job | None:
    if spec.job_id is not None:
        job = cluster.job(spec.job_id)
    elif spec.job is not None:
        named = [j for j in cluster.jobs.values() if j.name == spec.job]
        if not named:
            raise SchedulerError(f"job: no job named {spec.job!r}", 404)
        job = max(named, key=lambda j: j.submit_t)
    else:
        return None
    if job.state != "RUNNING":
        raise SchedulerError(f"job_id: job {job.job_id} is {job.state}, not RUNNING", 409)
    return job


def inject(cluster: Cluster, spec: FaultSpec, fault_id: str) -> dict[str, Any]:
    """Apply `spec` now; returns the fault record with its ground truth."""
    kind = FAULT_KINDS[spec.kind]
    tgt = Target(cluster, spec, kind)
    params = {**kind.defaults, **spec.params}
    for key, value in params.items():
        if key in kind.defaults and not isinstance(value, (int, float)):
            raise SchedulerError(f"params.{key}: a number is required", 422)
    if params.get("persists", 0) not in (0, 1):
        raise SchedulerError("params.persists: 0 or 1", 422)
    if params.get("persists") and kind.needs != "job":
        raise SchedulerError(f"params.persists: kind {spec.kind} is no cause a job carries", 422)
    truth = signature.truth(params, spec.truth) if spec.kind == signature.KIND else {}
    _APPLY[spec.kind](cluster, tgt, params, fault_id)
    culprit = truth.get("culprit", kind.culprit) == "node"
    rec = {
        "fault_id": fault_id,
        "kind": spec.kind,
        "onset": cluster.now,
        "job_id": tgt.job.job_id if tgt.job else None,
        "job_name": tgt.job.name if tgt.job else None,
        "nodes": [tgt.node] if culprit and tgt.node else [],
        "gpus": [{"node": tgt.node, "gpu": tgt.gpu}] if culprit and tgt.node else [],
        "outcome": kind.outcome,
        "root_cause": kind.root_cause,
        "action": kind.action,
        "culprit": kind.culprit,
        "params": params,
        "active": True,
        "target": {"node": tgt.node, "gpu": tgt.gpu, "rank": tgt.rank},
        **truth,  # a log_signature's kind, outcome, action, culprit: the scenario's
    }
    if params.get("persists"):
        rec["relapses"] = []  # when a later run of the job met the cause again
    if spec.kind == "fs_stall":
        rec["job_ids"] = [j.job_id for j in cluster.jobs.values() if j.state == "RUNNING"]
    cluster.faults[fault_id] = rec
    return rec


def relapse(cluster: Cluster, job: Job) -> None:
    """`job` (re)started: a fault of it whose cause persists (`params.persists`: a missing
    file, a bad config) is still there, so this run meets it again once its start-up is over
    and fails the same way, on the same rank (wherever that rank now runs)."""
    for rec in cluster.faults.values():
        if rec.get("job_id") != job.job_id or not rec.get("active") or "relapses" not in rec:
            continue
        if rec["onset"] >= cluster.now or not job.alloc:
            continue
        name = rec["kind"].split(":")[0]  # a log_signature's kind names its pattern too
        kind = FAULT_KINDS[name]
        params = dict(rec["params"])
        if "crash_after_s" in params:  # from the first step's time, not the process start
            params["crash_after_s"] = job.startup_s + float(params["crash_after_s"])
        t = Target.__new__(Target)
        t.job = job
        t.rank = min(int(rec["target"]["rank"] or 0), len(job.alloc) - 1)
        t.node, t.gpu = job.alloc[t.rank]
        if kind.needs == "job":
            _APPLY[name](cluster, t, params, rec["fault_id"])
            rec["relapses"].append(cluster.now)


def clear(cluster: Cluster, fault_id: str) -> dict[str, Any]:
    """Undo a fault (the hardware is repaired / the condition ends)."""
    rec = cluster.faults.get(fault_id)
    if rec is None:
        raise SchedulerError(f"fault_id: no fault {fault_id!r}", 404)
    rec["active"] = False
    node, gpu = rec["target"]["node"], rec["target"]["gpu"]
    for job in cluster.jobs.values():
        job.events = [e for e in job.events if e.fault_id != fault_id]
        if rec["job_id"] == job.job_id or rec["kind"] == "fs_stall":
            job.stall, job.stuck, job.slow, job.slow_host = None, set(), 1.0, None
            job.nan, job.oom_gpu, job.thermal_gpus = False, None, set()
    cluster.kevents = [e for e in cluster.kevents if e[3] != fault_id]
    if rec["kind"] == "fs_stall":
        cluster.fs_stall = None
    if node is not None:
        repair(cluster, node, only_gpu=gpu if rec["kind"] != "node_lost" else None)
    return rec


def repair(cluster: Cluster, node: str, only_gpu: int | None = None) -> None:
    """Bring a node back: power on (Slurm's ReturnToService=2 returns it), GPUs reset."""
    n = cluster.node(node)
    if not n.alive:
        n.alive, n.down = True, False
        if n.reason == "Not responding":
            n.reason = ""
        if cluster.on_node_repaired:
            cluster.on_node_repaired(node)
    n.ib_down, n.host_slow = False, 1.0
    for g in n.gpus:
        if only_gpu is None or g.index == only_gpu:
            g.repair()


# ------------------------------------------------------------------ per-kind effects
Apply = Callable[[Cluster, Target, dict[str, Any], str], None]


def _crash(
    cluster: Cluster,
    t: Target,
    fid: str,
    after: float,
    lines: list[str],
    exitcode_child: int,
    exit_code: int,
) -> None:
    job = t.job
    if job is None:
        return
    when = cluster.now + after
    node = t.node or job.nodes[0]
    local = t.gpu or 0
    detail = {139: "Segmentation fault (core dumped)", 134: "Aborted (core dumped)"}.get(
        exit_code, f"Exited with exit code {exit_code}"
    )
    tail = logs.elastic_failure(when, t.rank, local, node, exitcode_child, job.pid + t.rank)
    tail.append(logs.srun_task_failed(node, t.rank, detail))
    job.events.append(Event(when, lines + tail, fid, ("FAILED", exit_code)))


def _xid(cluster: Cluster, t: Target, xid: int) -> None:
    assert t.node is not None and t.gpu is not None
    g = cluster.nodes[t.node].gpus[t.gpu]
    g.xid = xid
    pid = t.job.pid + t.rank if t.job else 0
    detail = logs.XID_DETAIL[xid].format(pid=pid, gpu=t.gpu)
    cluster.sink.node(
        t.node, logs.xid_lines(cluster.now, t.node, g.pci_bus_id, g.uuid, xid, detail)
    )


def _hw_crash(xid: int, message: str, stall: bool = True) -> Apply:
    def apply(cluster: Cluster, t: Target, p: dict[str, Any], fid: str) -> None:
        _xid(cluster, t, xid)
        if xid == 79:
            cluster.nodes[t.node].gpus[t.gpu].off_bus = True  # type: ignore[index]
        if xid == 48:
            g = cluster.nodes[t.node].gpus[t.gpu]  # type: ignore[index]
            for f in (
                "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
                "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            ):
                g.bump(f, 1)
            g.counters["DCGM_FI_DEV_ROW_REMAP_PENDING"] = 1
            cluster.sink.node(
                t.node or "",
                logs.xid_lines(
                    cluster.now,
                    t.node or "",
                    g.pci_bus_id,
                    g.uuid,
                    63,
                    logs.XID_DETAIL[63].format(pid=0),
                ),
            )
        if xid == 74:
            g = cluster.nodes[t.node].gpus[t.gpu]  # type: ignore[index]
            g.bump("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 1200)
            g.bump("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", 310)
            g.bump("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 45)
            g.bump("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", 3)
        if t.job is None:
            return
        if stall:
            t.job.stall = "spin"
        when = cluster.now + p["crash_after_s"]
        lines = logs.cuda_error(when, t.rank, message)
        if xid == 74:
            lines = [
                f"{t.node}:{t.job.pid + t.rank}:{t.job.pid + t.rank + 77} [{t.gpu}] NCCL WARN "
                "Cuda failure 'uncorrectable NVLink error detected during the execution'",
                *lines,
            ]
        _crash(cluster, t, fid, p["crash_after_s"], lines, -6, 1)

    return apply


def _app_fault(cluster: Cluster, t: Target, p: dict[str, Any], fid: str) -> None:
    _xid(cluster, t, int(p.get("xid", 13)) if int(p.get("xid", 13)) in (13, 31) else 13)
    when = cluster.now + p["crash_after_s"]
    _crash(
        cluster,
        t,
        fid,
        p["crash_after_s"],
        logs.cuda_error(when, t.rank, "an illegal memory access was encountered"),
        -6,
        134,
    )


def _degradation(cluster: Cluster, t: Target, p: dict[str, Any], fid: str) -> None:
    g = cluster.nodes[t.node].gpus[t.gpu]  # type: ignore[index]
    g.degrade = {k: float(v) for k, v in p.items()}
    remap_t = cluster.now + float(p["remap_after_s"])
    cluster.kevents.append(
        (
            cluster.now + float(p["remap_after_s"]) / 2,
            t.node,
            logs.xid_lines(
                remap_t, t.node or "", g.pci_bus_id, g.uuid, 92, logs.XID_DETAIL[92].format(pid=0)
            ),
            fid,
        )
    )
    cluster.kevents.append(
        (
            remap_t,
            t.node,
            logs.xid_lines(
                remap_t, t.node or "", g.pci_bus_id, g.uuid, 63, logs.XID_DETAIL[63].format(pid=0)
            ),
            fid,
        )
    )


def _ib_flap(cluster: Cluster, t: Target, p: dict[str, Any], fid: str) -> None:
    node = cluster.node(t.node or "")
    node.ib_down = True
    for i in range(int(p["flaps"])):
        at = cluster.now + i * 15
        cluster.kevents.append(
            (
                at,
                node.name,
                [logs.kernel(at, node.name, "mlx5_core 0000:3b:00.0 ib0: Link DOWN")],
                fid,
            )
        )
        cluster.kevents.append(
            (
                at + 6,
                node.name,
                [logs.kernel(at + 6, node.name, "mlx5_core 0000:3b:00.0 ib0: Link UP")],
                fid,
            )
        )
    job = t.job
    if job is None:
        return
    job.stall = "spin"
    cluster.sink.job(
        job.job_id,
        [logs.ib_port_error(node.name, job.pid + r, r % 8) for r in job.local_ranks(node.name)],
    )
    after = float(p["error_after_s"])
    when = cluster.now + after
    seq = int(job.iteration) * 4 + 3
    lines = [logs.ib_transport_error(node.name, job.pid + t.rank, t.gpu or 0)]
    for r in range(len(job.alloc)):
        lines += logs.watchdog(when, r, seq, int(after * 1000), seq + 1, seq - 1)
    _crash(cluster, t, fid, after, lines, -6, 1)


def _straggler(cluster: Cluster, t: Target, p: dict[str, Any], fid: str, host: bool) -> None:
    if host:
        cluster.node(t.node or "").host_slow = float(p["slowdown"])
    else:
        cluster.nodes[t.node].gpus[t.gpu].thermal = True  # type: ignore[index]
    if t.job is not None:
        t.job.slow = float(p["slowdown"])
        if host:
            t.job.slow_host = t.node
        else:
            t.job.thermal_gpus = {(t.node, t.gpu)}  # type: ignore[arg-type]


def _spin_hang(cluster: Cluster, t: Target, p: dict[str, Any], fid: str) -> None:
    job = t.job
    if job is None:
        return
    job.stall = "spin"
    if not p.get("culprit_spins"):  # the rank stuck on the host idles while its peers spin
        job.stuck = {(t.node, t.gpu)}  # type: ignore[arg-type]
    after = float(p["timeout_s"])
    when = cluster.now + after
    seq = int(job.iteration) * 4 + 3
    lines: list[str] = []
    for r in range(len(job.alloc)):
        if r != t.rank:
            lines += logs.watchdog(when, r, seq, int(after * 1000), seq + 1, seq - 1)
    first = 1 if t.rank == 0 and len(job.alloc) > 1 else 0
    t2 = Target.__new__(Target)
    t2.__dict__.update(t.__dict__, rank=first, node=job.alloc[first][0], gpu=job.alloc[first][1])
    _crash(cluster, t2, fid, after, lines, -6, 1)


def _dataloader(cluster: Cluster, t: Target, p: dict[str, Any], fid: str) -> None:
    if t.job is not None:
        t.job.stall = "host"


def _node_lost(cluster: Cluster, t: Target, p: dict[str, Any], fid: str) -> None:
    node = cluster.node(t.node or "")
    node.alive, node.lost_t = False, cluster.now
    node.down_after_s = float(p["slurmd_timeout_s"])
    for jid in node.jobs:
        cluster.jobs[jid].stall = "spin"
    if cluster.on_node_lost:
        cluster.on_node_lost(node.name, [cluster.jobs[j] for j in node.jobs])


def _fs_stall(cluster: Cluster, t: Target, p: dict[str, Any], fid: str) -> None:
    dur = float(p["duration_s"])
    cluster.fs_stall = (fid, cluster.now + dur if dur > 0 else float("inf"))


def _oom(cluster: Cluster, t: Target, p: dict[str, Any], fid: str) -> None:
    assert t.job is not None
    t.job.oom_gpu = (t.node, t.gpu)  # type: ignore[assignment]
    total = cluster.nodes[t.node].gpus[t.gpu or 0].fb_total / 1024  # type: ignore[index]
    _crash(cluster, t, fid, p["crash_after_s"], logs.oom(t.rank, t.gpu or 0, total), 1, 1)


def _nan(cluster: Cluster, t: Target, p: dict[str, Any], fid: str) -> None:
    if t.job is not None:
        t.job.nan = True


def _segfault(cluster: Cluster, t: Target, p: dict[str, Any], fid: str) -> None:
    _crash(
        cluster,
        t,
        fid,
        p["crash_after_s"],
        [
            f"[rank{t.rank}]: Fatal Python error: Segmentation fault",
            f"[rank{t.rank}]: Current thread 0x00007f3a1c5ff640 (most recent call first):",
        ],
        -11,
        139,
    )


def _log_signature(cluster: Cluster, t: Target, p: dict[str, Any], fid: str) -> None:
    pat = signature.pattern(p)
    lines = [pat.examples[0]]
    if pat.source == "kernel":  # the node says it; the job only fails
        cluster.sink.node(t.node or "", [logs.kernel(cluster.now, t.node or "", lines.pop())])
    _crash(cluster, t, fid, p["crash_after_s"], lines, 1, 1)


_APPLY: dict[str, Apply] = {
    "xid79_off_bus": _hw_crash(79, "unspecified launch failure"),
    "ecc_dbe": _hw_crash(48, "uncorrectable ECC error encountered"),
    "gsp_timeout": _hw_crash(119, "unspecified launch failure"),
    "nvlink_error": _hw_crash(74, "uncorrectable NVLink error detected during the execution"),
    "app_fault": _app_fault,
    "degradation": _degradation,
    "ib_flap": _ib_flap,
    "thermal_straggler": lambda c, t, p, f: _straggler(c, t, p, f, host=False),
    "host_straggler": lambda c, t, p, f: _straggler(c, t, p, f, host=True),
    "spin_hang": _spin_hang,
    "dataloader_stall": _dataloader,
    "node_lost": _node_lost,
    "fs_stall": _fs_stall,
    "cuda_oom": _oom,
    "nan_divergence": _nan,
    "segfault": _segfault,
    signature.KIND: _log_signature,
}
assert set(_APPLY) == set(FAULT_KINDS)

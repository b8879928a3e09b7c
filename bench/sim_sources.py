"""The simulation as the receiver's Slurm and Prometheus (`recovery.evidence.Sources`).

Injected through `Settings.sources`, so the production worker collects its evidence
(`recovery.evidence.collect_live`, node ordering and log reading included) from the simulation:
Slurm's facts from the simulator's cluster state (as `scontrol`/`sinfo` spell them), the jobs on
a node from its allocation (as `squeue -w`), and the range queries of
`recovery.evidence.prometheus.queries` answered from the metric history the bench keeps (the
frames the alert conditions read). Logs are the simulator's files, read by the production
connector from `Settings.log_dir`.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from detector import exposition
from recovery.evidence import Bundle, Context, Report, Series, SlurmFacts
from recovery.evidence import prometheus as prom
from recovery.settings import Settings


def sinfo_state(state: str) -> str:
    """The simulator's node state as sinfo's %T spells it."""
    return {"DRAIN": "draining", "DRAINED": "drained"}.get(state, state.lower())


class SimSources:
    """Evidence sources over one simulation run (`cluster`, the bench's metric `history`:
    source -> [(t, frame)], and the log `sink`, flushed before the logs are read)."""

    def __init__(self, cluster: Any, history: dict[str, Any], sink: Any) -> None:
        self.cluster, self.history, self.sink = cluster, history, sink

    # ---------------------------------------------------------------- Slurm
    def jobs_on_node(self, node: str) -> list[str]:
        n = self.cluster.nodes.get(node)
        return list(n.jobs) if n is not None else []

    def slurm(self, ctx: Context, settings: Settings) -> Bundle:
        c = self.cluster
        self.sink.flush()  # the log files as they are now, for the log connector that follows
        facts = SlurmFacts(query="simulator scheduler API")
        job = c.jobs.get(ctx.job_id or "")
        if job is not None:
            facts.job = {
                "job_id": job.job_id,
                "name": job.name,
                "state": job.state,
                "exit_code": job.exit_code,
                "restarts": job.restarts,
                "nodes": list(job.nodes),
                "comment": job.comment,
                "argv": "GET /api/v1/scheduler/jobs/" + job.job_id,
            }
        names = sorted(set(ctx.nodes) | set(facts.job.get("nodes") or []))
        facts.nodes = {
            n: {"state": sinfo_state(c.node_state(c.nodes[n])), "reason": c.nodes[n].reason}
            for n in names
            if n in c.nodes
        }
        empty = not facts.job and not facts.nodes
        return Bundle(slurm=facts, reports=[Report("slurm", "empty" if empty else "ok")])

    # ---------------------------------------------------------------- Prometheus
    def _window(self, src: str, ctx: Context) -> pd.DataFrame:
        parts = [df for t, df in self.history.get(src, ()) if ctx.start <= t <= ctx.end]
        parts = [p for p in parts if len(p)]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()

    def prometheus(self, ctx: Context, settings: Settings) -> Bundle:
        """The series `recovery.evidence.prometheus.queries(ctx)` selects: by job (DCGM by
        hpc_job, job metrics, detector scores), else DCGM by host; XIDs and GPU presence by
        node."""
        out: list[Series] = []
        dcgm = self._window("dcgm", ctx)

        def add(df: pd.DataFrame, metric: str, keys: list[str], name: str | None = None) -> None:
            if df.empty or metric not in df:
                return
            sub = df[["timestamp", *keys, metric]].dropna(subset=[metric])
            for key, g in sub.groupby(keys, sort=True) if keys else [((), sub)]:
                key = key if isinstance(key, tuple) else (key,)
                lab = dict(zip(keys, key, strict=True))
                pts = zip(g["timestamp"].astype(float), g[metric].astype(float), strict=True)
                out.append(
                    Series(
                        name=name or metric,
                        points=list(pts),
                        node=lab.get("node"),
                        gpu=lab.get("gpu"),
                        job_id=lab.get("job_id") or ctx.job_id,
                        query=f"in-process:{name or metric}",
                    )
                )

        def of_job(src: str) -> pd.DataFrame:
            df = self._window(src, ctx)
            return df[df["job_id"] == ctx.job_id] if not df.empty else df

        if ctx.job_id and not dcgm.empty:
            mine = dcgm[dcgm["job_id"] == ctx.job_id]
            for m in prom.DCGM_FIELDS:
                add(mine, m, ["node", "gpu"])
            for m in prom.JOB_METRICS:
                add(of_job("jobm"), m, [])
            add(of_job("node_score"), "goodput_node_suspect_score", ["node"])
            add(of_job("gpu_score"), "goodput_gpu_anomaly_score", ["node", "gpu"])
            for metric in (exposition.PAUSE, *exposition.LEARNED.values()):
                add(of_job("job_exported"), metric, [])
        elif ctx.nodes and not dcgm.empty:
            for m in prom.DCGM_FIELDS:
                add(dcgm[dcgm["node"].isin(ctx.nodes)], m, ["node", "gpu"])
        if ctx.nodes:
            xid = self._window("xid", ctx)
            if not xid.empty:
                add(
                    xid[xid["node"].isin(ctx.nodes)],
                    "goodput_node_xid_errors_total",
                    ["node", "xid"],
                )
            if not dcgm.empty:
                on = dcgm[dcgm["node"].isin(ctx.nodes)]
                add(on, prom.PRESENCE, ["node", "gpu"], name="node_presence")
        status = "ok" if out else "empty"
        return Bundle(series=out, reports=[Report("prometheus", status, "in-process history")])

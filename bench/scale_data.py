"""Prometheus answers and exporter bodies for a generated GPU cluster, in the shapes the real
services produce: dcgm-exporter's label set (`gpu`, `UUID`, `pci_bus_id`, `device`,
`modelName`, `Hostname`, `DCGM_FI_DRIVER_VERSION`, `hpc_job`) and the 23 DCGM fields the engine
reads with healthy H200-like values (`detector.synthetic.HEALTHY`); the answers Prometheus gives
to the detector's queries (`detector.ingest.queries`), and the raw `{__name__=~...}` answer
with every label. Used by `goodput bench scale` and the detector's tests.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import orjson

from detector import fields as F
from detector import ingest
from detector.ingest import KEY, NODE_INFO, Shard, queries
from detector.synthetic import HEALTHY

MODEL = "NVIDIA H200"
FLOATS = {"DCGM_FI_DEV_POWER_USAGE"} | {n for n in F.DCGM_FIELDS if n.startswith("DCGM_FI_PROF")}


@dataclass
class Cluster:
    node: list[str]
    gpu: list[int]
    job: list[str]  # "" = idle
    values: np.ndarray  # (gpus, len(F.DCGM_FIELDS))

    @staticmethod
    def make(gpus: int, idle: float = 0.0, seed: int = 0, no_dcp: int = 0) -> Cluster:
        """`gpus` GPUs, 8 per node, 16 per job; the last `idle` share runs no job. `no_dcp`:
        every `no_dcp`-th node's exporter has no profiling (DCGM_FI_PROF_*) series, as when its
        profiling module failed ("Not collecting DCP metrics", NVIDIA/dcgm-exporter#327;
        NVIDIA/DCGM#3): NaN here, absent from the answers."""
        rng = np.random.default_rng(seed)
        busy = int(round(gpus * (1 - idle)))
        node = [f"node{i // 8 + 1}" for i in range(gpus)]
        job = [str(100000 + i // 16) if i < busy else "" for i in range(gpus)]
        values = np.zeros((gpus, len(F.DCGM_FIELDS)))
        for i, name in enumerate(F.DCGM_FIELDS):
            if name in HEALTHY:
                mu, sd = HEALTHY[name]
                col = rng.normal(mu, sd, gpus)
                values[:, i] = col if name in FLOATS else np.round(np.minimum(col, 1e9))
        u = F.DCGM_FIELDS.index(F.UTIL)
        values[:, u] = np.minimum(values[:, u], 100)
        if no_dcp:
            off = (np.arange(gpus) // 8) % no_dcp == no_dcp - 1
            prof = [i for i, n in enumerate(F.DCGM_FIELDS) if n.startswith("DCGM_FI_PROF")]
            values[np.ix_(off, prof)] = np.nan
        return Cluster(node, [i % 8 for i in range(gpus)], job, values)

    def rows(self, shard: Shard | None) -> np.ndarray:
        """The GPUs a shard's selector returns: its jobs' and every GPU without a job."""
        if shard is None:
            return np.arange(len(self.node))
        owned = {j: shard.owns(j) for j in set(self.job) if j}
        return np.array([i for i, j in enumerate(self.job) if not j or owned[j]], dtype=int)


def vector_answer(result: list) -> bytes:
    return orjson.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})


def _num(v: float, name: str) -> str:
    return repr(float(v)) if name in FLOATS else str(int(v))


def answers(c: Cluster, shard: Shard | None, now: float, hpc_job: bool = True) -> dict[str, bytes]:
    """query -> the answer Prometheus gives to it (the service's fixed set). `hpc_job=False`:
    dcgm-exporter without job mapping (jobs known only from the Slurm exporter's node info)."""
    return {**gpu_answers(c, shard, now, hpc_job), **job_answers(c, shard, now)}


def gpu_answers(
    c: Cluster, shard: Shard | None, now: float, hpc_job: bool = True
) -> dict[str, bytes]:
    """The per-GPU answers (one per DCGM field, and the GPU's processes on the host: about a
    core where a rank runs, no series on a GPU with no job) of `answers`."""
    idx = c.rows(shard).tolist()

    def answer(rows: list[int], values: list[str]) -> bytes:
        return vector_answer(
            [
                {
                    "metric": {
                        KEY: f"{c.node[i]},,{c.gpu[i]},{c.job[i] if hpc_job else ''},{MODEL}"
                    },
                    "value": [now, v],
                }
                for i, v in zip(rows, values, strict=True)
            ]
        )

    out = {}
    for q, expr in queries(shard).items():
        if q in F.DCGM_FIELDS:
            col = F.DCGM_FIELDS.index(q)
            rows = [i for i in idx if not np.isnan(c.values[i, col])]
            out[expr] = answer(rows, [_num(c.values[i, col], q) for i in rows])
        elif q == F.HOST_CPU:
            rows = [i for i in idx if c.job[i]]
            out[expr] = answer(rows, ["1.0"] * len(rows))
    return out


def job_answers(c: Cluster, shard: Shard | None, now: float) -> dict[str, bytes]:
    """The Slurm exporter's node info and the per-job log metrics of `answers`: every job
    logged progress a second before `now`."""
    idx = c.rows(shard)
    out = {}
    for q, expr in queries(shard).items():
        if q in ingest.GPU_COLUMNS:
            continue
        pairs = sorted({(c.job[i], c.node[i]) for i in idx.tolist() if c.job[i]})
        if q == NODE_INFO:
            res = [
                {
                    "metric": {
                        "__name__": NODE_INFO,
                        "job_id": j,
                        "job_name": f"train-{j}",
                        "node": n,
                        "instance": "127.0.0.1:19410",
                        "job": "goodput-slurm-exporter",
                    },
                    "value": [now, "1"],
                }
                for j, n in pairs
            ]
        else:
            val = now - 1.0 if q == F.LAST_PROGRESS else 0.5
            res = [
                {"metric": {"job_id": j}, "value": [now, repr(val)]}
                for j in sorted({j for j, _ in pairs})
            ]
        out[expr] = vector_answer(res)
    return out


def _dcgm_labels(c: Cluster, i: int) -> dict[str, str]:
    """dcgm-exporter's label set for GPU `i` (`hpc_job` only while a job runs there)."""
    g = c.gpu[i]
    m = {
        "gpu": str(g),
        "UUID": f"GPU-{hashlib.md5(f'{c.node[i]}/{g}'.encode()).hexdigest()[:32]}",
        "pci_bus_id": f"00000000:{0x18 + g * 0x10:02X}:00.0",
        "device": f"nvidia{g}",
        "modelName": MODEL,
        "Hostname": c.node[i],
        "DCGM_FI_DRIVER_VERSION": "550.90.07",
    }
    if c.job[i]:
        m["hpc_job"] = c.job[i]
    return m


def dcgm_text(c: Cluster) -> bytes:
    """The cluster as dcgm-exporter's /metrics text (one body for all nodes: tests, bench)."""
    labels = [
        ",".join(f'{k}="{v}"' for k, v in _dcgm_labels(c, i).items()) for i in range(len(c.node))
    ]
    out = []
    for col, name in enumerate(F.DCGM_FIELDS):
        out.append(f"# TYPE {name} gauge\n")
        out += [
            f"{name}{{{lab}}} {_num(c.values[i, col], name)}\n"
            for i, lab in enumerate(labels)
            if not np.isnan(c.values[i, col])
        ]
    return "".join(out).encode()


def slurm_text(c: Cluster) -> bytes:
    """The Slurm exporter's job -> node join for the cluster's jobs."""
    pairs = sorted({(j, n) for j, n in zip(c.job, c.node, strict=True) if j})
    lines = [f'{NODE_INFO}{{job_id="{j}",job_name="train-{j}",node="{n}"}} 1\n' for j, n in pairs]
    return (f"# TYPE {NODE_INFO} gauge\n" + "".join(lines)).encode()


def raw_answer(c: Cluster, now: float) -> bytes:
    """The answer to `{__name__=~"<23 fields>"}` with every label (what the service asked for
    before it aggregated): for the bare-parse comparison."""
    labels = [_dcgm_labels(c, i) for i in range(len(c.node))]
    res = [
        {
            "metric": {"__name__": name}
            | labels[i]
            | {"instance": f"{c.node[i]}:9400", "job": "dcgm"},
            "value": [now, _num(c.values[i, col], name)],
        }
        for col, name in enumerate(F.DCGM_FIELDS)
        for i in range(len(c.node))
        if not np.isnan(c.values[i, col])
    ]
    return vector_answer(res)

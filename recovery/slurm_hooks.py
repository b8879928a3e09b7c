"""Slurm Prolog/Epilog for Goodput: refuse a node Goodput holds, keep dcgm-exporter's job mapping.

Both run on the compute node at every job start and end (slurm.conf `Prolog=`, `Epilog=`), so
they touch local files only — no call to slurmctld, Prometheus or the receiver that could hang
slurmd — and their exit codes are chosen for what Slurm does with them: a Prolog that fails
drains the node and requeues the job, so it fails only when the node is held; an Epilog that
fails drains the node too, so bookkeeping never makes it fail.

- Holds: a file `<hold_dir>/<node>` (written by `hold`, on a directory the nodes share or one
  the site syncs) says "Goodput is checking this node; no new work". The reason is its text.
- Job mapping: dcgm-exporter's `--hpc-job-mapping-dir` reads one file per GPU index (`0`, `1`,
  `2.0` for a MIG instance) holding the ids of the jobs on that GPU, one per line; Prolog adds
  the job's id to the files of its GPUs (`SLURM_JOB_GPUS`, else `CUDA_VISIBLE_DEVICES`), Epilog
  removes it from every file: the `hpc_job` label where nothing else provides it.
"""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from recovery.scheduler.base import check_job, check_node, clean_reason

OK, HELD = 0, 1  # Prolog exit codes: 0 run the job, 1 refuse (Slurm drains, requeues the job)
GPU_INDEX = re.compile(r"\A[0-9]{1,4}(?:\.[0-9]{1,4})?\Z")  # `3`, or `3.1` for a MIG instance
MAX_REASON = 200


@dataclass(frozen=True)
class Outcome:
    code: int
    message: str


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def hold(hold_dir: Path, node: str, reason: str) -> Path:
    """Mark `node` held by Goodput (Prolog refuses jobs there until `release`)."""
    path = Path(hold_dir) / check_node(node)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(path, clean_reason(reason) + "\n")
    return path


def release(hold_dir: Path, node: str) -> bool:
    """Lift Goodput's hold on `node`; False when there was none."""
    path = Path(hold_dir) / check_node(node)
    existed = path.exists()
    path.unlink(missing_ok=True)
    return existed


def held(hold_dir: Path, node: str) -> str | None:
    """The hold reason for `node`, or None when Goodput does not hold it."""
    try:
        text = (Path(hold_dir) / check_node(node)).read_text(errors="replace")
    except FileNotFoundError:
        return None
    return text.strip()[:MAX_REASON] or "goodput: held"


def job_gpus(env: Mapping[str, str]) -> list[str]:
    """The job's GPU indices on this node, from Slurm's environment (UUIDs are left out)."""
    raw = env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES") or ""
    return [g for g in (x.strip() for x in raw.split(",")) if GPU_INDEX.match(g)]


def _edit_mapping(mapping_dir: Path, gpus: list[str] | None, job_id: str, add: bool) -> None:
    """Add `job_id` to the files of `gpus`, or remove it (`gpus=None`: from every GPU's file)."""
    mapping_dir.mkdir(parents=True, exist_ok=True)
    with open(mapping_dir / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # jobs sharing a GPU start and end concurrently
        if gpus is None:
            gpus = [p.name for p in mapping_dir.iterdir() if GPU_INDEX.match(p.name)]
        for gpu in gpus:
            path = mapping_dir / gpu
            jobs = path.read_text().split() if path.exists() else []
            jobs = [j for j in jobs if j != job_id] + ([job_id] if add else [])
            if jobs:
                _write_atomic(path, "".join(f"{j}\n" for j in jobs))
            else:
                path.unlink(missing_ok=True)


def _identity(env: Mapping[str, str]) -> tuple[str, str] | str:
    try:
        return check_node(env.get("SLURMD_NODENAME", "")), check_job(env.get("SLURM_JOB_ID", ""))
    except ValueError as e:
        return f"goodput prolog/epilog: not run by slurmd as expected ({e}); nothing done"


def prolog(env: Mapping[str, str], hold_dir: Path | None, mapping_dir: Path | None) -> Outcome:
    """Refuse the job when Goodput holds this node; otherwise record its GPUs and run it."""
    who = _identity(env)
    if isinstance(who, str):
        return Outcome(OK, who)  # never drain a node over our own inputs
    node, job_id = who
    if hold_dir is not None and (reason := held(hold_dir, node)) is not None:
        return Outcome(HELD, f"{node} is held by Goodput ({reason}); job {job_id} refused")
    if mapping_dir is not None:
        try:
            _edit_mapping(Path(mapping_dir), job_gpus(env), job_id, add=True)
        except OSError as e:
            return Outcome(OK, f"job {job_id}: GPU job mapping not written ({e})")
    return Outcome(OK, f"job {job_id} may run on {node}")


def epilog(env: Mapping[str, str], mapping_dir: Path | None) -> Outcome:
    """Remove the job from the GPU job mapping; always succeeds (a failed Epilog drains)."""
    who = _identity(env)
    if isinstance(who, str):
        return Outcome(OK, who)
    node, job_id = who
    if mapping_dir is not None:
        try:
            _edit_mapping(Path(mapping_dir), None, job_id, add=False)
        except OSError as e:
            return Outcome(OK, f"job {job_id}: GPU job mapping not cleaned ({e})")
    return Outcome(OK, f"job {job_id} ended on {node}")

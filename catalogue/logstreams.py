"""The Loki label contract: how shipped log lines are labelled and how the receiver finds them.

One definition for the Loki shipper (`exporters/loki.py`), the receiver's Loki evidence
(`recovery/evidence/logs.py`) and Promtail (`compose/promtail/promtail.yml`, checked by a test):
a job's output is `{source="job", job_id="<id>"}` (plus `rank` where the line names it), a
node's kernel log is `{source="kernel", node="<node>"}`. Values are validated before they reach
a selector, so nothing from a label or an alert is put into LogQL unchecked.

>>> kernel_selector("node2")
'{source="kernel", node="node2"}'
>>> stream_labels("job", "42", rank="3")
{'source': 'job', 'job_id': '42', 'rank': '3'}
"""

from __future__ import annotations

import re

from catalogue import names, promql

SOURCE = "source"  # label name: which kind of log
JOB = "job"  # source value: Slurm job output, slurm-<job_id>.out
KERNEL = "kernel"  # source value: a node's kernel log, <node>.log
JOB_ID = "job_id"
NODE = "node"
RANK = "rank"
SOURCES = (JOB, KERNEL)
RANK_RE = re.compile(r"\A[0-9]{1,6}\Z")


def stream_labels(kind: str, key: str, rank: str | None = None) -> dict[str, str]:
    """Labels of one line: kind `job` (key = job id) or `kernel` (key = node)."""
    if kind == JOB:
        if not names.valid_job_id(key):
            raise ValueError(f"invalid job id {key[:80]!r}")
        labels = {SOURCE: JOB, JOB_ID: key}
        if rank is not None and RANK_RE.match(rank):
            labels[RANK] = rank
        return labels
    if kind == KERNEL:
        if not names.valid_node(key):
            raise ValueError(f"invalid node {key[:80]!r}")
        return {SOURCE: KERNEL, NODE: key}
    raise ValueError(f"unknown log kind {kind[:40]!r} (one of {', '.join(SOURCES)})")


def job_selector(job_id: str) -> str:
    """LogQL stream selector for a job's output (all ranks)."""
    return promql.selector(**stream_labels(JOB, job_id))


def kernel_selector(node: str) -> str:
    """LogQL stream selector for a node's kernel log."""
    return promql.selector(**stream_labels(KERNEL, node))

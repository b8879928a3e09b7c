"""The Prometheus rule file from the alert conditions: each condition compiled to PromQL (dcgm
label mapping, the Slurm job join), the recording rules, and the file as stable text."""

from __future__ import annotations

from typing import Any

import yaml

from alertdsl.spec import Condition, Spec
from catalogue import promql

JOB_INFO = "goodput_slurm_job_node_info"


def _selector(metric: str, labels: tuple[tuple[str, str], ...], extra: str = "") -> str:
    parts = []
    for k, v in labels:
        for prefix in ("=~", "!~", "!="):
            if v.startswith(prefix):
                parts.append(f"{k}{prefix}{promql.quote(v[len(prefix) :])}")
                break
        else:
            parts.append(f"{k}={promql.quote(v)}")
    if extra:
        parts.append(extra)
    return f"{metric}{{{', '.join(parts)}}}" if parts else metric


# The detector's shard label (compose/*/prometheus.yml: hashmod of the job id at scrape time):
# like hpc_job it follows the job, not the GPU, so a GPU's series are compared without it.
SHARD = "goodput_shard"
# How far back a `new_series` counter's last value is looked for: one back within this after a
# gap is the same series, not a new one (all its counts firing again)
NEW_SERIES_MEMORY = "1h"


def dcgm_map(expr: str) -> str:
    """dcgm-exporter labels -> Goodput's: Hostname/hostname -> node, hpc_job -> job_id (the
    shard label, which follows the job, is dropped)."""
    e = f'label_replace({expr}, "node", "$1", "Hostname", "(.+)")'
    e = f'label_replace({e}, "node", "$1", "hostname", "(.+)")'
    e = f'label_replace({e}, "job_id", "$1", "hpc_job", "(.+)")'
    return f"max without (Hostname, hostname, hpc_job, {SHARD}) ({e})"


def job_join(expr_with: str, expr_without: str | None = None) -> str:
    """Add job_id from Slurm's job->node info to series that lack it (one job per node)."""
    without = expr_without if expr_without is not None else expr_with
    joined = f"({without}) * on (node) group_left (job_id) topk by (node) (1, {JOB_INFO})"
    alone = f"({without}) unless on (node) {JOB_INFO}"
    if expr_without is None:
        return f"{joined}\nor\n{alone}"
    return f"({expr_with})\nor\n{joined}\nor\n{alone}"


def fmt_number(x: float) -> str:
    return f"{x:g}"


def _compare(lhs: str, c: Condition) -> str:
    if c.op == "in":
        return " or ".join(f"{lhs} == {fmt_number(v)}" for v in c.values)
    assert c.threshold is not None  # noqa: S101 - validated in _condition
    return f"{lhs} {c.op} {fmt_number(c.threshold)}"


def _core(c: Condition, hpc: str) -> str:
    """The condition for one selector variant; `hpc` is an extra dcgm matcher or ''."""
    mapped = dcgm_map if c.source == "dcgm" else (lambda e: e)
    sel = _selector(c.metric, c.labels, hpc)
    if c.kind == "threshold":  # with `by`: one series per group, whatever else its labels say
        e = mapped(_compare(sel, c))
        return f"max by ({', '.join(c.by)}) ({e})" if c.by else e
    if c.kind == "increase" and c.source == "dcgm":
        # A job ending drops hpc_job and starts a new series, often at the very moment of the
        # fault, so increase() per series misses it. Instead: the GPU's value now minus its
        # lowest value within the window, whatever the job (a counter reset gives 0, not a rise).
        every = _selector(c.metric, c.labels)
        low = f"min without (hpc_job, {SHARD}) (min_over_time({every}[{c.window}]))"
        return mapped(_compare(f"({sel} - ignoring (hpc_job, {SHARD}) group_left {low})", c))
    if c.kind == "increase":
        core = _compare(f"increase({sel}[{c.window}])", c)
        if c.new_series:
            # the series' last value before the window, within NEW_SERIES_MEMORY: a series back
            # from a scrape gap (an exporter or Prometheus restart) is not new, and a rise
            # across the gap counts (as the in-process evaluator compares with the last sample)
            before = f"last_over_time({sel}[{NEW_SERIES_MEMORY}] offset {c.window})"
            rise = _compare(f"({sel} - {before})", c)
            core = f"{core} or {rise} or ({_compare(sel, c)} unless {before})"
        return mapped(core)
    # gone: seen within the window, not now (per `by`), optionally while the coarser group reports
    by = ", ".join(c.by)
    every = mapped(_selector(c.metric, c.labels))
    e = f"max by ({by}) ({mapped(f'last_over_time({sel}[{c.window}])')}) unless on ({by}) {every}"
    if c.while_present:
        e = f"({e}) and on ({', '.join(c.while_present)}) {every}"
    if c.while_any:  # all gone at once is the exporter or Prometheus, not every node
        e = f"({e}) and on () count({every}) > 0"
    return e


def condition_expr(c: Condition) -> str:
    """The PromQL of one condition, with dcgm label mapping and the Slurm job join."""
    if c.kind == "promql":
        return c.expr
    if c.kind == "gone":  # the job now allocated on the node, from Slurm (hpc_job has gone too)
        return job_join(_core(c, "")) if "node" in c.by else _core(c, "")
    if c.source == "dcgm":
        return job_join(_core(c, 'hpc_job!=""'), _core(c, 'hpc_job=""'))
    if c.join_job:
        return job_join(_core(c, ""))
    return _core(c, "")


def described(text: str, c: Condition) -> str:
    """The description with `[threshold]` as the condition's threshold (one source: the
    condition)."""
    if "[threshold]" in text and c.threshold is None:
        raise ValueError(f"{c.signal}: `[threshold]` in a description of a condition without one")
    return text if c.threshold is None else text.replace("[threshold]", fmt_number(c.threshold))


def render_rules(spec: Spec) -> dict[str, Any]:
    """The Prometheus rule file (as a dict) for every recording rule and alert condition."""
    recording = []
    for r in spec.recording:
        expr = r["expr"]
        if r.get("source") == "dcgm":
            m = _selector(expr, ())
            expr = job_join(dcgm_map(f'{m}{{hpc_job!=""}}'), dcgm_map(f'{m}{{hpc_job=""}}'))
        recording.append({"record": r["record"], "expr": expr})
    alerting = []
    for a in spec.alerts:
        for c in a.conditions:
            alerting.append(
                {
                    "alert": a.name,
                    "expr": condition_expr(c),
                    "for": c.for_ or a.for_,
                    "labels": {"severity": a.severity, "scope": a.scope, "signal": c.signal},
                    "annotations": {
                        "summary": a.summary,
                        "description": described(a.description, c),
                        "runbook_url": spec.runbook_url(a.name),
                    },
                }
            )
    return {
        "groups": [
            {"name": "goodput-recording", "rules": recording},
            {"name": "goodput-alerts", "rules": alerting},
        ]
    }


class Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, s: str) -> yaml.Node:
    style = "|" if "\n" in s else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style=style)


Dumper.add_representer(str, _str)

HEADER = (
    "# GENERATED by `goodput rules generate` from alertmanager/alerts.yaml. Do not edit:\n"
    "# change alerts.yaml and regenerate (a test fails when this file is stale).\n"
)


def dump_rules(spec: Spec) -> str:
    """The rule file as text, stable across runs."""
    body = yaml.dump(render_rules(spec), Dumper=Dumper, sort_keys=False, width=100)
    return HEADER + body

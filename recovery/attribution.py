"""The attribution engine: evidence → symptoms → refined symptoms → outcome, rules as data.

Stages (rules in `recovery/rules/*.yaml`, log patterns from `catalogue`):
1. extract — log lines and Slurm node reasons through the catalogue (its patterns are the
   one home of every signature), metric conditions over series, scheduler facts → `Sym`s with
   a time, node, role and outcome hint; nothing from before the job's current run counts;
2. refine — order by time; an outcome rule whose symptoms are present marks the symptoms it
   `explains` (seen at or after its first one) as cascade; cascades never become the root
   while an initiating symptom remains;
3. choose — the outcome whose earliest initiating symptom comes first (rule order breaks
   ties), its culprit nodes, and a confidence with the basis it was computed on. With no rule,
   `healthy` only when the sources that answered show a running, progressing job; otherwise
   `unknown` with the reason.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import catalogue
from catalogue import names
from catalogue import priors as physics_priors
from recovery import ruleset, validate
from recovery.diagnosis import CATEGORY, Diagnosis
from recovery.evidence import Bundle, Context, LogLine, Series
from recovery.ruleset import RuleError as RuleError  # re-exported: a rules file is malformed

RULES_DIR = Path(__file__).resolve().parent / "rules"
SOURCES = ("prometheus", "log", "slurm")
PROGRESS = frozenset({"progress", "checkpoint"})  # catalogue info symptoms of a working job
PROGRESS_METRICS = ("goodput_job_last_progress_timestamp_seconds", "goodput_job_iteration")
RUNNING = ("RUNNING", "COMPLETING", "CONFIGURING")
# metric-rule thresholds that may name a physics prior (catalogue/priors.yaml) instead of a number
PRIOR_KEYS = ("min", "util_min", "util_max", "sm_max", "fb_min", "mask")
FB_USED = "DCGM_FI_DEV_FB_USED"


@dataclass
class Sym:
    id: str
    role: str
    time: float | None
    source: str
    node: str | None = None
    gpu: str | None = None
    detail: str = ""
    outcome: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    action: str = ""  # the catalogue's action hint of the signature (an XID's job_action)


@dataclass(frozen=True)
class Rules:
    log: tuple[dict[str, Any], ...]
    metrics: tuple[dict[str, Any], ...]
    slurm: tuple[dict[str, Any], ...]
    outcomes: tuple[dict[str, Any], ...]
    tolerance_s: float


@lru_cache(maxsize=4)
def load_rules(directory: str | None = None) -> Rules:
    """Merge every `*.yaml` in `directory` (default: the packaged rules), in name order;
    typed and cross-checked by `recovery.ruleset` (`RuleError` names the file and entry)."""
    base = Path(directory or os.environ.get("GOODPUT_RULES_DIR") or RULES_DIR)
    merged, tolerance = ruleset.load(base)
    return Rules(
        log=tuple(merged["log"]),
        metrics=tuple(_resolve_priors(r) for r in merged["metrics"]),
        slurm=tuple(merged["slurm"]),
        outcomes=tuple(merged["outcomes"]),
        tolerance_s=tolerance,
    )


def _resolve_priors(rule: dict[str, Any]) -> dict[str, Any]:
    """A metric rule with its threshold names (`util_min: busy_util`) replaced by the physics
    priors' values (catalogue/priors.yaml, the one home of those thresholds). The series carry no
    GPU model, so the model-independent `generic` parameters apply."""
    params = physics_priors.load().params(physics_priors.GENERIC)
    out = dict(rule)
    for key in PRIOR_KEYS:
        value = out.get(key)
        if isinstance(value, str):
            if value not in params:
                raise RuleError(f"metric rule {rule.get('id')}: no generic prior named {value!r}")
            out[key] = params[value]
    return out


# ------------------------------------------------------------------------ stage 1: extract


_XID_KIND = {
    "gpu_hardware_fault": "xid_fatal",
    "workload_crash": "xid_app",
    "gpu_degradation": "xid_degradation",
}


def _xid_symptom(code: int) -> tuple[str, str, str, str] | None:
    """(symptom, role, outcome hint, action hint) of an XID by the catalogue's table. A code
    the table does not know is `xid_unknown` and one that needs a person `xid_other` (both
    initiating: never healthy); one NVIDIA says to ignore (job action none) is no symptom."""
    info = catalogue.xid_info(code)
    if info is None:  # the catalogue's `unlisted` entry says what it means; never healthy
        unlisted = catalogue.loader.default().xid_unlisted
        if unlisted is None or unlisted.outcome not in _XID_KIND:
            return "xid_unknown", "initiating", "", ""
        return _XID_KIND[unlisted.outcome], "initiating", unlisted.outcome, unlisted.job_action
    if info.consequence:
        return "xid_cascade", "cascade", "", ""
    if info.outcome in _XID_KIND:
        return _XID_KIND[info.outcome], "initiating", info.outcome, info.job_action
    if info.job_action == "none":
        return None
    return "xid_other", "initiating", "", info.job_action


def _rank_node(rank: Any, job_nodes: list[str], gpn: int) -> str | None:
    """The node of a rank under Slurm's block placement: `gpn` ranks per node, in the job's
    node list order (Slurm's NodeList)."""
    if isinstance(rank, int) and job_nodes and 0 <= rank // gpn < len(job_nodes):
        return job_nodes[rank // gpn]
    return None


# symptom, role, outcome, groups, pattern, action hint
Hit = tuple[str, str, str, dict[str, Any], str, str]


def _hits(text: str, source: str, rules: Rules) -> tuple[list[Hit], bool, bool]:
    """Catalogue matches of one line as symptoms (XIDs classified, overrides applied), whether
    the line shows progress, and whether it opens a pause (checkpoint save/load, start-up)."""
    overrides = {r["pattern"]: r for r in rules.log}
    hits: list[Hit] = []
    progress = pause = False
    for m in catalogue.match_line(text, source):
        if m.role == "info":
            progress = progress or m.symptom in PROGRESS
            pause = pause or m.symptom == "pause"
            continue
        symptom, role, outcome, action = m.symptom, m.role, m.outcome, m.action
        if symptom == "xid" and "xid" in m.groups:
            kind = _xid_symptom(int(m.groups["xid"]))
            if kind is None:
                continue
            symptom, role, outcome, action = kind
        ov = overrides.get(m.pattern, {})
        role, outcome = ov.get("role", role), ov.get("outcome", outcome)
        hits.append((symptom, role, outcome, m.groups, m.pattern, action))
    return hits, progress, pause


def _log_symptoms(
    lines: list[LogLine], rules: Rules, gpn: int, job_nodes: list[str]
) -> tuple[list[Sym], list[LogLine], bool]:
    """Symptoms of the log lines, the lines that show the job progressing, and whether a pause
    is still open (the last pause line comes after the last progress line)."""
    out: list[Sym] = []
    progress: list[LogLine] = []
    last = {"progress": float("-inf"), "pause": float("-inf")}
    for ln in lines:
        kind = "kernel" if ln.kind == "kernel" else "job"
        hits, progressing, pausing = _hits(ln.text, kind, rules)
        if progressing:
            progress.append(ln)
        for word, flag in (("progress", progressing), ("pause", pausing)):
            if flag and ln.time is not None:
                last[word] = max(last[word], ln.time)
        for symptom, role, outcome, groups, pattern, action in hits:
            node = ln.node
            g = groups.get("node")
            if node is None and isinstance(g, str) and validate.NODE.fullmatch(g):
                node = g
            if node is None:
                node = _rank_node(groups.get("rank"), job_nodes, gpn)
            out.append(
                Sym(
                    id=symptom,
                    role=role,
                    time=ln.time,
                    source="log",
                    node=node,
                    detail=f"{pattern}: {ln.text.strip()[:200]}",
                    outcome=outcome,
                    evidence={
                        "source": "log",
                        "query_or_path": ln.path,
                        "line": ln.line,
                        "time": ln.time,
                        "node": node,
                        "gpu": None,
                        "excerpt": ln.text.strip()[:300],
                    },
                    action=action,
                )
            )
    return out, progress, last["pause"] > last["progress"]


def _ev(s: Series, t: float | None, excerpt: str) -> dict[str, Any]:
    return {
        "source": "prometheus",
        "query_or_path": s.query or s.name,
        "line": None,
        "time": t,
        "node": s.node,
        "gpu": s.gpu,
        "excerpt": excerpt[:300],
    }


def _sym(
    rule: dict[str, Any], s: Series, t: float | None, detail: str, node: str | None = "series"
) -> Sym:
    n = s.node if node == "series" else node
    return Sym(
        id=rule["id"],
        role=rule.get("role", "initiating"),
        time=t,
        source="prometheus",
        node=n,
        gpu=s.gpu if n == s.node else None,
        detail=detail,
        outcome=rule.get("outcome", ""),
        evidence=_ev(s, t, f"{s.name}: {detail}"),
    )


def _by_name(series: list[Series], name: str) -> list[Series]:
    return [s for s in series if s.name == name and s.points]


def _run_len(points: list[tuple[float, float]], pred: Any) -> tuple[float | None, float]:
    """Start and duration of the longest run of points satisfying `pred`."""
    best_start, best, start = None, 0.0, None
    for t, v in points:
        if pred(v):
            start = t if start is None else start
            if t - start >= best:
                best_start, best = start, t - start
        else:
            start = None
    return best_start, best


def _metric_symptoms(series: list[Series], rules: Rules, pause_open: bool = False) -> list[Sym]:
    """Symptoms of the metric rules, in their order (a rule may read an earlier one's)."""
    out: list[Sym] = []
    gpu_util = _by_name(series, "DCGM_FI_DEV_GPU_UTIL")
    for rule in rules.metrics:
        kind = rule.get("kind")
        metric = rule.get("metric", "")
        if kind == "xid":
            for s in _by_name(series, metric):
                prev = 0
                for t, v in s.points:
                    code = int(v)
                    xk = _xid_symptom(code) if code and code != prev else None
                    if xk is not None:
                        sid, role, outcome, action = xk
                        out.append(
                            Sym(
                                sid,
                                role,
                                t,
                                "prometheus",
                                s.node,
                                s.gpu,
                                f"XID {code}",
                                outcome,
                                _ev(s, t, f"{s.name} = {code}"),
                                action,
                            )
                        )
                    prev = code
        elif kind in ("increase", "above"):
            for s in _by_name(series, metric):
                base = s.points[0][1]
                for t, v in s.points:
                    hit = v - base >= rule["min"] if kind == "increase" else v >= rule["min"]
                    if hit:
                        word = f"rose by {v - base:g}" if kind == "increase" else f"= {v:g}"
                        out.append(_sym(rule, s, t, f"{metric} {word}"))
                        break
        elif kind == "vanished" and (present := _by_name(series, metric)):
            last_seen = max(s.points[-1][0] for s in present)
            gap = float(rule.get("gap_s", 30))
            gone = [s for s in present if last_seen - s.points[-1][0] > gap]
            for s in gone:
                out.append(_sym(rule, s, s.points[-1][0], "GPU stopped reporting"))
            by_node: dict[str, list[Series]] = {}
            for s in present:
                by_node.setdefault(s.node or "", []).append(s)
            for node, group in by_node.items():
                if node and len(by_node) > 1 and all(g in gone for g in group):
                    t = max(g.points[-1][0] for g in group)
                    out.append(
                        Sym(
                            "node_silent",
                            "initiating",
                            t,
                            "prometheus",
                            node,
                            None,
                            "every GPU of the node stopped reporting",
                            "node_lost",
                            _ev(group[0], t, "node stopped answering"),
                        )
                    )
        elif kind == "prior":
            out += _prior(series, rule)
        elif kind == "idle":
            if rule.get("from_start") and any(
                v > 0 for s in _by_name(series, "goodput_job_iteration") for _, v in s.points
            ):
                continue  # an iteration was reported (in the window or before it): it started
            if not (rule.get("unless_pause") and pause_open):
                peers = {(s.node, s.gpu) for s in out if s.id == rule.get("peers_spin")}
                scores = _by_name(series, rule.get("confirm") or "")
                out += _idle(gpu_util, rule, _by_name(series, FB_USED), peers, scores)
        elif kind == "stall":
            for s in _by_name(series, metric):
                start, dur = _frozen(s.points)
                if dur >= rule["min_s"]:
                    out.append(_sym(rule, s, start, f"no progress for {dur:.0f} s", node=None))
        elif kind == "slowdown":
            for s in _by_name(series, metric):
                vals = [v for _, v in s.points if v > 0]
                if len(vals) < 6:
                    continue
                early = statistics.median(vals[: len(vals) // 3])
                if early <= 0:
                    continue
                # it must last `min_s`: the first steps after a checkpoint save run ~18 % slow
                limit = early * rule["ratio"]
                start, dur = _run_len(s.points[len(vals) // 3 :], lambda v, lim=limit: v >= lim)
                if start is not None and dur >= rule.get("min_s", 0):
                    v = dict(s.points)[start]
                    out.append(
                        _sym(rule, s, start, f"iteration time {v:.3g}s vs {early:.3g}s", node=None)
                    )
        elif kind == "peer_low":
            out += _peer_low(_by_name(series, metric), rule)
    return out


def _frozen(points: list[tuple[float, float]]) -> tuple[float | None, float]:
    """Longest stretch where a value did not change (progress timestamp frozen)."""
    best_start, best, start, prev = None, 0.0, None, None
    for t, v in points:
        if prev is not None and v == prev:
            start = start if start is not None else t
            if t - start >= best:
                best_start, best = start, t - start
        else:
            start = None
        prev = v
    return best_start, best


def _idle(
    util: list[Series],
    rule: dict[str, Any],
    fb: list[Series],
    spinning: set[Any],
    scores: list[Series] | None = None,
) -> list[Sym]:
    """GPUs of a running job at ~0 % for min_s after having worked (some or all of them). With
    `fb_min`, a GPU whose memory was released (the process is gone) is not idle but ended;
    with `peers_spin` (a spin rule's id), a GPU idle from the start counts when every other GPU
    of the job spins: the rank a collective waits on. `from_start`: only GPUs that never worked
    count, idle from their first sample; `confirm` (a detector score) with `min`: only GPUs
    whose score reached `min` in the window (the detector's own allowance, e.g. start-up)."""
    held = {(s.node, s.gpu): s.points[-1][1] for s in fb}
    score = {(s.node, s.gpu): max(v for _, v in s.points) for s in scores or []}
    idle: list[tuple[Series, float]] = []
    for s in util:
        if held.get((s.node, s.gpu), float("inf")) < rule.get("fb_min", float("-inf")):
            continue  # an FB series that is not reported says nothing: the rule holds as before
        if rule.get("confirm") and score.get((s.node, s.gpu), float("-inf")) < rule["min"]:
            continue  # the detector did not score it over its allowance (or is silent)
        worked = next((i for i, (_, v) in enumerate(s.points) if v > 50), None)
        others = {(g.node, g.gpu) for g in util if g is not s}
        if rule.get("from_start"):
            if worked is not None:
                continue  # it worked: an idle hang after start is another rule's
            worked = 0
        elif worked is None and others and others <= spinning:
            worked = 0
        if worked is None:
            continue
        start, dur = _run_len(s.points[worked:], lambda v: v <= rule["util_max"])
        # the run must last to the end of the series: a job that ended is not idle
        if start is not None and dur >= rule["min_s"] and s.points[-1][1] <= rule["util_max"]:
            idle.append((s, start))
    if not util or not idle:
        return []
    if rule.get("scope") == "all":
        if len(idle) == len(util):
            t = min(st for _, st in idle)
            what = f"all {len(util)} GPUs" if len(util) > 1 else "the job's only GPU"
            how = "never iterated" if rule.get("from_start") else "idle"
            return [_sym(rule, idle[0][0], t, f"{what} {how}, memory held", node=None)]
        return []
    if len(idle) < len(util):
        return [_sym(rule, s, t, "GPU idle while its peers are not") for s, t in idle]
    return []


_OPS = {
    ">=": lambda x, v: x >= v,
    "<=": lambda x, v: x <= v,
    ">": lambda x, v: x > v,
    "<": lambda x, v: x < v,
    "&": lambda x, v: (int(x) & int(v)) != 0,
}


def _prior_holds(rule_id: str, sample: dict[str, float]) -> bool:
    """Whether a physics prior (catalogue/priors.yaml, any alternative with this id) holds on
    one sample of one GPU; a field not reported or a parameter the generic model lacks makes
    that alternative silent, as in the detector."""
    pri = physics_priors.load()
    params = pri.params(physics_priors.GENERIC)
    for alt in (r for r in pri.rules if r.id == rule_id):
        vals = [
            (sample.get(c.field), params.get(c.value) if isinstance(c.value, str) else c.value)
            for c in alt.when
        ]
        if all(
            x is not None and v is not None and _OPS[c.op](x, v)
            for (x, v), c in zip(vals, alt.when, strict=True)
        ):
            return True
    return False


def _tail(points: list[tuple[float, float]]) -> float | None:
    """Start of the run of truthy points that reaches the last point (None: the last is not)."""
    start = None
    for t, v in points:
        start = (t if start is None else start) if v else None
    return start


def _prior(series: list[Series], rule: dict[str, Any]) -> list[Sym]:
    """GPUs on which the physics prior `rule` held for min_s (`scope: gpu`, one symptom each);
    `scope: all`: every GPU of a job on at most `max_nodes` nodes, to the last sample, while
    the job's progress metrics did not advance (one symptom, no node: nothing localises it)."""
    per_gpu: dict[tuple[str | None, str | None], dict[float, dict[str, float]]] = {}
    first: dict[tuple[str | None, str | None], Series] = {}
    for s in series:
        if s.gpu is not None and s.name.startswith("DCGM_"):
            first.setdefault((s.node, s.gpu), s)
            for t, v in s.points:
                per_gpu.setdefault((s.node, s.gpu), {}).setdefault(t, {})[s.name] = v
    flags = {
        k: [(t, float(_prior_holds(rule["rule"], smp[t]))) for t in sorted(smp)]
        for k, smp in per_gpu.items()
    }
    min_s = float(rule.get("min_s", 30))
    if rule.get("scope") != "all":
        out = []
        for k, pts in flags.items():
            start, dur = _run_len(pts, lambda v: v > 0)
            if start is not None and dur >= min_s:
                out.append(
                    _sym(rule, first[k], start, f"physics prior {rule['rule']} for {dur:.0f} s")
                )
        return out
    nodes = {k[0] for k in flags}
    if not flags or len(nodes) > int(rule.get("max_nodes", 1)):
        return []
    last = max(pts[-1][0] for pts in flags.values() if pts)
    starts = [
        _tail(pts) if pts and pts[-1][0] >= last - float(rule.get("gap_s", 15)) else None
        for pts in flags.values()
    ]
    if any(st is None for st in starts):
        return []
    start = max(st for st in starts if st is not None)
    if last - start < min_s or _advanced(series, start):
        return []
    k = next(iter(flags))
    what = f"all {len(flags)} GPUs" if len(flags) > 1 else "the job's only GPU"
    detail = f"physics prior {rule['rule']} on {what} for {last - start:.0f} s, no progress"
    return [_sym(rule, first[k], start, detail, node=None)]


def _advanced(series: list[Series], since: float) -> bool:
    """Whether a job progress metric (iteration, last progress time) rose after `since`."""
    for s in series:
        if s.name in PROGRESS_METRICS and s.points:
            before = [v for t, v in s.points if t <= since] or [s.points[0][1]]
            if s.points[-1][1] > before[-1]:
                return True
    return False


def _peer_low(series: list[Series], rule: dict[str, Any]) -> list[Sym]:
    """A node whose GPUs sit below `ratio` × the other nodes' median for min_s; else one GPU
    below `ratio` × both the job's other GPUs and its own node's others, yet above a quarter of
    them (slowed, not stuck: an idle GPU is a hang's) -- one slow GPU among eight moves its
    node's average by ~5 %, so it is named by itself."""
    per_node: dict[str, list[Series]] = {}
    for s in series:
        if s.node:
            per_node.setdefault(s.node, []).append(s)
    out = _gpu_low(series, rule)
    if len(per_node) < 2:
        return out
    times = sorted({t for s in series for t, _ in s.points})
    node_vals = {n: [dict(s.points) for s in g] for n, g in per_node.items()}

    def mean_at(n: str, t: float) -> float | None:
        vals = [d[t] for d in node_vals[n] if t in d]
        return sum(vals) / len(vals) if vals else None

    for n in per_node:
        flags = []
        for t in times:
            mine = mean_at(n, t)
            others = [v for m in per_node if m != n if (v := mean_at(m, t)) is not None]
            if mine is None or not others:
                continue
            ref = statistics.median(others)
            flags.append((t, 1.0 if ref > 0.2 and mine < ref * rule["ratio"] else 0.0))
        start, dur = _run_len(flags, lambda v: v > 0)
        if dur >= rule.get("min_s", 60):
            out.append(
                _sym(
                    rule,
                    per_node[n][0],
                    start,
                    f"{rule['metric']} below {rule['ratio']:.0%} of peers for {dur:.0f} s",
                )
            )
            out[-1].gpu = None
    slow_nodes = {s.node for s in out if s.gpu is None}
    return [s for s in out if s.gpu is None or s.node not in slow_nodes]


def _gpu_low(series: list[Series], rule: dict[str, Any]) -> list[Sym]:
    gpus = [s for s in series if s.node]
    if len(gpus) < 3:
        return []
    vals = [dict(s.points) for s in gpus]
    times = sorted({t for s in gpus for t, _ in s.points})
    job = {t: statistics.median(d[t] for d in vals if t in d) for t in times}
    node = {
        (n, t): statistics.median(
            d[t] for d, g in zip(vals, gpus, strict=True) if t in d and g.node == n
        )
        for n in {g.node for g in gpus}
        for t in times
        if any(t in d for d, g in zip(vals, gpus, strict=True) if g.node == n)
    }
    out = []
    for s, d in zip(gpus, vals, strict=True):
        flags = []
        for t in times:
            if t in d:
                ref = min(job[t], node[(s.node, t)])
                slow = ref * 0.25 <= d[t] < ref * rule["ratio"]  # slowed, not stopped (stuck)
                flags.append((t, 1.0 if ref > 0.2 and slow else 0.0))
        start, dur = _run_len(flags, lambda v: v > 0)
        if dur >= rule.get("min_s", 60):
            detail = f"{rule['metric']} below {rule['ratio']:.0%} of the job's other GPUs"
            out.append(_sym(rule, s, start, f"{detail} for {dur:.0f} s"))
    return out


def _slurm_sym(
    rule: dict[str, Any],
    role: str,
    t: float | None,
    node: str | None,
    detail: str,
    query: str,
    excerpt: str,
) -> Sym:
    """A symptom from a scheduler fact (its evidence carries no time of its own)."""
    return Sym(
        rule["id"],
        rule.get("role", role),
        t,
        "slurm",
        node,
        None,
        detail,
        rule.get("outcome", ""),
        {
            "source": "slurm",
            "query_or_path": query,
            "line": None,
            "time": None,
            "node": node,
            "gpu": None,
            "excerpt": excerpt,
        },
    )


def _slurm_symptoms(bundle: Bundle, ctx: Context, rules: Rules) -> list[Sym]:
    job, nodes = bundle.slurm.job, bundle.slurm.nodes
    out = []
    t = ctx.end
    for rule in rules.slurm:
        if job and "job_state" in rule:
            state = str(job.get("state", "")).upper()
            if any(state.startswith(w.upper()) for w in rule["job_state"]):
                out.append(
                    _slurm_sym(
                        rule,
                        "initiating",
                        None,
                        None,
                        f"job state {state}",
                        job.get("argv", ""),
                        f"JobState={state} ExitCode={job.get('exit_code')}",
                    )
                )
        for key, word in (("exit_code", "exit code"), ("signal", "signal")):
            if job and key in rule and job.get(key) in rule[key]:
                out.append(
                    _slurm_sym(
                        rule,
                        "cascade",
                        None,
                        None,
                        f"{word} {job.get(key)}",
                        job.get("argv", ""),
                        f"ExitCode={job.get('exit_code')}:{job.get('signal') or 0}",
                    )
                )
        if "node_state" in rule:
            for node, facts in nodes.items():
                state = facts.get("state", "").lower()
                if any(w in state for w in rule["node_state"]):
                    out.append(
                        _slurm_sym(
                            rule,
                            "initiating",
                            t,
                            node,
                            f"node {node} {state}: {facts.get('reason', '')}",
                            bundle.slurm.query or "sinfo",
                            f"State={state} Reason={facts.get('reason', '')}",
                        )
                    )
    for node, facts in nodes.items():  # a reason a health check wrote (NHC: check_hw_ib: ...)
        reason = str(facts.get("reason") or "")
        hits = _hits(reason, "kernel", rules)[0] if reason else []
        for symptom, role, outcome, _, pattern, action in hits:
            sym = _slurm_sym(
                {"id": symptom, "role": role, "outcome": outcome},
                role,
                t,
                node,
                f"{pattern}: node {node} reason {reason[:160]}",
                bundle.slurm.query or "sinfo",
                f"Reason={reason[:280]}",
            )
            sym.action = action
            out.append(sym)
    return out


@dataclass
class Extracted:
    symptoms: list[Sym]
    progress: list[str]  # what shows the job working (progress lines, an advancing metric)
    dropped: int  # symptoms from before the job's current run or after its end


END_SLACK_S = 60.0  # lines and samples may trail an ended job's EndTime (whole seconds, flush)


def run_start(bundle: Bundle) -> float | None:
    """When the job's current run started (Slurm's StartTime), if a source said."""
    t = bundle.slurm.job.get("start_time")
    return float(t) if isinstance(t, int | float) and t > 0 else None


def run_end(bundle: Bundle) -> float | None:
    """When an ended job ended (None while it runs or when no source said)."""
    t = bundle.slurm.job.get("end_time")
    return float(t) if isinstance(t, int | float) and t > 0 else None


def extract(bundle: Bundle, ctx: Context, rules: Rules, gpn: int = 8) -> Extracted:
    # ranks map to the job's own node list from Slurm; without it a rank-only line stays
    # unplaced (the context's nodes are alert nodes too, and would blame the wrong node)
    job_nodes = [n for n in bundle.slurm.job.get("nodes") or [] if names.valid_node(n)]
    syms, lines, pause_open = _log_symptoms(bundle.lines, rules, gpn, job_nodes)
    syms += _metric_symptoms(bundle.series, rules, pause_open)
    syms += _slurm_symptoms(bundle, ctx, rules)
    # a line or sample from before the current run (an earlier run's XID, a requeue ago), or
    # from after an ended job's end (a later fault on a node it once used), is neither the
    # onset nor the culprit of this run
    since, until = run_start(bundle), run_end(bundle)
    until = None if until is None else until + END_SLACK_S
    kept = [
        s
        for s in syms
        if s.time is None
        or ((since is None or s.time >= since) and (until is None or s.time <= until))
    ]
    first: dict[tuple[str, str | None, str | None, str], Sym] = {}
    for sym in sorted(kept, key=_key):  # one symptom per (id, node, gpu, source): the earliest
        first.setdefault((sym.id, sym.node, sym.gpu, sym.source), sym)
    lines = [ln for ln in lines if since is None or ln.time is None or ln.time >= since]
    progress = [f"{ln.path}:{ln.line or ''} {ln.text.strip()[:120]}" for ln in lines[-3:]]
    progress += [
        f"{s.name} advanced to {s.points[-1][1]:g}"
        for s in bundle.series
        if s.name in PROGRESS_METRICS and len(s.points) > 1 and s.points[-1][1] > s.points[0][1]
    ]
    return Extracted(list(first.values()), progress, len(syms) - len(kept))


# ---------------------------------------------------------------- stages 2 and 3


def _key(s: Sym) -> float:
    return s.time if s.time is not None else float("inf")


def _triggers(rule: dict[str, Any], syms: list[Sym]) -> list[Sym]:
    ids = set(rule.get("symptoms", []))
    if any(s.id in rule.get("unless", ()) for s in syms):
        return []
    any_role = bool(rule.get("any_role"))  # the fallback rule: cascades count too
    return [
        s
        for s in syms
        if (any_role or s.role == "initiating")
        and (
            s.id in ids
            or (s.outcome and s.outcome == rule["outcome"] and rule["outcome"] != "unknown")
        )
    ]


def refine(syms: list[Sym], rules: Rules) -> list[Sym]:
    """Order by time and mark what each present outcome explains as cascade."""
    syms.sort(key=_key)
    tol = rules.tolerance_s
    for rule in rules.outcomes:
        trig = _triggers(rule, syms)
        if not trig:
            continue
        first = min(_key(s) for s in trig)
        explains = set(rule.get("explains", []))
        for s in syms:
            if s in trig or s.id not in explains:
                continue
            if s.time is None or first == float("inf") or s.time + tol >= first:
                s.role = "cascade"
    return syms


def choose(
    syms: list[Sym], rules: Rules
) -> tuple[dict[str, Any] | None, list[Sym], list[tuple[str, float]]]:
    """The winning outcome rule, its trigger symptoms, and every candidate (outcome, time)."""
    tol = rules.tolerance_s
    candidates = []
    for order, rule in enumerate(rules.outcomes):
        trig = _triggers(rule, syms)
        if trig:
            candidates.append((min(_key(s) for s in trig), order, rule, trig))
    if not candidates:
        return None, [], []
    real = [c for c in candidates if not c[2].get("any_role")]
    candidates = real or candidates  # the fallback rule only when nothing else matched
    earliest = min(c[0] for c in candidates)
    close = [c for c in candidates if c[0] <= earliest + tol or c[0] == float("inf")]
    if earliest != float("inf"):
        close = [c for c in close if c[0] != float("inf")] or close
    best = min(close, key=lambda c: c[1])
    return best[2], best[3], [(c[2]["outcome"], c[0]) for c in candidates]


def _culprit(rule: dict[str, Any], trig: list[Sym], syms: list[Sym]) -> list[str]:
    how = rule.get("culprit", "none")
    if how == "symptom":
        return sorted({s.node for s in trig if s.node is not None})
    if how == "suspect":  # the node whose peer-comparison score crossed 1.0 first
        sus = sorted((s for s in syms if s.id == "suspect_score" and s.node), key=_key)
        return [sus[0].node] if sus and sus[0].node else []
    return []


def _confidence(
    rule: dict[str, Any], trig: list[Sym], bundle: Bundle, competing: int
) -> tuple[float, str]:
    base = float(rule.get("confidence", 0.5))
    sources = {s.source for s in trig}
    reports = {r.connector: r.status for r in bundle.reports}
    src_ok = {
        "prometheus": reports.get("prometheus") == "ok",
        "log": reports.get("logs") == "ok" or reports.get("loki") == "ok",
        "slurm": reports.get("slurm") == "ok",
    }
    missing = [s for s, ok in src_ok.items() if not ok]
    conf = base + 0.05 * (len(sources) - 1)
    conf *= 0.85 ** len(missing)
    if competing:
        conf *= 0.85
    conf = max(0.05, min(0.99, conf))
    basis = (
        f"rule {rule['outcome']} base {base:.2f}; +0.05 per extra corroborating source "
        f"({', '.join(sorted(sources))}); x0.85 per unavailable source "
        f"({', '.join(missing) or 'none'}); x0.85 if another outcome was within tolerance "
        f"({competing})"
    )
    return round(conf, 3), basis


def attribute(
    bundle: Bundle,
    ctx: Context,
    incident_id: int | None = None,
    rules: Rules | None = None,
    gpus_per_node: int = 8,
) -> dict[str, Any]:
    """Run the three stages over `bundle`; returns a schema-valid diagnosis dict."""
    rules = rules or load_rules()
    found = extract(bundle, ctx, rules, gpus_per_node)
    syms = refine(found.symptoms, rules)
    rule, trig, cands = choose(syms, rules)
    common = dict(
        incident_id=incident_id,
        job_id=ctx.job_id,
        job_name=ctx.job_name,
        job_user=bundle.slurm.job.get("user"),
        job_nodes=list(bundle.slurm.job.get("nodes") or [])[:1000],
        connector_reports=[r.as_dict() for r in bundle.reports],
        symptoms=[_sym_doc(s) for s in syms[:200]],
    )
    if rule is None:
        return _diagnosis(common, **_no_rule_verdict(bundle, ctx, syms, found))
    outcome = rule["outcome"]
    culprit = _culprit(rule, trig, syms)
    trig_nodes = set(culprit)
    gpus = sorted({(s.node, s.gpu) for s in trig if s.node in trig_nodes and s.gpu})
    competing = sum(
        1 for o, t in cands if o != outcome and t <= min(_key(s) for s in trig) + rules.tolerance_s
    )
    conf, basis = _confidence(rule, trig, bundle, competing)
    first = min(trig, key=_key)
    onset_times = [s.time for s in trig if s.time is not None]
    where = f" on {', '.join(culprit)}" if culprit else ""
    root = f"{outcome.replace('_', ' ')}{where}: {first.detail[:160]}"
    evidence = [s.evidence for s in sorted(trig, key=_key)[:20]]
    evidence += [s.evidence for s in syms if s not in trig][:30]
    initiating = sorted({s.id for s in trig if s.role == "initiating"} or {s.id for s in trig})
    return _diagnosis(
        common,
        outcome,
        action_hint=action_hint(trig),
        root_cause=root.replace("\n", " "),
        cause_key=cause_key(outcome, initiating, culprit),
        affected_nodes=culprit,
        affected_gpus=[{"node": n, "gpu": g} for n, g in gpus],
        evidence=evidence,
        confidence=conf,
        confidence_basis=basis,
        onset=min(onset_times) if onset_times else None,
    )


def action_hint(trig: list[Sym]) -> str:
    """The catalogue's action for the signatures behind the verdict, when they all carry the
    same one (an XID's job_action, a pattern's action); "" when one carries none or they
    differ, so the outcome's default stands."""
    hints = {s.action for s in trig}
    return hints.pop() if len(hints) == 1 else ""


def cause_key(outcome: str, symptom_ids: list[str], nodes: list[str]) -> str:
    """A key that names the cause, not the occurrence: the outcome, the initiating symptom ids
    and the culprit nodes (no times, no line text), so the same fault seen again matches."""
    key = f"{outcome}:{'+'.join(sorted(set(symptom_ids))) or '-'}"
    return f"{key}@{','.join(sorted(set(nodes)))}" if nodes else key


def _no_rule_verdict(
    bundle: Bundle, ctx: Context, syms: list[Sym], found: Extracted
) -> dict[str, Any]:
    """No rule matched: `healthy` only on evidence of a running, progressing job."""
    job = f"job {ctx.job_id}" if ctx.job_id else "the job"
    answered = {r.connector: r.status for r in bundle.reports}
    summary = ", ".join(f"{c} {st}" for c, st in sorted(answered.items())) or "no source"
    state = str(bundle.slurm.job.get("state") or "").upper()
    exit_code = bundle.slurm.job.get("exit_code")

    def unknown(why: str, key: str) -> dict[str, Any]:
        return dict(
            outcome="unknown",
            root_cause=why,
            cause_key=f"unknown:{key}",
            confidence=0.3,
            confidence_basis=f"no initiating symptom matched any rule; sources: {summary}",
        )

    if not (bundle.lines or bundle.series or bundle.slurm.job or syms):
        return unknown(f"no evidence: {job} is in none of the sources ({summary}).", "no_evidence")
    seen = ", ".join(sorted({s.id for s in syms}))
    if seen:
        why = f"Only consequences seen ({seen}); nothing says what caused them."
        return unknown(why, "cascades")
    if ctx.alerts:
        return unknown("No failure signature found in the evidence.", "no_signature")
    if state == "COMPLETED" and exit_code in (0, None):
        return dict(
            outcome="healthy",
            root_cause=f"No fault: Slurm reports {job} COMPLETED with exit code 0.",
            cause_key="healthy",
            confidence=0.6,
            confidence_basis=f"Slurm state COMPLETED, no symptom; sources: {summary}",
        )
    if state and not any(state.startswith(w) for w in RUNNING):
        return unknown(f"No fault signature, but Slurm reports {job} {state}.", "not_running")
    if not found.progress:
        return unknown(
            f"No fault signature, and nothing shows {job} making progress ({summary}).",
            "no_progress",
        )
    shown = "; ".join(found.progress[-2:])
    return dict(
        outcome="healthy",
        root_cause=f"No fault: {job} is {'running and ' if state else ''}progressing.",
        cause_key="healthy",
        confidence=0.6,
        confidence_basis=f"no symptom; progress: {shown}"[:500],
    )


def _diagnosis(common: dict[str, Any], outcome: str, **fields: Any) -> dict[str, Any]:
    """The schema-validated diagnosis dict: the fields every verdict has, plus its own."""
    doc = {**common, "outcome": outcome, "category": CATEGORY[outcome], **fields}
    return Diagnosis.model_validate(doc).model_dump(mode="json")


def _sym_doc(s: Sym) -> dict[str, Any]:
    return {
        "id": s.id,
        "role": s.role,
        "first_seen": s.time,
        "source": s.source,
        "node": s.node,
        "gpu": s.gpu,
        "detail": s.detail[:300],
    }

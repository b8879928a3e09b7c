"""Stage 1 for metric series: the metric rules (XID values, counters that rose, GPUs that
vanished, physics priors, idle GPUs, stalled progress, slowdowns, a node or GPU below its
peers) as symptoms with their evidence, in rule order."""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Callable
from typing import Any, NamedTuple

from catalogue import priors as physics_priors
from recovery.attribution.logs import _xid_symptom, line_evidence
from recovery.attribution.model import FB_USED, PROGRESS_METRICS, Pause, Rules, Sym, clip
from recovery.evidence import Series


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


def _metric_symptoms(
    series: list[Series],
    rules: Rules,
    pause: Pause | None = None,
    saving: bool = False,
    job_nodes: list[str] | None = None,
    since: float | None = None,
) -> list[Sym]:
    """Symptoms of the metric rules, in their order (a rule may read an earlier one's);
    `pause`: the pause the log opened last, while still open, `saving`: it opened
    after this run's progress (a checkpoint save); `job_nodes`: the job's nodes as Slurm lists
    them (a rule for jobs on at most `max_nodes` nodes counts them too: a node whose DCGM
    series are missing is still the job's); `since`: when the job's current run started (a
    change is dated no earlier, `_changed_at`)."""
    pause_open = pause is not None
    listed = frozenset(job_nodes or ())
    out: list[Sym] = []
    gpu_util = _by_name(series, "DCGM_FI_DEV_GPU_UTIL")
    moved = _last_advance(series)  # the job's progress metrics last rose then
    for rule in rules.metrics:
        kind = rule.get("kind")
        metric = rule.get("metric", "")
        if kind == "xid":
            held = _xid_held(series)
            for s in _by_name(series, metric):
                prev = int(s.points[0][1]) if held(s) and math.isfinite(s.points[0][1]) else 0
                for i, (t, v) in enumerate(s.points):
                    if not math.isfinite(v):
                        continue
                    code = int(v)
                    xk = _xid_symptom(code) if code and code != prev else None
                    if xk is not None:
                        sid, role, outcome, action = xk
                        at, seen = _changed_at(s.points, i, rule, since)
                        out.append(
                            Sym(
                                sid,
                                role,
                                at,
                                "prometheus",
                                s.node,
                                s.gpu,
                                f"XID {code}",
                                outcome,
                                _ev(s, t, f"{s.name} = {code}{seen}"),
                                action,
                            )
                        )
                    prev = code
        elif kind in ("increase", "above"):
            per = rule.get("seconds_per_unit")
            for s in _by_name(series, metric):
                (t0, base) = s.points[0]
                for i, (t, v) in enumerate(s.points):
                    hit = v - base >= rule["min"] if kind == "increase" else v >= rule["min"]
                    if hit:
                        word = f"rose by {v - base:g}" if kind == "increase" else f"= {v:g}"
                        if per and kind == "increase":  # a counter of time: say how long
                            word = f"counted {(v - base) * per:.1f} s in {t - t0:.0f} s"
                        at, seen = _changed_at(s.points, i, rule, since)
                        sym = _sym(rule, s, at, f"{metric} {word}")
                        sym.evidence = _ev(s, t, f"{metric}: {metric} {word}{seen}")
                        out.append(sym)
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
            out += _prior(series, rule, moved, listed)
        elif kind == "idle":
            if rule.get("from_start") and any(
                v > 0 for s in _by_name(series, "goodput_job_iteration") for _, v in s.points
            ):
                continue  # an iteration was reported (in the window or before it): it started
            if not (rule.get("unless_pause") and pause_open or rule.get("unless_save") and saving):
                peers = {(s.node, s.gpu) for s in out if s.id == rule.get("peers_spin")}
                scores = _by_name(series, rule.get("confirm") or "")
                fb = _by_name(series, FB_USED)
                out += _idle(gpu_util, rule, fb, peers, scores, moved)
        elif kind == "stall":
            for s in _by_name(series, metric):
                start, dur = _frozen(s.points)
                if dur >= rule["min_s"]:
                    out.append(_sym(rule, s, start, f"no progress for {dur:.0f} s", node=None))
        elif kind == "slowdown":
            usual = _usual(series, rule)
            for s in _by_name(series, metric):
                if (slowed := _slowed(s, rule, usual)) is not None:
                    v = dict(s.points)[slowed.start]
                    whose = " (the job's learned step time)" if slowed.learned else ""
                    detail = f"iteration time {v:.3g}s vs {slowed.ref:.3g}s{whose}"
                    out.append(_sym(rule, s, slowed.start, detail, node=None))
        elif kind == "starved":
            out += _starved(series, gpu_util, rule, listed)
        elif kind == "peer_low":
            out += _peer_low(_by_name(series, metric), rule)
        elif kind == "overrun" and pause is not None:
            stalls = [s for s in out if s.id in rule["stalls"]]
            out += _overrun(pause, stalls, moved, series, rule)
    return out


def _changed_at(
    points: list[tuple[float, float]], i: int, rule: dict[str, Any], since: float | None
) -> tuple[float, str]:
    """When a change first seen in sample `i` may have happened, at the earliest, and a note
    on that for the evidence. A sampled series shows a change at the first sample after it:
    the change happened in (previous sample, this sample], so it is dated just after the
    previous sample, less the rule's `gap_s`, the collection interval of the exporter behind
    the series, which the samples do not show (dcgm-exporter collects every 30 s by default
    while Prometheus scrapes it every few seconds: the sample before may repeat a value
    collected up to that long before it). Dated at the sample itself when it is the first
    (nothing tells when it began), and never before the run began at `since` (a change
    sampled in the run counts for it, as it did when dated at the sample). The late sample
    must not lose the fault its own lines (the job's errors, its peers' IB errors) follow."""
    t = points[i][0]
    if i == 0:
        return t, ""
    before = points[i - 1][0]
    at = min(t, before - float(rule.get("gap_s") or 0.0))
    if since is not None:
        at = max(at, min(since, t))
    return at, f" (first sampled at {t:.0f}; after the sample at {before:.0f})"


def _xid_held(series: list[Series]) -> Callable[[Series], bool]:
    """Whether an XID gauge's first sample is a value it held before (its baseline) rather
    than a new XID. DCGM_FI_DEV_XID_ERRORS holds the LAST XID seen on the GPU, from this job or
    one long gone (`detector.fields`: the detector and the GoodputGPUFatalXid rule judge the
    GPU by that held value, and date nothing): an XID is dated where the value changed. So the
    first sample is a baseline when the series was there as the window opened (no later than
    the earliest first sample of the other series: Prometheus answers a series present at the
    query's start with a point there), or when the same GPU reported in another series before
    it (a series labelled with the job starts with the job, holding the GPU's last XID from
    before it). A series that starts after the window opened on a GPU not seen before it (a GPU
    or an exporter that appeared: a rebooted node's gauge starts afresh) reads its first
    non-zero value as new; so does a lone series, with nothing to tell when the window
    opened."""
    firsts = sorted(s.points[0][0] for s in series if s.points)
    seen: dict[tuple[str | None, str | None], float] = {}
    for s in series:
        if s.points and s.gpu is not None:
            key = (s.node, s.gpu)
            seen[key] = min(seen.get(key, math.inf), s.points[0][0])

    def held(s: Series) -> bool:
        t0 = s.points[0][0]
        # the earliest first sample of the other series (this one's own left out once); a
        # series within one of its steps of it (samples scraped, not on a query's grid) was
        # there too
        opened = firsts[1] if len(firsts) > 1 and firsts[0] == t0 else firsts[0]
        step = s.points[1][0] - t0 if len(s.points) > 1 else 0.0
        if len(firsts) > 1 and t0 <= opened + min(max(step, 1.0), 60.0):
            return True
        return s.gpu is not None and seen.get((s.node, s.gpu), math.inf) < t0

    return held


def _overrun(pause: Pause, stalls: list[Sym], moved: float, series: list[Series],
             rule: dict[str, Any]) -> list[Sym]:  # fmt: skip
    """The job stalled (`stalls`: symptoms of earlier rules) inside the pause its log opened
    last, of a kind in `pauses` (a checkpoint save or load), with no progress since that line
    (in the log or the job's progress metrics), past its allowance: the highest value of the
    `reference` series (the detector's pause allowance for the job) or `min_s` without it.
    Slow or stuck storage, or a load or save longer than the job was ever seen to take; a
    restart would redo it. Dated when the allowance ran out (a fault before then comes first),
    with the pause line as evidence; none while the evidence ends before then."""
    line = pause.line
    if not stalls or pause.pattern not in rule["pauses"] or line.time is None:
        return []
    if moved > line.time:
        return []  # the job's progress metrics rose after the line: that pause ended
    allowed = _learned(series, rule.get("reference"))
    at = line.time + (max(allowed) if allowed else rule["min_s"])
    if at > max((s.points[-1][0] for s in series if s.points), default=-math.inf):
        return []  # the evidence ends before the allowance ran out
    seen = ", ".join(sorted({s.id for s in stalls}))
    detail = (
        f"stalled ({seen}) {at - line.time:.0f} s into the pause its log opened, past its "
        f"allowance: {clip(line.text.strip(), 160)}"
    )
    return [
        Sym(
            id=rule["id"],
            role=rule.get("role", "initiating"),
            time=at,
            source="log",
            node=None,
            gpu=None,
            detail=detail,
            outcome=rule.get("outcome", ""),
            evidence=line_evidence(line, line.node),
        )
    ]


def _learned(series: list[Series], name: str | None) -> list[float]:
    """The finite, positive values of the series `name` (what the detector learned of the
    job and exports: a step time, a busy utilisation, a pause allowance); [] without."""
    return [
        v for s in _by_name(series, name or "") for _, v in s.points if math.isfinite(v) and v > 0
    ]


def _usual(series: list[Series], rule: dict[str, Any]) -> float | None:
    """The lowest value of the rule's `reference` series in the window (the job's learned step
    time; a baseline refitted upwards during a long slowdown does not hide it); None without."""
    vals = [v for s in _by_name(series, rule.get("reference") or "") for _, v in s.points if v > 0]
    return min(vals) if vals else None


class Slowed(NamedTuple):
    start: float
    end: float
    ref: float  # the step time it is slower than
    learned: bool  # `ref` is the job's learned step time, not its early median


def _slowed(s: Series, rule: dict[str, Any], usual: float | None = None) -> Slowed | None:
    """The longest run, lasting `min_s`, of a value at least `ratio` x the reference: the
    job's own history, the median of the series' first third or, where lower, the fastest
    step it held over two log lines (two distinct values in a row: a line spans several
    samples) in its first half (its first steps run slow, so a fault soon after them leaves
    few healthy lines; a slower line there only raises a pair); or `usual` (what the job was
    learned to take) when that is already `ratio` slower than it -- a restart slow from its
    first step -- and then over the whole window, to its last point; the first steps after a
    checkpoint save or a restart run ~18 % slow, hence the duration."""
    vals = [v for _, v in s.points if v > 0]
    if len(vals) < 6:
        return None
    lines = [v for v, _ in itertools.groupby(vals[: len(vals) // 2])]
    held = [max(a, b) for a, b in itertools.pairwise(lines)]
    early = min([statistics.median(vals[: len(vals) // 3]), *held])
    points, learned = s.points[len(vals) // 3 :], False
    if usual is not None and early >= usual * rule["ratio"]:
        early, points, learned = usual, s.points, True
    if early <= 0:
        return None
    limit = early * rule["ratio"]
    start, dur = _run_len(points, lambda v: v >= limit)
    if start is None or dur < rule.get("min_s", 0):
        return None
    if learned and start + dur < s.points[-1][0]:
        return None  # slow first steps that ended (a restart's warm-up), not a slower job
    return Slowed(start, start + dur, early, learned)


def _starved(
    series: list[Series], util: list[Series], rule: dict[str, Any], listed: frozenset[str]
) -> list[Sym]:
    """A job on at most `max_nodes` nodes (its GPUs' and `listed`, Slurm's) whose iteration
    time rose (`_slowed`, still slow at the last point) while every GPU reported for it was
    busy for a smaller share of the time, by at least `busy_share` of the rise: the same work
    per step spread over a longer one, the GPUs waiting on their host (one H200 with its host
    stalling: util 62 % vs 99 at 124 ms vs 85 ms a step, failures.md). A step that grew with
    the GPUs as busy as before is more work per step (the job's own). Busy is read at the
    samples where the job stepped, where its log says so; a restart slow from its first step
    is compared with the job's learned step time and busy utilisation (`reference`, the lowest
    in the window, and `busy_reference`, the highest: a baseline refitted during the slowdown
    does not hide it), when both were learned. Named: the node (and the GPU of a one-GPU
    job)."""
    nodes = {s.node for s in util}
    if not util or None in nodes or len(nodes | listed) > rule.get("max_nodes", 1):
        return []
    steps = _stepping(series)
    learned = _learned(series, rule.get("busy_reference"))
    usual = _usual(series, rule) if learned else None  # both learned, or the window alone
    out = []
    for s in _by_name(series, rule["metric"]):
        slowed = _slowed(s, rule, usual)
        if slowed is None or slowed.end < s.points[-1][0]:
            continue  # never slowed, or no longer slow
        start, early = slowed.start, slowed.ref
        late = statistics.median(v for t, v in s.points if t >= start)
        share = 1.0 + rule["busy_share"] * (late / early - 1.0)
        was = max(learned) if slowed.learned else None
        drops = [_busy_drop(u, start, steps, share, rule["util_min"], was) for u in util]
        if all(drops):
            who = "its GPU waits" if len(util) == 1 else "the GPUs wait"
            whose = " (the job's learned step time and utilisation)" if was is not None else ""
            detail = (
                f"iteration time {late:.3g}s vs {early:.3g}s while GPU utilisation fell "
                f"({', '.join(str(d) for d in drops[:8])}){whose}: {who} on the host"
            )
            out.append(_sym(rule, util[0], start, detail))
            if len(util) > 1:
                out[-1].gpu = out[-1].evidence["gpu"] = None
    return out


def _busy_drop(
    u: Series,
    start: float,
    steps: list[tuple[float, float]] | None,
    share: float,
    busy: float,
    was: float | None = None,
) -> str | None:
    """The GPU's fall ("was -> now %") when, at least `busy` % before `start` (or `was`, what
    the job was learned to use), it is at least `share` times less busy since (read where the
    job stepped); None when idle before or about as busy."""
    pts = [(t, v) for t, v in u.points if steps is None or any(a <= t < b for a, b in steps)]
    before = [v for t, v in pts if t < start]
    after = [v for t, v in pts if t >= start]
    if len(after) < 3 or (was is None and len(before) < 3):
        return None
    was = statistics.median(before) if was is None else was
    now = statistics.median(after)
    return f"{was:.0f} -> {now:.0f} %" if busy <= was and now < was and now * share <= was else None


def _stepping(series: list[Series]) -> list[tuple[float, float]] | None:
    """Stretches between two rises of the job's iteration counter at most twice its usual
    spacing apart: it was stepping then (an evaluation, a save or a stall between two rises
    makes a longer gap); None without the counter or with under three rises (every sample
    counts then)."""
    rises = sorted(
        {
            t
            for s in _by_name(series, "goodput_job_iteration")
            for (_, a), (t, b) in itertools.pairwise(s.points)
            if b > a
        }
    )
    if len(rises) < 3:
        return None
    usual = statistics.median(b - a for a, b in itertools.pairwise(rises))
    return [(a, b) for a, b in itertools.pairwise(rises) if b - a <= 2 * usual]


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
    moved: float = -math.inf,
) -> list[Sym]:
    """GPUs of a running job at ~0 % for min_s after having worked (some or all of them), not
    counting a GPU the job's log went on moving min_s into its idle run (`moved`: the last
    rise of its progress metrics): a rank that stopped while the job lives on works on the host
    (rank 0 evaluating or logging while its peers wait: pytorch/pytorch#36285). With
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
        busy_once = worked is not None and not rule.get("from_start")
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
        if start is None or dur < rule["min_s"] or s.points[-1][1] > rule["util_max"]:
            continue
        if busy_once and moved >= start + rule["min_s"]:
            continue  # it worked, then stopped while the job lives on (a hang stops the log)
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


def _prior(
    series: list[Series], rule: dict[str, Any], resumed: float, listed: frozenset[str] = frozenset()
) -> list[Sym]:
    """GPUs on which the physics prior `rule` held for min_s since the job's progress last
    rose (`resumed`, `_last_advance`: a spin the job progressed after was a wait that ended;
    `scope: gpu`, one symptom each); `scope: all`: every GPU of a job on at most `max_nodes`
    nodes (those its GPUs report from and `listed`, Slurm's), to the last sample, while the
    job's progress metrics did not advance (one symptom; its node, and a one-GPU job's GPU,
    named when the job has one: not a cause the evidence shows, the suspect a restart avoids)."""
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
            start, dur = _run_len([p for p in pts if p[0] >= resumed], lambda v: v > 0)
            if start is not None and dur >= min_s:
                out.append(
                    _sym(rule, first[k], start, f"physics prior {rule['rule']} for {dur:.0f} s")
                )
        return out
    nodes = {k[0] for k in flags} | listed  # Slurm's list: a node may report no DCGM series
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
    sym = _sym(rule, first[k], start, detail, node=next(iter(nodes)) if len(nodes) == 1 else None)
    return [sym if len(flags) == 1 else dataclasses.replace(sym, gpu=None)]


def _last_advance(series: list[Series]) -> float:
    """When a job progress metric (iteration, last progress time) last rose (-inf: never)."""
    out = -math.inf
    for s in series:
        if s.name in PROGRESS_METRICS:
            for (_, a), (t, b) in itertools.pairwise(s.points):
                if b > a:
                    out = max(out, t)
    return out


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

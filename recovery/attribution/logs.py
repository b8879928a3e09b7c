"""Stage 1 for log lines: catalogue matches of job and kernel lines as symptoms, with XIDs
classified by the catalogue's table (`_xid_symptom`, also used for the XID metric) and the
line matching (`_hits`, also used for Slurm node reasons); a rank-only line is placed on its
node by Slurm's block placement."""

from __future__ import annotations

from typing import Any

import catalogue
from recovery.attribution.model import MILESTONE, PROGRESS, Pause, Rules, Sym, clip
from recovery.evidence import LogLine

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


def _hits(text: str, source: str, rules: Rules) -> tuple[list[Hit], bool, str, bool]:
    """Catalogue matches of one line as symptoms (XIDs classified, overrides applied), whether
    the line shows progress, the pattern of the pause it opens ("": none; a checkpoint save or
    load, start-up work), and whether it is a start-up milestone (the work before it is done)."""
    overrides = {r["pattern"]: r for r in rules.log}
    hits: list[Hit] = []
    progress = milestone = False
    pause = ""
    for m in catalogue.match_line(text, source):
        if m.role == "info":
            progress = progress or m.symptom in PROGRESS
            pause = pause or (m.pattern if m.symptom == "pause" else "")
            milestone = milestone or m.symptom == MILESTONE
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
    return hits, progress, pause, milestone


def line_evidence(ln: LogLine, node: str | None) -> dict[str, Any]:
    """One log line as an evidence entry."""
    return {
        "source": "log",
        "query_or_path": ln.path,
        "line": ln.line,
        "time": ln.time,
        "node": node,
        "gpu": None,
        "excerpt": ln.text.strip()[:300],
    }


def _log_symptoms(
    lines: list[LogLine], rules: Rules, gpn: int, job_nodes: list[str], since: float | None = None
) -> tuple[list[Sym], list[LogLine], Pause | None, bool]:
    """Symptoms of the log lines, the lines that show the job progressing, the pause still
    open (the last pause line, when it comes after the last progress line and the last
    start-up milestone), and whether it is a save (it opened after a progress line of the run
    that began at `since`)."""
    out: list[Sym] = []
    progress: list[LogLine] = []
    last = {"progress": float("-inf"), "pause": float("-inf"), "milestone": float("-inf")}
    pause: Pause | None = None  # the latest pause line
    ran = float("-inf")  # this run's latest progress
    for ln in lines:
        kind = "kernel" if ln.kind == "kernel" else "job"
        hits, progressing, pausing, milestone = _hits(ln.text, kind, rules)
        if progressing:
            progress.append(ln)
        marks = (("progress", progressing), ("pause", bool(pausing)), ("milestone", milestone))
        for word, flag in marks:
            if flag and ln.time is not None and ln.time >= last[word]:
                last[word] = ln.time
                pause = Pause(ln, pausing) if word == "pause" else pause
        if progressing and ln.time is not None and (since is None or ln.time >= since):
            ran = max(ran, ln.time)
        for symptom, role, outcome, groups, pattern, action in hits:
            node = ln.node
            g = groups.get("node")
            if node is None and isinstance(g, str) and g in job_nodes:
                node = g  # a node the line names: only one of the job's (its text is the job's)
            if node is None:
                node = _rank_node(groups.get("rank"), job_nodes, gpn)
            out.append(
                Sym(
                    id=symptom,
                    role=role,
                    time=ln.time,
                    source="log",
                    node=node,
                    detail=f"{pattern}: {clip(ln.text.strip(), 240)}",
                    outcome=outcome,
                    evidence=line_evidence(ln, node),
                    action=action,
                )
            )
    open_pause = pause if last["pause"] > max(last["progress"], last["milestone"]) else None
    return out, progress, open_pause, open_pause is not None and ran > float("-inf")

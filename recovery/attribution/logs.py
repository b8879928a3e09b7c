"""Stage 1 for log lines: catalogue matches of job and kernel lines as symptoms, with XIDs
classified by the catalogue's table (`_xid_symptom`, also used for the XID metric) and the
line matching (`_hits`, also used for Slurm node reasons); a rank-only line is placed on its
node by Slurm's block placement."""

from __future__ import annotations

from typing import Any

import catalogue
from recovery.attribution.model import MILESTONE, OWN_ADDRESS, PROGRESS, Pause, Rules, Sym, clip
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


def _hits(
    text: str, source: str, rules: Rules
) -> tuple[list[Hit], bool, str, bool, dict[str, Any] | None]:
    """Catalogue matches of one line as symptoms (XIDs classified, overrides applied), whether
    the line shows progress, the pattern of the pause it opens ("": none; a checkpoint save or
    load, start-up work), whether it is a start-up milestone (the work before it is done), and
    the groups of the own address it announces (None: none)."""
    overrides = {r["pattern"]: r for r in rules.log}
    hits: list[Hit] = []
    progress = milestone = False
    pause = ""
    own: dict[str, Any] | None = None
    for m in catalogue.match_line(text, source):
        if m.role == "info":
            progress = progress or m.symptom in PROGRESS
            pause = pause or (m.pattern if m.symptom == "pause" else "")
            milestone = milestone or m.symptom == MILESTONE
            own = own or (m.groups if m.symptom == OWN_ADDRESS else None)
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
    return hits, progress, pause, milestone, own


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
    witnesses: list[tuple[Sym, str]] = []  # this run's symptoms of lines naming a remote peer
    addresses: dict[str, set[str]] = {}  # an address NCCL announced -> the nodes announcing it
    for ln in lines:
        kind = "kernel" if ln.kind == "kernel" else "job"
        hits, progressing, pausing, milestone, own = _hits(ln.text, kind, rules)
        if own is not None and isinstance(own.get("address"), str):
            if who := _node_of(ln, own, job_nodes, gpn):
                addresses.setdefault(_address(own["address"]), set()).add(who)
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
            node = _node_of(ln, groups, job_nodes, gpn)
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
            peer = groups.get("peer")
            this_run = since is None or ln.time is None or ln.time >= since
            if role == "initiating" and isinstance(peer, str) and this_run:
                witnesses.append((out[-1], peer))
    known = set(job_nodes) | {ln.node for ln in lines if ln.node}
    _witnessed(out, witnesses, addresses, job_nodes, known)
    open_pause = pause if last["pause"] > max(last["progress"], last["milestone"]) else None
    return out, progress, open_pause, open_pause is not None and ran > float("-inf")


def _node_of(ln: LogLine, groups: dict[str, Any], job_nodes: list[str], gpn: int) -> str | None:
    """The node a line comes from: its log's, else a node of the job its text names, else the
    node of the rank it names (Slurm's block placement)."""
    if ln.node is not None:
        return ln.node
    g = groups.get("node")
    if isinstance(g, str) and g in job_nodes:
        return g  # a node the line names: only one of the job's (its text is the job's)
    return _rank_node(groups.get("rank"), job_nodes, gpn)


def _address(text: str) -> str:
    """An address as NCCL prints it, for comparison: lower case, without the interface scope
    of a link-local IPv6 address (`fe80::1%ib0`) or the prefix of an IPv4-mapped one."""
    addr = text.strip().strip("[]").lower().split("%", 1)[0]
    return addr.removeprefix("::ffff:") if addr.count(".") == 3 else addr


def _witnessed(
    syms: list[Sym],
    witnesses: list[tuple[Sym, str]],
    addresses: dict[str, set[str]],
    job_nodes: list[str],
    known: set[str],
) -> None:
    """Place the symptoms of lines that name their remote peer when several nodes logged them.

    `NET/IB : Got completion from peer <address> with error 12` (the transport's retries ran
    out: the peer stopped answering, or the path to it broke) and `socketStartConnect: Connect
    to <address> failed` are written by the ranks that talk to the failed end, about it: when
    one node dies or loses its link, each of its peers logs them. Several nodes logging them
    are witnesses, not culprits, so none of them is named. The node they point at is:

    - the peer they name, where the evidence maps its address to a node (the address that
      node's own NCCL announced, `nccl_own_address`, or a name of the job's nodes): the node
      named by the most loggers, alone, and by at least two of them or by every logger but
      itself; the confidence stays (the evidence names it);
    - else, where Slurm lists the job's nodes, the one node of the job that logged none of
      these lines while the others did (a dead rank, or one cut off, writes nothing about it):
      a suspect by its silence, which lowers the confidence (`ranking._confidence`);
    - else none (the action restarts the job and drains no node).

    A line naming a peer that one node alone logged keeps that node (its own setup, e.g. a
    wrong NCCL_SOCKET_IFNAME, as often as the peer), as do lines naming no peer (a port error,
    a link down: the node's own). Changes the symptoms in place."""
    loggers = {s.node for s, _ in witnesses if s.node is not None}
    if len(loggers) < 2:
        return
    named: dict[str, set[str]] = {}
    for s, peer in witnesses:
        whose = addresses.get(_address(peer), set())
        node = next(iter(whose)) if len(whose) == 1 else None  # an address two nodes share: none
        if node is None and peer in known:
            node = peer
        if node is not None and s.node is not None and node != s.node:
            named.setdefault(node, set()).add(s.node)
    culprit, how = None, "unplaced"
    if named:
        most = max(len(v) for v in named.values())
        top = [n for n, v in named.items() if len(v) == most]
        if len(top) == 1 and (most >= 2 or named[top[0]] >= loggers - {top[0]}):
            culprit, how = top[0], "address"
    else:
        ids = {s.id for s, _ in witnesses}
        spoke = {s.node for s in syms if s.id in ids and s.node is not None}
        silent = [n for n in dict.fromkeys(job_nodes) if n not in spoke]
        if len(silent) == 1:
            culprit, how = silent[0], "silent"
    who = ", ".join(sorted(loggers))
    about = {
        "address": f"their peer {culprit}, by the address it announced",
        "silent": f"their peer: {culprit}, the job's one node that logged none of them",
        "unplaced": "their peers: no node can be named",
    }[how]
    for s, _ in witnesses:
        if s.node is None:
            continue
        pattern, _, text = s.detail.partition(": ")
        s.node, s.gpu, s.placed = culprit, None, how
        s.detail = f"{pattern} logged by {who} about {about}: {text}"

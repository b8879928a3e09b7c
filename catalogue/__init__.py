"""The failure catalogue: outcomes, the XID table and log-line patterns, as data.

Files (edit these, not code): `outcomes.yaml` (outcomes with default category, categories,
actions), `xid.yaml` (NVIDIA XIDs and what they mean for a training job), `patterns.yaml`
(log-line pattern families with their symptom and role). Loaded once and validated; any
problem raises `CatalogueError`. `$GOODPUT_CATALOGUE_DIR` points at another copy.

API (the whole of it):

    outcomes() -> dict[str, Outcome]          # id -> Outcome(id, category, meaning, action)
    categories() -> dict[str, str]            # infrastructure | workload | unknown -> meaning
    actions() -> dict[str, Action]            # the action vocabulary: id -> Action(id, meaning,
                                              # destructive, restarts, drains)
    xid_info(code) -> XidInfo | None          # code, name, severity, nvidia_action,
                                              # job_action, outcome, consequence, note,
                                              # cls, weight (detector), alert (alert name)
    load_patterns() -> tuple[Pattern, ...]    # id, source, symptom, role, outcome, ...
    match_line(line, source) -> list[Match]   # source "job" | "kernel"; Match(pattern,
                                              # symptom, role, source, outcome, groups)
    load(directory) -> Catalogue              # the same methods on an explicit copy

`catalogue.promql` (imported on its own) puts label values into PromQL and LogQL: `quote(v)`,
`re2_escape(v)`, `any_of(values)`, `matcher(name, v | values)`, `selector(metric, **labels)`.

`Match.groups` holds typed values the line carried: rank, local_rank, xid, pci, gpu_uuid,
iteration, loss, step_ms, samples, exitcode, pid, node, ... (declared in patterns.yaml).

>>> line = "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus."
>>> [m.pattern for m in match_line(line, "kernel")]
['nvrm_xid', 'nvrm_gpu_off_bus']
>>> match_line(line, "kernel")[0].groups
{'pci': '0000:2b:00', 'xid': 79, 'detail': 'GPU has fallen off the bus.'}
>>> xid_info(79).job_action
'drain_and_requeue'
"""

from __future__ import annotations

from catalogue.loader import CatalogueError, default, load
from catalogue.model import Action, Catalogue, Match, Outcome, Pattern, XidInfo

__all__ = [
    "Action",
    "Catalogue",
    "CatalogueError",
    "Match",
    "Outcome",
    "Pattern",
    "XidInfo",
    "actions",
    "categories",
    "load",
    "load_patterns",
    "match_line",
    "outcomes",
    "xid_info",
]


def outcomes() -> dict[str, Outcome]:
    return default().outcomes


def categories() -> dict[str, str]:
    return default().categories


def actions() -> dict[str, Action]:
    return default().actions


def xid_info(code: int) -> XidInfo | None:
    return default().xid_info(code)


def load_patterns() -> tuple[Pattern, ...]:
    return default().patterns


def match_line(line: str, source: str) -> list[Match]:
    return default().match_line(line, source)

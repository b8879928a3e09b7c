"""Goodput's Grafana dashboards as code (grafana-foundation-sdk, Grafana 11.6 schema).

`build_all()` returns {file name: dashboard JSON dict}; `goodput dashboards generate` writes
them to dashboards/generated/ (committed; a test regenerates and expects no diff). One module a
dashboard (`cluster`, `job`, `incidents`, `health`), built from `panels`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from grafana_foundation_sdk.builders import dashboard as d
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from dashboards import cluster, health, incidents, job

DASHBOARDS: dict[str, Callable[[], d.Dashboard]] = {
    "cluster-overview.json": cluster.dashboard,
    "job-drilldown.json": job.dashboard,
    "incidents-actions.json": incidents.dashboard,
    "detector-health.json": health.dashboard,
}


def to_dict(dash: d.Dashboard) -> dict[str, Any]:
    """The dashboard JSON, with unique panel ids and query refIds (A, B, ...) filled in."""
    model = json.loads(json.dumps(dash.build(), cls=JSONEncoder))
    for i, p in enumerate(panels(model), start=1):
        p["id"] = i
        for j, t in enumerate(p.get("targets", [])):
            t["refId"] = t.get("refId") or chr(ord("A") + j)
    return model


def build_all() -> dict[str, dict[str, Any]]:
    """{file name: dashboard JSON} for every Goodput dashboard."""
    return {name: to_dict(make()) for name, make in DASHBOARDS.items()}


def dumps(model: dict[str, Any]) -> str:
    return json.dumps(model, indent=2, sort_keys=True) + "\n"


def panels(model: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel of a dashboard JSON, rows' nested panels included."""
    for p in model.get("panels", []):
        yield p
        yield from p.get("panels", [])


def queries(model: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(panel title, datasource type, expr) for every query target, variables included."""
    for p in panels(model):
        for t in p.get("targets", []):
            ds = (t.get("datasource") or p.get("datasource") or {}).get("type", "")
            if t.get("expr"):
                yield p.get("title", ""), ds, t["expr"]
    for v in model.get("templating", {}).get("list", []):
        if isinstance(v.get("query"), str):
            yield f"variable {v['name']}", "prometheus-variable", v["query"]

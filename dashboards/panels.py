"""The panel and dashboard builders every Goodput dashboard uses (grafana-foundation-sdk).

Data sources are referenced by uid, as compose/grafana provisions them: `goodput-prometheus` and
`goodput-loki`. Template variables: `job_id` and `node` (`JOB`, `NODE` match them).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as d
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    VariableRefresh,
    VariableSort,
)

PROM = DataSourceRef(type_val="prometheus", uid="goodput-prometheus")
LOKI = DataSourceRef(type_val="loki", uid="goodput-loki")
CONSOLE = "http://127.0.0.1:19430"
JOB = 'job_id=~"$job_id"'
NODE = 'node=~"$node"'


def once(expr: str, by: str = "") -> str:
    """A total read from the receivers' store: every receiver in HA exports the same one, so
    it is counted once, the max by the metric's own labels (docs/ha.md)."""
    return f"max by ({by}) ({expr})" if by else f"max({expr})"


INCIDENTS = once("goodput_incidents", "state, outcome")  # the store's incidents, counted once


def q(expr: str, legend: str = "", instant: bool = False) -> prometheus.Dataquery:
    query = prometheus.Dataquery().expr(expr).datasource(PROM)
    if legend:
        query = query.legend_format(legend)
    return query.instant() if instant else query.range()


def ts(title: str, *queries: prometheus.Dataquery, unit: str = "", w: int = 12, h: int = 8):
    p = timeseries.Panel().title(title).datasource(PROM).span(w).height(h)
    for query in queries:
        p = p.with_target(query)
    return p.unit(unit) if unit else p


def st(title: str, expr: str, unit: str = "", w: int = 4) -> stat.Panel:
    p = stat.Panel().title(title).datasource(PROM).span(w).height(4).with_target(q(expr))
    return p.unit(unit) if unit else p


def tbl(title: str, expr: str, w: int = 24, h: int = 8) -> table.Panel:
    query = q(expr, instant=True).format("table")  # type: ignore[arg-type]
    return table.Panel().title(title).datasource(PROM).span(w).height(h).with_target(query)


def var(name: str, label: str, query: str, multi: bool) -> d.QueryVariable:
    v = (
        d.QueryVariable(name)
        .label(label)
        .datasource(PROM)
        .query(query)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
    )
    return v.multi(True).include_all(True).all_value(".*") if multi else v


def base(uid: str, title: str, description: str) -> d.Dashboard:
    return (
        d.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["goodput"])
        .time("now-30m", "now")
        .refresh("10s")
        .timezone("browser")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .link(d.DashboardLink("Goodput").type("dashboards").tags(["goodput"]).as_dropdown(True))  # type: ignore[arg-type]
        .link(d.DashboardLink("Recovery Console").type("link").url(f"{CONSOLE}/incidents"))  # type: ignore[arg-type]
    )

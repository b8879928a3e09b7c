"""The incident pages: the live list (filters, paging) and one incident in detail."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import Response

from recovery import validate
from recovery.console import actions_port, plot, queries
from recovery.console.page import (
    can_read,
    engine_of,
    error,
    login_redirect,
    prom_link,
    render,
    settings_of,
)
from recovery.console.templating import words
from recovery.diagnosis import OUTCOMES

MAX_EVIDENCE = 300

router = APIRouter(prefix="/console", include_in_schema=False)


def _filters(request: Request) -> tuple[dict[str, Any], list[str]]:
    q = request.query_params
    f: dict[str, Any] = {"state": "", "outcome": "", "node": "", "job": "", "page": 1}
    problems = []
    state = q.get("state", "")
    if state in ("open", "resolved"):
        f["state"] = state
    elif state:
        problems.append("state must be open or resolved")
    outcome = q.get("outcome", "")
    if outcome in OUTCOMES or outcome == "pending":
        f["outcome"] = outcome
    elif outcome:
        problems.append("unknown outcome")
    for key, check in (("node", validate.node), ("job", validate.job_id)):
        value = q.get(key, "").strip()
        if value:
            try:
                f[key] = check(value)
            except ValueError:
                what = "node name" if key == "node" else "job id"
                problems.append(f"{key} is not a valid {what}")
    page = validate.db_int(q.get("page", "1")) or 1
    f["page"] = min(page, 999_999)
    return f, problems


@router.get("/incidents")
def incidents_page(request: Request) -> Response:
    if not can_read(request):
        return login_redirect(request)
    f, problems = _filters(request)
    data = queries.incident_page(
        engine_of(request),
        state=f["state"] or None,
        outcome=f["outcome"] or None,
        node=f["node"] or None,
        job=f["job"] or None,
        page=f["page"],
    )
    base = {k: v for k, v in f.items() if v and k != "page"}
    links = {
        "prev": "?" + urlencode({**base, "page": data["page"] - 1}) if data["page"] > 1 else None,
        "next": "?" + urlencode({**base, "page": data["page"] + 1})
        if data["page"] < data["pages"]
        else None,
    }
    if request.query_params.get("fragment") == "rows":
        return render(request, "_incident_rows.html", data=data)
    return render(
        request,
        "incidents.html",
        data=data,
        f=f,
        problems=problems,
        links=links,
        outcomes=OUTCOMES,
        counts=queries.outcome_counts(engine_of(request)),
    )


def _plot_for(
    settings: Any, inc: dict[str, Any], diag: dict[str, Any] | None
) -> tuple[dict[str, Any] | None, str]:
    carried = plot.series_from_diagnosis(diag)
    if carried:
        return carried, "from the diagnosis' evidence"
    if not diag:
        return None, "no diagnosis yet"
    spec = (words().get("outcomes", {}).get(str(diag.get("outcome")), {}) or {}).get("plot")
    onset = diag.get("onset") or inc.get("first_alert_at")
    job = inc.get("job_id")
    if not spec:
        return None, "no key metric for this outcome"
    if not settings.prometheus_url:
        return None, "Prometheus is not configured"
    if not isinstance(onset, int | float) or not job:
        return None, "no job or onset to plot around"
    culprits = [n for n in diag.get("affected_nodes") or [] if isinstance(n, str)]
    found, note = plot.series_from_prometheus(
        settings.prometheus_url, spec, str(job), float(onset), culprits
    )
    return found, note or "from Prometheus, around the onset"


@router.get("/incidents/{incident_id}")
def incident_page(request: Request, incident_id: str) -> Response:
    if not can_read(request):
        return login_redirect(request)
    number = validate.db_int(incident_id)
    if number is None:
        return error(request, 404, "no such incident")
    settings, engine = settings_of(request), engine_of(request)
    inc = queries.incident_detail(engine, number)
    if inc is None:
        return error(request, 404, f"incident {incident_id} not found")
    diag = inc["diagnosis"]
    evidence = [e for e in (diag or {}).get("evidence") or [] if isinstance(e, dict)]
    for e in evidence[:MAX_EVIDENCE]:
        e["link"] = (
            prom_link(settings.prometheus_url, str(e.get("query_or_path") or ""))
            if e.get("source") == "prometheus"
            else None
        )
    symptoms = sorted(
        (s for s in (diag or {}).get("symptoms") or [] if isinstance(s, dict)),
        key=lambda s: (s.get("first_seen") is None, s.get("first_seen") or 0),
    )
    events = actions_port.incident_events(engine, number)
    the_plot, plot_note = _plot_for(settings, inc, diag)
    onset = (diag or {}).get("onset")
    return render(
        request,
        "incident.html",
        inc=inc,
        diag=diag,
        evidence=evidence[:MAX_EVIDENCE],
        evidence_more=max(0, len(evidence) - MAX_EVIDENCE),
        symptoms=symptoms,
        timeline=_timeline(symptoms),
        events=events,
        plan=actions_port.incident_action(engine, number),
        plot_svg=plot.svg(the_plot, onset if isinstance(onset, int | float) else None)
        if the_plot
        else None,
        plot_note=plot_note,
        plot_query=(the_plot or {}).get("query"),
        plot_link=prom_link(settings.prometheus_url, (the_plot or {}).get("query") or ""),
    )


def _timeline(symptoms: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Symptoms placed on a 0..600 px line by first-seen time (those without a time at 0)."""
    times = [s["first_seen"] for s in symptoms if isinstance(s.get("first_seen"), int | float)]
    t0, t1 = (min(times), max(times)) if times else (0.0, 0.0)
    span = (t1 - t0) or 1.0
    out = []
    for i, s in enumerate(symptoms[:60]):
        t = s.get("first_seen")
        x = 20 + 560 * ((t - t0) / span) if isinstance(t, int | float) else 20
        out.append(
            {
                "x": round(x, 1),
                "y": 30 + 14 * (i % 4),
                "anchor": "end" if x > 400 else "start",
                "role": s.get("role"),
                "id": str(s.get("id", "?")),
                "dt": (t - t0) if isinstance(t, int | float) else None,
            }
        )
    return out

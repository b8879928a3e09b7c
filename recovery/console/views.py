"""The console's pages: incidents, incident detail, approvals, audit, policy and health.

Every page is server-rendered (Jinja2, autoescape on); the list refreshes itself with a few
lines of JavaScript. Reads need credentials unless `GOODPUT_CONSOLE_OPEN_READ=1`; every
mutation needs credentials and passes the CSRF checks in `security`.
"""

from __future__ import annotations

import json
import math
import time
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import yaml
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.concurrency import run_in_threadpool

from recovery import audit, schema, validate, watchdog
from recovery.console import actions_port, ettr, health, plot, queries, security
from recovery.diagnosis import OUTCOMES
from recovery.policy import DRAINS

HERE = Path(__file__).parent
STATIC = {"console.css": "text/css", "console.js": "text/javascript"}
MAX_FORM_BYTES = 16 * 1024
MAX_EVIDENCE = 300
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)

router = APIRouter(prefix="/console", include_in_schema=False)


@lru_cache(maxsize=1)
def words() -> dict[str, Any]:
    """Plain words per outcome, action and disposition (`words.yaml`)."""
    doc = yaml.safe_load((HERE / "words.yaml").read_text())
    return doc if isinstance(doc, dict) else {}


# --- formatting ---------------------------------------------------------------------------


def fmt_age(seconds: Any) -> str:
    try:
        s = float(seconds)
    except (TypeError, ValueError):
        return "?"
    if not math.isfinite(s) or s < 0:
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{int(s // size)}{unit}"
    return f"{int(s)}s"


def fmt_ts(ts: Any) -> str:
    try:
        t = float(ts)
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
    except (TypeError, ValueError, OverflowError, OSError):
        return "—"


def fmt_pct(x: Any) -> str:
    try:
        return f"{float(x) * 100:.0f}%"
    except (TypeError, ValueError):
        return "—"


def confidence_word(x: Any) -> str:
    try:
        c = float(x)
    except (TypeError, ValueError):
        return "not yet known"
    return "high" if c >= 0.8 else "medium" if c >= 0.5 else "low"


def compact(value: Any, limit: int = 400) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@lru_cache(maxsize=1)
def templates() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(HERE / "templates")),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        age=fmt_age, ts=fmt_ts, pct=fmt_pct, compact=compact, confword=confidence_word
    )
    env.globals["words"] = words
    return env


# --- request helpers ------------------------------------------------------------------------


def _settings(request: Request) -> Any:
    return request.app.state.settings


def _engine(request: Request) -> Any:
    return request.app.state.engine


def _secure(resp: Response) -> Response:
    resp.headers["Content-Security-Policy"] = CSP
    resp.headers["X-Frame-Options"] = "DENY"
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.headers["Referrer-Policy"] = "same-origin"
    resp.headers["Cache-Control"] = "no-store"
    return resp


def _not_acting(request: Request) -> str:
    """Why the watchdog stopped acting, or "" (the banner on every page)."""
    try:
        reason = watchdog.current(_engine(request))
    except Exception:  # noqa: BLE001 - a page must not fail because the DB is busy
        return ""
    return "" if reason == watchdog.OK else reason


def render(request: Request, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
    settings = _settings(request)
    csrf = security.csrf_of(request)
    fresh = csrf is None
    if csrf is None:
        csrf = security.new_csrf()
    who = security.identity(settings, request)
    body = (
        templates()
        .get_template(name)
        .render(
            request_path=request.url.path,
            who=who,
            csrf=csrf,
            can_login=security.session_key(settings) is not None,
            auth_required=settings.require_auth,
            not_acting=_not_acting(request),
            **ctx,
        )
    )
    resp = HTMLResponse(body, status_code=status)
    if fresh:
        resp.set_cookie(
            security.CSRF_COOKIE,
            csrf,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/console",
        )
    return _secure(resp)  # type: ignore[return-value]


def _can_read(request: Request) -> bool:
    settings = _settings(request)
    return security.open_read(settings) or security.identity(settings, request) is not None


def _login_redirect(request: Request) -> Response:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return _secure(RedirectResponse("/console/login?" + urlencode({"next": target}), 303))


def _error(request: Request, status: int, message: str) -> HTMLResponse:
    return render(request, "error.html", status=status, message=message)


async def _form(request: Request) -> dict[str, str] | None:
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > MAX_FORM_BYTES:
        return None
    try:
        form = await request.form(max_files=0, max_fields=20)
    except Exception:  # noqa: BLE001 - malformed bodies are the client's error
        return None
    return {k: v for k, v in form.items() if isinstance(v, str)}


def _prom_link(base: str | None, expr: str) -> str | None:
    if not base or not expr:
        return None
    return f"{base.rstrip('/')}/graph?" + urlencode(
        {"g0.expr": expr, "g0.tab": "0", "g0.range_input": "1h"}
    )


# --- pages ---------------------------------------------------------------------------------


@router.get("")
@router.get("/")
def index() -> Response:
    return RedirectResponse("/console/incidents", 303)


@router.get("/static/{name}")
def static(name: str) -> Response:
    if name not in STATIC:
        return Response("not found", 404, media_type="text/plain")
    resp = Response((HERE / "static" / name).read_bytes(), media_type=STATIC[name])
    resp.headers["Cache-Control"] = "max-age=300"
    resp.headers["X-Content-Type-Options"] = "nosniff"
    return resp


@router.get("/login")
def login_page(request: Request, next: str = "") -> Response:  # noqa: A002
    return render(request, "login.html", next=security.safe_next(next), problem=None)


@router.post("/login")
async def login(request: Request) -> Response:
    settings = _settings(request)
    form = await _form(request)
    if form is None:
        return _error(request, 400, "the form could not be read")
    problem = security.csrf_problem(request, form.get("csrf_token"))
    nxt = security.safe_next(form.get("next"))
    if problem:
        return render(request, "login.html", status=403, next=nxt, problem=problem)
    try:
        name = security.clean_name(form.get("name", ""))
    except ValueError as exc:
        return render(request, "login.html", status=400, next=nxt, problem=str(exc))
    via = security.check_credentials(
        settings,
        token=form.get("token", ""),
        user=form.get("user", ""),
        password=form.get("password", ""),
    )
    if via is None or security.session_key(settings) is None:
        return render(
            request,
            "login.html",
            status=401,
            next=nxt,
            problem="those credentials are not the receiver's API credentials",
        )
    resp = RedirectResponse(nxt, 303)
    resp.set_cookie(
        security.SESSION_COOKIE,
        security.make_session(settings, name),
        max_age=security.SESSION_TTL_S,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/console",
    )
    return _secure(resp)


@router.post("/logout")
async def logout(request: Request) -> Response:
    form = await _form(request)
    problem = security.csrf_problem(request, (form or {}).get("csrf_token"))
    if problem:
        return _error(request, 403, problem)
    resp = RedirectResponse("/console/login", 303)
    resp.delete_cookie(security.SESSION_COOKIE, path="/console")
    return _secure(resp)


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
    if not _can_read(request):
        return _login_redirect(request)
    f, problems = _filters(request)
    data = queries.incident_page(
        _engine(request),
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
        counts=queries.outcome_counts(_engine(request)),
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
    if not _can_read(request):
        return _login_redirect(request)
    number = validate.db_int(incident_id)
    if number is None:
        return _error(request, 404, "no such incident")
    settings, engine = _settings(request), _engine(request)
    inc = queries.incident_detail(engine, number)
    if inc is None:
        return _error(request, 404, f"incident {incident_id} not found")
    diag = inc["diagnosis"]
    evidence = [e for e in (diag or {}).get("evidence") or [] if isinstance(e, dict)]
    for e in evidence[:MAX_EVIDENCE]:
        e["link"] = (
            _prom_link(settings.prometheus_url, str(e.get("query_or_path") or ""))
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
        plot_link=_prom_link(settings.prometheus_url, (the_plot or {}).get("query") or ""),
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


@router.get("/approvals")
def approvals_page(request: Request) -> Response:
    if not _can_read(request):
        return _login_redirect(request)
    pol, source = actions_port.policy_in_force(_settings(request))
    engine = _engine(request)
    return render(
        request,
        "approvals.html",
        pending=actions_port.pending(engine),
        policy=pol,
        policy_source=source,
        now=time.time(),
        can_decide=actions_port.available(),
        paused=actions_port.paused(engine),
        notice=request.query_params.get("done", "")[:200],
    )


async def _mutation(
    request: Request, settings: Any, what: str
) -> tuple[Any, dict[str, str]] | Response:
    """Who may change things, and their form: logged in, readable form, CSRF token and Origin."""
    who = security.identity(settings, request)
    if who is None:
        return _error(request, 401, f"log in with the receiver's credentials to {what}")
    form = await _form(request)
    if form is None:
        return _error(request, 400, "the form could not be read")
    problem = security.csrf_problem(request, form.get("csrf_token"))
    if problem:
        return _error(request, 403, problem)
    return who, form


@router.post("/actions/{action_id}/{verdict}")
async def decide_action(request: Request, action_id: str, verdict: str) -> Response:
    settings = _settings(request)
    if verdict not in ("approve", "reject"):
        return _error(request, 404, "unknown verdict")
    if (
        not action_id
        or len(action_id) > 64
        or not all(c.isalnum() or c in "-_:." for c in action_id)
    ):
        return _error(request, 404, "no such action")
    checked = await _mutation(request, settings, "decide actions")
    if isinstance(checked, Response):
        return checked
    who, form = checked
    reason = " ".join(form.get("reason", "").split())[:500]
    if verdict == "reject" and not reason:
        return _error(request, 400, "a rejection needs a reason")
    try:
        message = await run_in_threadpool(
            actions_port.decide, _engine(request), settings, action_id, verdict, who.actor, reason
        )
    except (LookupError, ValueError) as exc:
        return _error(request, 409, f"{verdict} refused: {exc}"[:500])
    except Exception as exc:  # noqa: BLE001 - shown to the person, who can retry
        return _error(request, 409, f"{verdict} failed: {type(exc).__name__}: {exc}"[:500])
    done = f"{verdict}d {action_id}: {message}"
    return _secure(RedirectResponse("/console/approvals?" + urlencode({"done": done}), 303))


@router.get("/audit")
def audit_page(request: Request) -> Response:
    if not _can_read(request):
        return _login_redirect(request)
    engine = _engine(request)
    schema.upgrade(engine)
    q = request.query_params
    f = {
        "job": q.get("job", "").strip(),
        "incident": q.get("incident", "").strip(),
        "type": q.get("type", "").strip(),
        "cursor": q.get("cursor", "0"),
    }
    problems = []
    if f["job"] and not validate.JOB_ID.fullmatch(f["job"]):
        problems.append("job is not a valid job id")
        f["job"] = ""
    if f["incident"] and validate.db_int(f["incident"]) is None:
        problems.append("incident must be a number")
        f["incident"] = ""
    if f["type"] and f["type"] not in audit.TYPES:
        problems.append("unknown event type")
        f["type"] = ""
    cursor = validate.db_int(f["cursor"]) or 0
    events, nxt = audit.query(
        engine,
        job_id=f["job"] or None,
        incident_id=f["incident"] or None,
        type_=f["type"] or None,
        cursor=cursor,
        limit=100,
    )
    base = {k: v for k, v in f.items() if v and k != "cursor"}
    return render(
        request,
        "audit.html",
        events=events,
        f=f,
        problems=problems,
        types=audit.TYPES,
        verification=audit.verify(engine),
        next_link="?" + urlencode({**base, "cursor": nxt}) if nxt else None,
        first_link="?" + urlencode(base) if cursor else None,
    )


@router.get("/policy")
def policy_page(request: Request) -> Response:
    if not _can_read(request):
        return _login_redirect(request)
    settings, engine = _settings(request), _engine(request)
    pol, source = actions_port.policy_in_force(_settings(request))
    sched = actions_port.probe_scheduler(settings)
    probes, nodes = health.probe(settings, sched)
    partitions: dict[str, list[Any]] = {}
    for n in nodes:
        for p in n.partitions or ("(none)",):
            partitions.setdefault(p.rstrip("*"), []).append(n)
    drains = actions_port.drains_last_hour(engine)
    return render(
        request,
        "policy.html",
        policy=pol,
        policy_source=source,
        probes=probes,
        last_reports=queries.connector_history(engine),
        partitions=partitions,
        drains=drains,
        paused=actions_port.paused(engine),
        drain_kinds=DRAINS,
        policy_yaml=yaml.safe_dump(pol.model_dump(mode="json"), sort_keys=False) if pol else "",
    )


@router.get("/nodes")
def nodes_page(request: Request) -> Response:
    """ETTR (cluster and the jobs that lost the most) and each node's history."""
    if not _can_read(request):
        return _login_redirect(request)
    settings, engine = _settings(request), _engine(request)
    pol, source = actions_port.policy_in_force(settings)
    rows, note = [], ""
    if pol is None:
        note = f"The policy could not be loaded: {source}"
    else:
        from recovery import node_history

        try:
            schema.upgrade(engine)  # a receiver that has run no check yet
            rows = node_history.summary(engine, pol)
        except Exception as exc:  # noqa: BLE001 - the page says so instead of a 500
            note = f"node history unavailable ({type(exc).__name__})"
    return render(
        request,
        "nodes.html",
        ettr=ettr.read(settings.prometheus_url),
        nodes=rows,
        history_note=note,
    )


@router.post("/pause")
async def pause_switch(request: Request) -> Response:
    """Flip the global pause switch (audited by `recovery.actions`)."""
    settings = _settings(request)
    checked = await _mutation(request, settings, "pause actions")
    if isinstance(checked, Response):
        return checked
    who, form = checked
    reason = " ".join(form.get("reason", "").split())[:500]
    if form.get("paused") not in ("on", "off") or not reason:
        return _error(request, 400, "say on or off, and give a reason")
    try:
        await run_in_threadpool(
            actions_port.set_paused, _engine(request), form["paused"] == "on", who.actor, reason
        )
    except LookupError as exc:
        return _error(request, 409, str(exc))
    return _secure(RedirectResponse("/console/policy", 303))

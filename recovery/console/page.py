"""Rendering a console page and guarding it: security headers, the CSRF cookie, the watchdog
banner. Reads need credentials unless `GOODPUT_CONSOLE_OPEN_READ=1`; every mutation needs
credentials and passes the CSRF checks in `security` (`mutation`).

Everything here that touches the store (`logouts`, `watchdog`) or the secret files is
synchronous: plain `def` pages run in FastAPI's threadpool; an `async def` handler (it must be,
to await its form) reaches them only through `run_in_threadpool` (`identify`, `error_page`),
never on the event loop, where a busy database would stall the Alertmanager webhook too."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from recovery import logouts, watchdog
from recovery.console import security
from recovery.console.templating import templates

MAX_FORM_BYTES = 16 * 1024
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)


def settings_of(request: Request) -> Any:
    return request.app.state.settings


def engine_of(request: Request) -> Any:
    return request.app.state.engine


def who(request: Request) -> security.Identity | None:
    """Who is asking (`security.identity`), a logged-out session counting as none."""
    engine = engine_of(request)
    return security.identity(
        settings_of(request), request, ended=lambda sid: logouts.ended(engine, sid)
    )


def secure(resp: Response) -> Response:
    resp.headers["Content-Security-Policy"] = CSP
    resp.headers["X-Frame-Options"] = "DENY"
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.headers["Referrer-Policy"] = "same-origin"
    resp.headers["Cache-Control"] = "no-store"
    return resp


def _not_acting(request: Request) -> str:
    """Why the watchdog stopped acting, or "" (the banner on every page)."""
    try:
        reason = watchdog.current(engine_of(request))
    except Exception:  # noqa: BLE001 - a page must not fail because the DB is busy
        return ""
    return "" if reason == watchdog.OK else reason


def render(request: Request, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
    settings = settings_of(request)
    csrf = security.csrf_of(request)
    fresh = csrf is None
    if csrf is None:
        csrf = security.new_csrf()
    person = who(request)
    body = (
        templates()
        .get_template(name)
        .render(
            request_path=request.url.path,
            who=person,
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
    return secure(resp)  # type: ignore[return-value]


def can_read(request: Request) -> bool:
    return security.open_read(settings_of(request)) or who(request) is not None


def login_redirect(request: Request) -> Response:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return secure(RedirectResponse("/console/login?" + urlencode({"next": target}), 303))


def error(request: Request, status: int, message: str) -> HTMLResponse:
    return render(request, "error.html", status=status, message=message)


async def error_page(request: Request, status: int, message: str) -> HTMLResponse:
    """`error` for an `async def` handler: rendering reads the store, so off the event loop."""
    return await run_in_threadpool(error, request, status, message)


async def identify(request: Request) -> security.Identity | None:
    """`who` for an `async def` handler, off the event loop."""
    return await run_in_threadpool(who, request)


async def read_form(request: Request) -> dict[str, str] | None:
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > MAX_FORM_BYTES:
        return None
    try:
        form = await request.form(max_files=0, max_fields=20)
    except Exception:  # noqa: BLE001 - malformed bodies are the client's error
        return None
    if len(set(form.keys())) < len(form.multi_items()):
        return None  # a field given twice (paused=on&paused=off): which one was meant?
    return {k: v for k, v in form.items() if isinstance(v, str)}


def prom_link(base: str | None, expr: str) -> str | None:
    if not base or not expr:
        return None
    return f"{base.rstrip('/')}/graph?" + urlencode(
        {"g0.expr": expr, "g0.tab": "0", "g0.range_input": "1h"}
    )


async def mutation(request: Request, what: str) -> tuple[Any, dict[str, str]] | Response:
    """Who may change things, and their form: logged in, readable form, CSRF token and Origin."""
    person = await identify(request)
    if person is None:
        return await error_page(request, 401, f"log in with the receiver's credentials to {what}")
    form = await read_form(request)
    if form is None:
        return await error_page(request, 400, "the form could not be read")
    problem = security.csrf_problem(request, form.get("csrf_token"))
    if problem:
        return await error_page(request, 403, problem)
    return person, form

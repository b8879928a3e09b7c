"""The console's entry, static files, login and logout."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from recovery import logouts, validate
from recovery.console import security
from recovery.console.page import (
    engine_of,
    error,
    error_page,
    read_form,
    render,
    secure,
    settings_of,
)
from recovery.console.templating import HERE

STATIC = {"console.css": "text/css", "console.js": "text/javascript"}

router = APIRouter(prefix="/console", include_in_schema=False)


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
    form = await read_form(request)
    if form is None:
        return await error_page(request, 400, "the form could not be read")
    return await run_in_threadpool(_login, request, form)


def _login(request: Request, form: dict[str, str]) -> Response:
    """The rest of `login`, in the threadpool: it reads the secret files and renders pages
    (the store: `page.who`, the watchdog banner)."""
    settings = settings_of(request)
    problem = security.csrf_problem(request, form.get("csrf_token"))
    nxt = security.safe_next(form.get("next"))
    if problem:
        return render(request, "login.html", status=403, next=nxt, problem=problem)
    try:
        name = validate.person(form.get("name", ""))
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
    return secure(resp)


@router.post("/logout")
async def logout(request: Request) -> Response:
    """End the session everywhere (a copy of its cookie stops working too), then drop it."""
    form = await read_form(request)
    return await run_in_threadpool(_logout, request, form)


def _logout(request: Request, form: dict[str, str] | None) -> Response:
    """The rest of `logout`, in the threadpool: it reads the secret files and writes the store
    (`logouts.record`, which may wait behind the webhook's writer)."""
    problem = security.csrf_problem(request, (form or {}).get("csrf_token"))
    if problem:
        return error(request, 403, problem)
    cookie = request.cookies.get(security.SESSION_COOKIE)
    session = security.read_session(settings_of(request), cookie)
    if session is not None:
        logouts.record(engine_of(request), session.sid, session.expires_at)
    resp = RedirectResponse("/console/login", 303)
    resp.delete_cookie(security.SESSION_COOKIE, path="/console")
    return secure(resp)

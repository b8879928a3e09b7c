"""Console security: who is asking (API credentials or a session cookie) and CSRF checks.

- A browser logs in with the API's credentials (the bearer token, or basic user + password);
  the console then sets `goodput_session`, an HMAC-signed cookie (HttpOnly, SameSite=Strict,
  12 h) keyed on those credentials, so rotating them ends every session. Each session has an
  id (`sid`); logging out records it (`logouts`), which ends that session everywhere.
- Mutations need an identity; reading needs one too unless `GOODPUT_CONSOLE_OPEN_READ=1`.
- Every form carries a CSRF token that must equal the `goodput_csrf` cookie (double submit),
  and the request's Origin (or Referer) must be this host.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from fastapi import Request

from recovery.settings import Settings, read_secret

SESSION_COOKIE = "goodput_session"
CSRF_COOKIE = "goodput_csrf"
SESSION_TTL_S = 12 * 3600


@dataclass(frozen=True)
class Identity:
    """Who is acting: `actor` is what the audit log records."""

    actor: str
    via: str  # session | bearer | basic | open


@dataclass(frozen=True)
class Session:
    """A valid session cookie's content: who logged in, its id and when it expires."""

    name: str
    sid: str
    expires_at: float


def _secrets(settings: Settings) -> tuple[str | None, str | None]:
    return read_secret(settings.token_file), read_secret(settings.basic_password_file)


def session_key(settings: Settings) -> bytes | None:
    """The HMAC key for session cookies, derived from the configured credentials."""
    token, password = _secrets(settings)
    if not token and not (settings.basic_user and password):
        return None
    material = "\0".join(
        ["goodput-console-session-2", token or "", settings.basic_user or "", password or ""]
    )
    return hashlib.sha256(material.encode()).digest()


def open_read(settings: Settings) -> bool:
    value = settings.extra.get("GOODPUT_CONSOLE_OPEN_READ", "").strip().lower()
    return value in ("1", "true", "yes")


def check_credentials(
    settings: Settings, token: str = "", user: str = "", password: str = ""
) -> str | None:
    """'bearer' or 'basic' when the given credentials are the API's, else None."""
    real_token, real_pw = _secrets(settings)
    if token and real_token and hmac.compare_digest(token.strip().encode(), real_token.encode()):
        return "bearer"
    if (
        user
        and password
        and settings.basic_user
        and real_pw
        and hmac.compare_digest(user.encode(), settings.basic_user.encode())
        and hmac.compare_digest(password.encode(), real_pw.encode())
    ):
        return "basic"
    return None


def make_session(settings: Settings, name: str, now: float | None = None) -> str:
    key = session_key(settings)
    if key is None:
        raise ValueError("no credentials are configured: the console cannot sign sessions")
    body = {
        "n": name,
        "sid": secrets.token_urlsafe(18),
        "exp": int((now or time.time()) + SESSION_TTL_S),
    }
    raw = base64.urlsafe_b64encode(json.dumps(body, separators=(",", ":")).encode()).decode()
    raw = raw.rstrip("=")  # cookie-safe: no quoting needed
    sig = hmac.new(key, raw.encode(), hashlib.sha256).hexdigest()
    return f"{raw}.{sig}"


def read_session(
    settings: Settings, cookie: str | None, now: float | None = None
) -> Session | None:
    """A valid, unexpired session cookie's content, else None (whether it was ended by a
    logout is the caller's question: `identity`)."""
    key = session_key(settings)
    if not cookie or key is None or cookie.count(".") != 1 or len(cookie) > 1024:
        return None
    raw, sig = cookie.split(".")
    want = hmac.new(key, raw.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(sig, want):
        return None
    try:
        body = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        found = Session(str(body["n"]), str(body["sid"]), float(body["exp"]))
    except (ValueError, KeyError, TypeError):
        return None
    if found.expires_at < (now or time.time()):
        return None
    return found


def _header_identity(settings: Settings, request: Request) -> Identity | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and check_credentials(settings, token=value):
        return Identity("api (bearer token)", "bearer")
    if scheme.lower() == "basic":
        try:
            user, _, pw = base64.b64decode(value.strip(), validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        if check_credentials(settings, user=user, password=pw):
            return Identity(f"{user} (basic)", "basic")
    return None


def identity(settings: Settings, request: Request, ended: Callable[[str], bool]) -> Identity | None:
    """Who the request comes from, or None when it carries no valid credentials; `ended(sid)`
    says whether a session was logged out."""
    if settings.require_auth:
        found = _header_identity(settings, request)
        if found is not None:
            return found
    session = read_session(settings, request.cookies.get(SESSION_COOKIE))
    if session is not None and ended(session.sid):
        session = None
    if not settings.require_auth:
        return Identity(f"{session.name} (console)" if session else "anonymous", "open")
    return Identity(f"{session.name} (console)", "session") if session else None


def new_csrf() -> str:
    return secrets.token_urlsafe(32)


def csrf_of(request: Request) -> str | None:
    value = request.cookies.get(CSRF_COOKIE)
    return value if value and 20 <= len(value) <= 100 else None


def same_origin(request: Request) -> bool:
    """The Origin (or, lacking it, the Referer) names this host."""
    host = request.headers.get("host", "")
    source = request.headers.get("origin") or request.headers.get("referer") or ""
    if not source or source == "null" or not host:
        return False
    parts = urlsplit(source)
    return parts.scheme in ("http", "https") and parts.netloc == host


def csrf_problem(request: Request, form_token: Any) -> str | None:
    """Why this form post fails the CSRF checks, or None when it passes."""
    if not same_origin(request):
        return "the request did not come from this site (Origin/Referer check failed)"
    cookie = csrf_of(request)
    if (
        not cookie
        or not isinstance(form_token, str)
        or not hmac.compare_digest(cookie.encode(), form_token.encode())
    ):
        return "the form's CSRF token is missing or stale; reload the page and try again"
    return None


def safe_next(value: str | None) -> str:
    """A redirect target inside the console only: `/console` or a path under it, with no
    `..` segment, no `//`, no backslash and no control character."""
    value = value or ""
    path = unquote(value.split("?", 1)[0])  # %2e%2e is `..` to a browser
    inside = path == "/console" or path.startswith("/console/")
    plain = "//" not in path and "\\" not in value and all(32 <= ord(c) != 127 for c in value)
    if inside and plain and ".." not in path.split("/"):
        return value
    return "/console/incidents"

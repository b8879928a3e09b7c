"""The transport both clients share: one request, a deadline on the whole of it, a bound on
its size, and an error that names the service, the URL and the HTTP status."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

import requests
import urllib3

MAX_BYTES = 64 << 20  # a larger answer is refused (decoded size; gzip cannot get round it)
CHUNK = 1 << 20


class ClientError(RuntimeError):
    """No usable answer. `status` is the HTTP status, None when none came (refused, timed out,
    cut off); `slow`: the service was reached but its answer did not come in time; `body` the
    answer's text (for a caller that reads refusals), `headers` its headers; `url` has no
    credentials and no query string."""

    SERVICE: ClassVar[str] = "HTTP"

    def __init__(
        self,
        reason: str,
        url: str = "",
        status: int | None = None,
        body: str = "",
        headers: Mapping[str, str] | None = None,
        slow: bool = False,
    ) -> None:
        self.reason, self.url, self.status, self.slow = reason, url, status, slow
        self.body, self.headers = body, headers if headers is not None else {}
        where = f"{self.SERVICE} at {url}" if url else self.SERVICE
        if status is None:
            what = "too slow" if slow else "unreachable"
            super().__init__(f"{where} {what}: {reason}" if url else reason)
        else:
            super().__init__(f"{where} answered {status}: {reason}")


def redact(url: str) -> str:
    """`url` without user:password and query, for messages."""
    u = urlsplit(url)
    host = u.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if u.port is not None:
        netloc += f":{u.port}"
    return urlunsplit((u.scheme, netloc, u.path, "", ""))


def check_url(url: str, service: str) -> str:
    """`url` without a trailing slash; ValueError unless it is http(s)://host[:port][/path]."""
    try:
        u = urlsplit(url)
        ok = u.scheme in ("http", "https") and bool(u.hostname) and not u.query
        _ = u.port  # ValueError for a bad port
    except ValueError:
        ok = False
    if not ok or any(c.isspace() for c in url):
        raise ValueError(f"{service} URL must be http(s)://host[:port][/path], not {url[:200]!r}")
    return url.rstrip("/")


def request(
    session: requests.Session,
    method: str,
    url: str,
    error: type[ClientError],
    timeout: float,
    max_bytes: int = MAX_BYTES,
    **kw: Any,
) -> tuple[int, bytes, Mapping[str, str]]:
    """(status, body, headers) of one request; `error` when no full answer came within
    `timeout` in all (connect, headers and body), or one over `max_bytes`."""
    where = redact(url)
    deadline = time.monotonic() + timeout
    late = f"no full answer within {timeout:g} s"
    try:
        # total: the headers must come within what connecting left of `timeout` (requests
        # takes urllib3's Timeout as it is; its stubs say float or tuple only)
        limit: Any = urllib3.Timeout(total=timeout)
        with session.request(method, url, timeout=limit, stream=True, **kw) as r:
            size = r.headers.get("Content-Length", "")
            if size.isdigit() and int(size) > max_bytes:
                raise error(f"answer of {size} bytes is over {max_bytes}", where, r.status_code)
            chunks, got = [], 0
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise error(late, where, slow=True)
                sock = getattr(r.raw.connection, "sock", None)
                if sock is not None:  # no read may outlast the deadline
                    sock.settimeout(left)
                # what one read brings, not CHUNK bytes: a body sent a byte at a time is
                # seen at the deadline, not once its last byte comes
                chunk = r.raw.read1(CHUNK, decode_content=True)
                if not chunk:
                    break
                got += len(chunk)
                if got > max_bytes:
                    raise error(f"answer is over {max_bytes} bytes", where, r.status_code)
                chunks.append(chunk)
            return r.status_code, b"".join(chunks), r.headers
    except (requests.ConnectTimeout, urllib3.exceptions.ConnectTimeoutError) as exc:
        raise error(f"{type(exc).__name__}: {exc}", where) from exc
    except (requests.Timeout, urllib3.exceptions.TimeoutError) as exc:
        raise error(f"{late} ({type(exc).__name__})", where, slow=True) from exc
    except (requests.RequestException, urllib3.exceptions.HTTPError) as exc:
        raise error(f"{type(exc).__name__}: {exc}", where) from exc

"""What every request to the receiver passes before a route sees it (an ASGI middleware):

- no NUL byte in its path or query (no database stores one: PostgreSQL answered a filter
  holding `%00` with a 500);
- a body of at most `limit` bytes (64 KiB: a decision, a form), read before the route parses
  it, chunked or not; the paths in `own_limit` (the webhook, 1 MiB by default) read their own.

A refused request gets the receiver's error document: 400 or 413, `{"error", "detail"}`.
"""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

BODY_LIMIT = 64 * 1024
_NO_BODY = ("GET", "HEAD", "OPTIONS", "DELETE")


class Edge:
    def __init__(
        self, app: ASGIApp, own_limit: tuple[str, ...] = (), limit: int = BODY_LIMIT
    ) -> None:
        self.app, self.own_limit, self.limit = app, own_limit, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if "\x00" in scope["path"] or b"%00" in scope.get("query_string", b""):
            await _refuse(400, "a NUL byte in the URL", scope, receive, send)
            return
        route = scope["path"].rstrip("/")  # under a proxy prefix or with a trailing slash too
        if scope["method"] in _NO_BODY or route.endswith(self.own_limit):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", ())).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await _refuse(413, f"body larger than {self.limit} bytes", scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                await _refuse(413, f"body larger than {self.limit} bytes", scope, receive, send)
                return
            if not message.get("more_body"):
                break
        body: list[Message] = [{"type": "http.request", "body": b"".join(chunks)}]

        async def replay() -> Message:
            return body.pop() if body else await receive()

        await self.app(scope, replay, send)


async def _refuse(status: int, message: str, scope: Scope, receive: Receive, send: Send) -> None:
    await JSONResponse({"error": message, "detail": []}, status_code=status)(scope, receive, send)

"""The console never runs store or secret-file access on the event loop.

Each case makes one synchronous call a console request needs (a logout's write, the logout
check in `page.who`, the watchdog banner, the secret files) block until the test releases it,
then asks `/healthz` on the same event loop (httpx's ASGITransport: one loop for both). The
health check must answer while the console request still waits; had the blocking call run on
the loop, the loop would stall and the test could not release it (the call gives up after
`STALL_S`, and the case fails)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from recovery import logouts, watchdog
from recovery.app import create_app
from recovery.console import security
from recovery.settings import Settings

TOKEN = "console-loop-token"
CSRF = "c" * 40
STALL_S = 3.0


@pytest.fixture(autouse=True)
def _no_thread(monkeypatch):
    monkeypatch.setenv("GOODPUT_ACTIONS_THREAD", "0")


@pytest.fixture
def app(tmp_path):
    (tmp_path / "token").write_text(TOKEN)
    settings = Settings(
        db_url=f"sqlite:///{tmp_path / 'console.db'}",
        token_file=str(tmp_path / "token"),
        slurm_enabled=False,
        log_dir=str(tmp_path),
    )
    return create_app(settings, start_worker=False)


class Gate:
    """Wraps a function so that calling it blocks until `release` (or `STALL_S`)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.entered = threading.Event()
        self.release = threading.Event()
        self.threads: list[int] = []
        self.released_in_time: list[bool] = []

    def __call__(self, *args: Any, **kw: Any) -> Any:
        self.threads.append(threading.get_ident())
        self.entered.set()
        self.released_in_time.append(self.release.wait(timeout=STALL_S))
        return self.fn(*args, **kw)


def _cookies(app: Any) -> dict[str, str]:
    session = security.make_session(app.state.settings, "Alice Ops")
    return {"Cookie": f"{security.SESSION_COOKIE}={session}; {security.CSRF_COOKIE}={CSRF}"}


CASES = {
    # name: (module, attribute, method, path, form, status)
    "logout writes logouts": (
        logouts,
        "record",
        "POST",
        "/console/logout",
        {"csrf_token": CSRF},
        303,
    ),
    "mutation asks who": (
        logouts,
        "ended",
        "POST",
        "/console/pause",
        {"csrf_token": CSRF, "paused": "on", "reason": "loop test"},
        303,
    ),
    "error page reads the watchdog": (
        watchdog,
        "current",
        "POST",
        "/console/actions/inc-1/maybe",
        {"csrf_token": CSRF},
        404,
    ),
    "login reads the secret files": (
        security,
        "read_secret",
        "POST",
        "/console/login",
        {"csrf_token": CSRF, "name": "Alice Ops", "token": TOKEN},
        303,
    ),
    "login page renders": (watchdog, "current", "GET", "/console/login", None, 200),
    "read page asks who": (logouts, "ended", "GET", "/console/incidents", None, 200),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_blocked_console_request_leaves_the_event_loop_free(app, monkeypatch, case):
    module, attr, method, path, form, status = CASES[case]
    headers = {**_cookies(app), "Origin": "http://testserver"}
    gate = Gate(getattr(module, attr))
    monkeypatch.setattr(module, attr, gate)
    loop_thread: list[int] = []

    async def scenario() -> tuple[httpx.Response, httpx.Response, bool]:
        loop_thread.append(threading.get_ident())
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            console = asyncio.create_task(
                c.request(method, path, data=form, headers=headers, follow_redirects=False)
            )
            deadline = time.monotonic() + 2 * STALL_S
            while not gate.entered.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
            assert gate.entered.is_set(), "the console request never reached the store"
            health = await asyncio.wait_for(c.get("/healthz"), timeout=STALL_S)
            waiting = not console.done()
            gate.release.set()
            return await console, health, waiting

    console, health, waiting = asyncio.run(scenario())
    assert health.status_code == 200
    assert waiting, "the console request finished before /healthz could be answered"
    assert gate.released_in_time and all(gate.released_in_time), "the event loop stalled"
    assert loop_thread[0] not in gate.threads, "store or file access ran on the event loop"
    assert console.status_code == status

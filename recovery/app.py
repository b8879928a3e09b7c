"""The receiver's HTTP service: Alertmanager webhook, incidents API, /metrics.

`create_app(settings)` builds a FastAPI app with `app.state.engine` (the store) and
`app.state.settings`. The diagnosis worker runs in a background thread while the app runs
(started by the lifespan; `start_worker=False` leaves it off for tests that drive it).
If `recovery.api_actions` exists its `router` is included behind the same auth.
"""

from __future__ import annotations

import base64
import binascii
import gc
import hmac
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from recovery import incidents, retention, validate
from recovery.edge import Edge
from recovery.group_commit import GroupCommit
from recovery.metrics import ReceiverMetrics
from recovery.settings import Settings, read_secret
from recovery.store import make_engine

log = logging.getLogger("goodput.receiver")

MAX_ALERTS = 1000
MAX_LABELS = 64
MAX_ANNOTATION = 8192
MAX_GENERATOR_URL = 65536
MAX_TRUNCATED = 1_000_000  # alerts Alertmanager left out (its max_alerts); more is not real
LabelMap = dict[str, str]
DbId = Annotated[int, Path(ge=0, le=validate.DB_INT_MAX)]  # larger ids: 422, not an overflow


def _label_map(value: LabelMap, strict: bool) -> LabelMap:
    """Label names checked; values strict (labels) or bounded text (annotations)."""
    for k, v in value.items():
        validate.label_name(k)
        if strict:
            validate.label_value(k, v)
        elif len(validate.text(v, f"annotation {k}")) > MAX_ANNOTATION:
            raise ValueError(f"annotation {k} is longer than {MAX_ANNOTATION} characters")
    return value


def json_media_type(header: str | None) -> bool:
    """True for `application/json` with optional parameters (a charset must be UTF-8)."""
    media, *params = (header or "").split(";")
    if media.strip().lower() != "application/json":
        return False
    for p in params:
        key, _, value = p.partition("=")
        if key.strip().lower() == "charset" and value.strip().strip('"').lower() != "utf-8":
            return False
    return True


class AlertIn(BaseModel):
    """One alert of Alertmanager's version-4 webhook payload."""

    model_config = ConfigDict(extra="ignore")

    status: Literal["firing", "resolved"]
    labels: dict[str, str] = Field(max_length=MAX_LABELS)
    annotations: dict[str, str] = Field(default_factory=dict, max_length=MAX_LABELS)
    startsAt: str = Field(max_length=40)  # noqa: N815 - Alertmanager's field names
    endsAt: str = Field(default="0001-01-01T00:00:00Z", max_length=40)  # noqa: N815
    # Prometheus' link to the rule's expression, URL-escaped: over 5,000 characters for
    # Goodput's own XID rule; bounded by the body limit, never read.
    generatorURL: str = Field(default="", max_length=MAX_GENERATOR_URL)  # noqa: N815
    fingerprint: str = Field(max_length=64)

    @field_validator("labels", "annotations")
    @classmethod
    def _labels(cls, value: LabelMap, info: Any) -> LabelMap:
        strict = info.field_name == "labels"
        if strict and "alertname" not in value:
            raise ValueError("labels must include alertname")
        return _label_map(value, strict)

    @field_validator("startsAt", "endsAt")
    @classmethod
    def _time(cls, value: str, info: Any) -> str:
        validate.timestamp(value, unset_ok=info.field_name == "endsAt")
        return value

    @field_validator("fingerprint")
    @classmethod
    def _fp(cls, value: str) -> str:
        return validate.fingerprint(value)


class WebhookIn(BaseModel):
    """Alertmanager's webhook payload, version 4."""

    model_config = ConfigDict(extra="ignore")

    version: Literal["4"]
    groupKey: str = Field(default="", max_length=4096)  # noqa: N815
    truncatedAlerts: int = Field(default=0, ge=0, le=MAX_TRUNCATED)  # noqa: N815
    status: Literal["firing", "resolved"]
    receiver: str = Field(default="", max_length=256)
    groupLabels: LabelMap = Field(default_factory=dict, max_length=MAX_LABELS)  # noqa: N815
    commonLabels: LabelMap = Field(default_factory=dict, max_length=MAX_LABELS)  # noqa: N815
    commonAnnotations: LabelMap = Field(  # noqa: N815
        default_factory=dict, max_length=MAX_LABELS
    )
    externalURL: str = Field(default="", max_length=2048)  # noqa: N815
    alerts: list[AlertIn] = Field(min_length=1, max_length=MAX_ALERTS)

    @field_validator("groupLabels", "commonLabels", "commonAnnotations")
    @classmethod
    def _maps(cls, value: LabelMap, info: Any) -> LabelMap:
        return _label_map(value, strict=info.field_name != "commonAnnotations")


class Accepted(BaseModel):
    status: Literal["ok"] = "ok"
    alerts: int
    new: int
    incidents: list[int]


class ApiError(BaseModel):
    error: str
    detail: list[str] = []


def _error(status: int, message: str, detail: list[str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "detail": detail or []}, status_code=status)


def _in_console(req: Request) -> bool:
    return req.url.path == "/console" or req.url.path.startswith("/console/")


def console_error(req: Request, status: int, message: str) -> Any:
    """The console's error page (imported here: the console is included only where it loads)."""
    from recovery.console.page import error

    return error(req, status, message)


def _validation_detail(errors: list[Any]) -> list[str]:
    out = []
    for err in errors[:20]:
        loc = ".".join(str(p)[:64] for p in err.get("loc", ()))
        msg = str(err.get("msg", "invalid"))[:300]
        out.append(validate.scrub(f"{loc}: {msg}" if loc else msg))
    return out


class Auth:
    """Bearer token (from a file) and/or HTTP basic auth; fails closed when none is set."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def __call__(self, request: Request) -> None:
        """On the event loop (a plain `def` dependency costs every request a thread hop);
        the files are re-read each time, so a rotated credential takes effect at once."""
        s = self.settings
        if not s.require_auth:
            return
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        token = read_secret(s.token_file)
        if (
            token
            and scheme.lower() == "bearer"
            and hmac.compare_digest(value.strip().encode(), token.encode())
        ):
            return
        password = read_secret(s.basic_password_file)
        if s.basic_user and password and scheme.lower() == "basic":
            try:
                user, _, pw = base64.b64decode(value.strip(), validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                user, pw = "", ""
            if hmac.compare_digest(user.encode(), s.basic_user.encode()) and hmac.compare_digest(
                pw.encode(), password.encode()
            ):
                return
        raise HTTPException(
            status_code=401,
            detail="missing or invalid credentials (bearer token or basic auth)",
            headers={"WWW-Authenticate": 'Bearer, Basic realm="goodput"'},
        )


async def _read_limited(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()):
            raise HTTPException(400, "invalid Content-Length")
        if int(declared) > limit:
            raise HTTPException(413, f"payload larger than {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, f"payload larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _actions_router() -> Any:
    try:
        from recovery import api_actions  # type: ignore[attr-defined]
    except ImportError:
        return None
    return getattr(api_actions, "router", None)


def _start_actions(engine: Any, settings: Settings, registry: CollectorRegistry) -> None:
    """Reconcile unfinished actions at start-up (crash safety) and export goodput accounting."""
    try:
        from recovery import accounting, reconciler
    except ImportError:
        return
    reconciler.start(engine, settings)
    registry.register(accounting.AccountingCollector(engine))
    _start_watchdog(engine, settings, registry)
    _start_node_checks(engine, settings, registry)


def _start_watchdog(engine: Any, settings: Settings, registry: CollectorRegistry) -> None:
    """Fail-open: the receiver stops acting while its own health fails (recovery/watchdog.py)."""
    from recovery import action_config, watchdog

    registry.register(watchdog.ActingCollector(engine))
    if os.environ.get("GOODPUT_ACTIONS_THREAD", "1") not in ("0", "false"):
        watchdog.Watchdog(
            engine, settings, lambda: action_config.config(settings).policy.watchdog
        ).start()


def _start_node_checks(engine: Any, settings: Settings, registry: CollectorRegistry) -> None:
    """A node's way back to service (checks after Goodput's drains) and node history metrics."""
    from recovery import action_config, node_checks, node_history, watchdog

    def current() -> Any:
        cfg = action_config.config(settings)
        return cfg.policy, cfg.scheduler

    node_checks.start(
        engine,
        current,
        paused=lambda: action_config.is_paused(engine) or watchdog.current(engine) != watchdog.OK,
        history=lambda now: node_history.events(
            engine, now - node_history.lookback_s(action_config.config(settings).policy)
        ),
    )
    registry.register(
        node_history.NodeHistoryCollector(engine, lambda: action_config.config(settings).policy)
    )


def create_app(settings: Settings | None = None, start_worker: bool = True) -> FastAPI:
    """The receiver app; the store is opened (and its tables created) here."""
    settings = settings or Settings.from_env()
    engine = make_engine(settings.db_url, clock=settings.clock)
    registry = CollectorRegistry()
    metrics = ReceiverMetrics(registry, engine)
    auth = Auth(settings)
    commits = GroupCommit(engine, settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        worker = pruner = None
        if start_worker:
            from recovery.worker import DiagnosisWorker

            worker = DiagnosisWorker(engine, settings, metrics)
            worker.start()
            app.state.worker = worker
            _start_actions(engine, settings, registry)
            pruner = retention.Pruner(engine, settings).start()
        # everything alive now (modules, models, pools) lives as long as the process: the
        # collector's full passes skip it (a full pass over it stalled the webhook ~70 ms)
        gc.freeze()
        try:
            yield
        finally:
            if worker is not None:
                worker.stop()
            if pruner is not None:
                pruner.stop()

    app = FastAPI(
        title="Goodput recovery receiver",
        version="1",
        description="Alertmanager webhook (v4), incidents and diagnoses.",
        lifespan=lifespan,
        docs_url=None,  # Swagger UI: unauthenticated, and blank on an air-gapped cluster (a CDN)
        redoc_url=None,
    )
    app.state.engine = engine
    app.state.settings = settings
    app.state.registry = registry
    app.state.metrics = metrics
    app.add_middleware(Edge, own_limit=("/api/v1/alerts",))  # reads its own, larger limit

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(req: Request, exc: StarletteHTTPException) -> Any:
        if _in_console(req):  # a person's browser: the console's page, not a JSON document
            message = "no such page" if exc.status_code == 404 else str(exc.detail)
            resp = await run_in_threadpool(console_error, req, exc.status_code, message)
        else:
            resp = _error(exc.status_code, str(exc.detail))
        for k, v in (exc.headers or {}).items():
            resp.headers[k] = v  # a 405's Allow
        return resp

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(422, "invalid request", _validation_detail(list(exc.errors())))

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    async def _store_down(_req: Request, exc: Exception) -> JSONResponse:
        log.warning("store unavailable: %s", exc)
        resp = _error(503, f"the store is unavailable ({type(exc).__name__}); try again")
        resp.headers["Retry-After"] = "5"
        return resp

    @app.exception_handler(Exception)
    async def _internal(_req: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error")
        return _error(500, f"internal error ({type(exc).__name__})")

    @app.post(
        "/api/v1/alerts",
        response_model=Accepted,
        responses={
            400: {"model": ApiError},
            401: {"model": ApiError},
            413: {"model": ApiError},
            415: {"model": ApiError},
            422: {"model": ApiError},
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": WebhookIn.model_json_schema(
                            ref_template="#/components/schemas/{model}"
                        )
                    }
                },
            }
        },
        dependencies=[Depends(auth)],
        tags=["webhook"],
    )
    async def post_alerts(request: Request) -> Any:
        """Accept Alertmanager's v4 webhook; the payload is durable before the 200."""
        # every refusal is counted: Alertmanager does not retry a 4xx, so these alerts are lost
        rejected = metrics.alerts_received.labels(status="rejected")
        if not json_media_type(request.headers.get("content-type")):
            rejected.inc()
            return _error(415, "content type must be application/json (charset UTF-8)")
        try:
            raw = await _read_limited(request, settings.max_body_bytes)
        except HTTPException:
            rejected.inc()
            raise
        try:
            doc = validate.json_document(raw)
        except ValueError as exc:
            rejected.inc()
            return _error(400, str(exc))
        try:
            payload = WebhookIn.model_validate(doc)
        except ValidationError as exc:
            rejected.inc()
            return _error(422, "invalid Alertmanager v4 payload", _validation_detail(exc.errors()))
        except RecursionError:
            rejected.inc()
            return _error(400, "payload nested too deeply")
        docs = [a.model_dump() for a in payload.alerts]
        kw: dict[str, Any] = {
            "raw": raw.decode("utf-8"),
            "group_key": payload.groupKey,
            "status": payload.status,
        }
        result = await commits.ingest(docs, **kw)
        for a in payload.alerts:
            metrics.alerts_received.labels(status=a.status).inc()
        return Accepted(alerts=len(payload.alerts), new=result.new, incidents=result.incident_ids)

    @app.get("/api/v1/incidents", dependencies=[Depends(auth)], tags=["incidents"])
    def list_incidents(
        state: Literal["open", "resolved"] | None = None,
        job_id: str | None = Query(default=None, max_length=32),
        limit: int = Query(default=50, ge=1, le=500),
        offset: int = Query(default=0, ge=0, le=10_000_000),
    ) -> dict[str, Any]:
        """Incidents, newest first, with paging (`limit`, `offset`)."""
        if job_id is not None:
            try:
                validate.job_id(job_id)
            except ValueError as exc:
                raise HTTPException(422, str(exc)) from None
        return incidents.list_incidents(
            engine, state=state, job_id=job_id, limit=limit, offset=offset
        )

    @app.get("/api/v1/incidents/{incident_id}", dependencies=[Depends(auth)], tags=["incidents"])
    def get_incident(incident_id: DbId) -> dict[str, Any]:
        """One incident with its alerts and its latest diagnosis."""
        found = incidents.get_incident(engine, incident_id)
        if found is None:
            raise HTTPException(404, f"incident {incident_id} not found")
        return found

    @app.get("/healthz", tags=["service"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", tags=["service"], response_class=PlainTextResponse)
    def metrics_endpoint() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    router = _actions_router()
    if router is not None:
        app.include_router(router, dependencies=[Depends(auth)])
    try:
        from recovery.console import router as console_router

        app.include_router(console_router)
    except ImportError:
        pass
    return app

"""The store service: the whole :class:`Store` protocol over HTTP, plus OTLP ingestion and metrics.

One process owns the store (SQLite file, PostgreSQL or memory) and runs the watchdog; runners,
trainers and dashboards on other machines talk to it through :class:`~agentgrad.store.client.
StoreClient`, which is itself a ``Store``. Every store call runs in a worker thread, so a
long-polling ``dequeue`` or ``wait`` never blocks the event loop.

Endpoints (JSON bodies are the pydantic models of :mod:`agentgrad.store.wire`):

* ``/v1/...`` — one endpoint per Store method (see ``/docs`` or ``/openapi.json``);
* ``POST /v1/traces`` — OTLP/HTTP trace export (protobuf or JSON);
* ``/health`` (never authenticated) and ``/metrics`` (Prometheus text format).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import uvicorn
from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentgrad import __version__
from agentgrad.errors import AgentGradError, InvalidInputError, NotFoundError
from agentgrad.netutil import http_url, listening_socket
from agentgrad.store import wire
from agentgrad.store.protocol import RolloutFilter, Store
from agentgrad.types import RolloutStatus, Worker

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
_JSON = "application/json"
_HTTP_KINDS = {401: "unauthorized", 404: "no_such_endpoint", 405: "method_not_allowed", 413: "payload_too_large"}
# Documented by reference (not ``{"model": ErrorBody}``): per-route response models cost FastAPI
# a pydantic schema build each, which made creating an app ~5x slower. See _add_error_schema.
_ERROR_DOCS: dict[int | str, dict[str, Any]] = {
    code: {"description": why, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}
    for code, why in ((400, "refused input"), (401, "missing or wrong bearer token"), (404, "unknown id"),
                      (409, "forbidden transition or id already taken"), (413, "body too large"),
                      (422, "request does not match the schema"))
}


# ---- errors -----------------------------------------------------------------------------------


def error_response(status: int, kind: str, message: str, fields: dict[str, Any] | None = None,
                   headers: dict[str, str] | None = None) -> Response:
    body = wire.ErrorBody(error=kind, message=message, fields=fields or {})
    return Response(body.model_dump_json(), status, headers=headers, media_type=_JSON)


def _store_error(exc: AgentGradError) -> Response:
    """A store exception as the status and body the client turns back into the same exception."""
    kind = next((wire.KIND_OF_ERROR[cls] for cls in type(exc).__mro__ if cls in wire.KIND_OF_ERROR), None)
    if kind is None:  # StoreFileError and friends: the server's problem, not the caller's
        log.error("store error: %s", exc)
        return error_response(500, "store_error", f"{type(exc).__name__}: {exc}")
    fields = {k: v for k, v in vars(exc).items() if isinstance(v, (str, int, float, bool, type(None)))}
    return error_response(wire.ERROR_KINDS[kind][0], kind, str(exc), fields)


def _validation_error(errors: Sequence[Any], where: str) -> Response:
    parts = []
    for error in errors[:5]:
        location = ".".join(str(p) for p in error.get("loc", ()) if p != "body") or where
        parts.append(f"{location}: {error.get('msg', 'invalid')}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return error_response(422, "validation_error", f"invalid {where}: " + "; ".join(parts) + more,
                          {"errors": len(errors)})


# ---- metrics ----------------------------------------------------------------------------------


class _Metrics:
    """Request counts and latency histograms per route, plus span counters, in Prometheus text.

    Only the event loop thread records requests, so no lock is needed; span counters are bumped
    from worker threads under ``lock``.
    """

    BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, int], int] = {}
        self.latency: dict[tuple[str, str], list[float]] = {}  # bucket counts…, sum, count
        self.spans_added = 0
        self.spans_rejected = 0
        self.lock = threading.Lock()

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route, status)
        self.requests[key] = self.requests.get(key, 0) + 1
        series = self.latency.setdefault((method, route), [0.0] * (len(self.BUCKETS) + 2))
        for i, bound in enumerate(self.BUCKETS):
            if seconds <= bound:
                series[i] += 1
        series[-2] += seconds
        series[-1] += 1

    def render(self, rollouts_by_status: dict[str, int]) -> str:
        lines = [
            "# HELP agentgrad_http_requests_total HTTP requests by method, route and status.",
            "# TYPE agentgrad_http_requests_total counter",
        ]
        for (method, route, status), n in sorted(self.requests.items()):
            lines.append(f'agentgrad_http_requests_total{{method="{method}",route="{route}",status="{status}"}} {n}')
        lines += [
            "# HELP agentgrad_http_request_duration_seconds HTTP request latency by method and route.",
            "# TYPE agentgrad_http_request_duration_seconds histogram",
        ]
        for (method, route), series in sorted(self.latency.items()):
            labels = f'method="{method}",route="{route}"'
            for bound, n in zip(self.BUCKETS, series, strict=False):
                lines.append(f'agentgrad_http_request_duration_seconds_bucket{{{labels},le="{bound}"}} {int(n)}')
            lines.append(f'agentgrad_http_request_duration_seconds_bucket{{{labels},le="+Inf"}} {int(series[-1])}')
            lines.append(f"agentgrad_http_request_duration_seconds_sum{{{labels}}} {series[-2]:.6f}")
            lines.append(f"agentgrad_http_request_duration_seconds_count{{{labels}}} {int(series[-1])}")
        queued = sum(n for s, n in rollouts_by_status.items() if RolloutStatus(s).is_queued)
        lines += [
            "# HELP agentgrad_rollouts Rollouts in the store by status.",
            "# TYPE agentgrad_rollouts gauge",
            *(f'agentgrad_rollouts{{status="{s}"}} {n}' for s, n in rollouts_by_status.items()),
            "# HELP agentgrad_queue_depth Rollouts waiting to be dequeued (queuing or requeuing).",
            "# TYPE agentgrad_queue_depth gauge",
            f"agentgrad_queue_depth {queued}",
            "# HELP agentgrad_spans_stored_total Spans accepted by this server (REST and OTLP).",
            "# TYPE agentgrad_spans_stored_total counter",
            f"agentgrad_spans_stored_total {self.spans_added}",
            "# HELP agentgrad_otlp_spans_rejected_total OTLP spans refused (no or unknown rollout/attempt).",
            "# TYPE agentgrad_otlp_spans_rejected_total counter",
            f"agentgrad_otlp_spans_rejected_total {self.spans_rejected}",
        ]
        return "\n".join(lines) + "\n"


# ---- middleware -------------------------------------------------------------------------------


DASHBOARD_PREFIX = "/dashboard"


def _self_guarded(path: str) -> bool:
    """Paths the bearer gate lets through: liveness, and the dashboard (which checks the token
    itself so that browsers can log in with a cookie)."""
    return path in ("/health", "/") or path == DASHBOARD_PREFIX or path.startswith(DASHBOARD_PREFIX + "/")


class _Guard:
    """Pure-ASGI gate in front of every route: metrics, bearer-token auth and the body limit.

    Written as raw ASGI (not ``BaseHTTPMiddleware``) because it runs on every request and the
    store API is latency-bound.
    """

    def __init__(self, app: ASGIApp, *, token: str | None, max_body_bytes: int, metrics: _Metrics) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode() if token else None
        self.max_body = max_body_bytes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            refusal, receive = self._check(scope, receive)
            if refusal is not None:
                await refusal(scope, receive, send_and_record)
            else:
                await self.app(scope, receive, send_and_record)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.observe(scope["method"], route, status, time.perf_counter() - started)

    def _check(self, scope: Scope, receive: Receive) -> tuple[Response | None, Receive]:
        headers = dict(scope["headers"])
        path = scope["path"]
        if self.expected is not None and not _self_guarded(path):
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                why = "missing" if not given else "wrong"
                return error_response(401, "unauthorized", f"{why} bearer token: send 'Authorization: Bearer <token>'",
                                      headers={"WWW-Authenticate": "Bearer"}), receive
        length = headers.get(b"content-length")
        if length is not None:
            if not length.isdigit():
                return error_response(400, "invalid_input", "Content-Length is not a number"), receive
            if int(length) > self.max_body:
                return self._too_large(), receive
            return None, receive
        return None, self._counting(receive)

    def _too_large(self) -> Response:
        return error_response(413, "payload_too_large", f"request body exceeds the limit of {self.max_body} bytes")

    def _counting(self, receive: Receive) -> Receive:
        """Enforce the limit on bodies sent without Content-Length (chunked)."""
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body:
                raise HTTPException(413, f"request body exceeds the limit of {self.max_body} bytes")
            return message

        return counted


# ---- the service ------------------------------------------------------------------------------


class _Replays:
    """The answers to recent non-idempotent writes, by ``Idempotency-Key``.

    A client that lost a response retries with the same key and receives the first answer
    instead of enqueuing twice or claiming a second rollout. A retry that arrives while the first
    request still runs waits for it. Bounded by count and bytes; entries are only needed for the
    few seconds a client retries.
    """

    def __init__(self, max_entries: int = 10_000, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.done: OrderedDict[tuple[str, str], tuple[int, bytes]] = OrderedDict()
        self.running: dict[tuple[str, str], asyncio.Future[None]] = {}
        self.max_entries, self.max_bytes, self.bytes = max_entries, max_bytes, 0

    async def run(self, request: Request, make: Callable[[], Awaitable[Response]]) -> Response:
        token = request.headers.get(wire.IDEMPOTENCY_HEADER)
        if not token:
            return await make()
        key = (request.url.path, token)
        while key in self.running:
            await asyncio.shield(self.running[key])
        if key in self.done:
            self.done.move_to_end(key)
            status, body = self.done[key]
            return Response(body, status, media_type=_JSON)
        self.running[key] = asyncio.get_running_loop().create_future()
        try:
            response = await make()
            if response.status_code < 500:
                self._remember(key, response.status_code, bytes(response.body))
            return response
        finally:
            self.running.pop(key).set_result(None)

    def _remember(self, key: tuple[str, str], status: int, body: bytes) -> None:
        self.done[key] = (status, body)
        self.bytes += len(body)
        while self.done and (len(self.done) > self.max_entries or self.bytes > self.max_bytes):
            _, (_, old) = self.done.popitem(last=False)
            self.bytes -= len(old)


class _Service:
    """Runs store calls off the event loop and turns their results and errors into responses."""

    def __init__(self, store: Store, max_wait: float, max_body: int, metrics: _Metrics) -> None:
        self.store = store
        self.max_wait = max_wait
        self.max_body = max_body
        self.metrics = metrics
        self.replays = _Replays()
        self._waiters: anyio.CapacityLimiter | None = None

    def wait_limit(self, timeout: float | None) -> float:
        return self.max_wait if timeout is None else min(timeout, self.max_wait)

    async def call(self, fn: Callable[[], BaseModel | None], *, waits: bool = False) -> Response:
        """Run ``fn`` in a worker thread; long polls get their own, larger pool so they cannot
        starve quick calls."""
        limiter = None
        if waits:
            if self._waiters is None:
                self._waiters = anyio.CapacityLimiter(512)
            limiter = self._waiters
        try:
            result = await anyio.to_thread.run_sync(fn, limiter=limiter)
        except AgentGradError as exc:
            return _store_error(exc)
        except ValidationError as exc:
            return _validation_error(exc.errors(include_url=False, include_context=False), "input")
        if result is None:
            return Response(status_code=204)
        return Response(result.model_dump_json(), media_type=_JSON)

    async def write(self, request: Request, fn: Callable[[], BaseModel | None], *, waits: bool = False) -> Response:
        return await self.replays.run(request, lambda: self.call(fn, waits=waits))

    def count_spans(self, added: int = 0, rejected: int = 0) -> None:
        with self.metrics.lock:
            self.metrics.spans_added += added
            self.metrics.spans_rejected += rejected

    def rollouts_by_status(self) -> dict[str, int]:
        return {s.value: self.store.count_rollouts(RolloutFilter(status=[s])) for s in RolloutStatus}

    def ingest(self, decoded: Any) -> tuple[int, list[str]]:
        """Store OTLP spans rollout by rollout; a group naming an unknown rollout/attempt is
        rejected whole (the store refuses it atomically) and reported, the others land."""
        groups: dict[str, list[Any]] = {}
        for span in decoded.spans:
            groups.setdefault(span.rollout_id, []).append(span)
        rejected, problems = decoded.rejected, list(decoded.problems)
        for group in groups.values():
            try:
                self.store.add_spans(group)
            except (NotFoundError, InvalidInputError) as exc:
                rejected += len(group)
                problems.append(str(exc))
        self.count_spans(added=len(decoded.spans) - (rejected - decoded.rejected), rejected=rejected)
        return rejected, problems


def _api_router(svc: _Service) -> APIRouter:
    """``/v1``: one endpoint per Store method."""
    store = svc.store
    api = APIRouter(prefix="/v1", responses=_ERROR_DOCS)

    # rollouts
    @api.post("/rollouts/enqueue", response_model=wire.RolloutList, tags=["rollouts"])
    async def enqueue_rollouts(body: wire.EnqueueBody, request: Request) -> Response:
        """Queue rollouts atomically (all or none). Send ``Idempotency-Key`` to make retries safe."""
        return await svc.write(request, lambda: wire.RolloutList(rollouts=store.enqueue_rollouts(body.rollouts)))

    @api.post("/rollouts/dequeue", response_model=wire.ClaimList, tags=["rollouts"])
    async def dequeue_rollouts(body: wire.DequeueBody, request: Request) -> Response:
        """Claim up to ``limit`` rollouts, long-polling up to ``timeout`` seconds for the first."""
        wait = svc.wait_limit(body.timeout)
        return await svc.write(
            request,
            lambda: wire.ClaimList(claimed=store.dequeue_rollouts(body.limit, worker_id=body.worker_id, timeout=wait)),
            waits=wait > 0,
        )

    @api.get("/rollouts/get", response_model=wire.Rollout, tags=["rollouts"])
    async def get_rollout(rollout_id: str) -> Response:
        return await svc.call(lambda: store.get_rollout(rollout_id))

    @api.post("/rollouts/query", response_model=wire.RolloutList, tags=["rollouts"])
    async def query_rollouts(body: RolloutFilter) -> Response:
        return await svc.call(lambda: wire.RolloutList(rollouts=store.query_rollouts(body)))

    @api.post("/rollouts/count", response_model=wire.Count, tags=["rollouts"])
    async def count_rollouts(body: RolloutFilter) -> Response:
        return await svc.call(lambda: wire.Count(count=store.count_rollouts(body)))

    @api.post("/rollouts/cancel", response_model=wire.Rollout, tags=["rollouts"])
    async def cancel_rollout(body: wire.RolloutRef, request: Request) -> Response:
        return await svc.write(request, lambda: store.cancel_rollout(body.rollout_id))

    @api.post("/rollouts/metadata", response_model=wire.Rollout, tags=["rollouts"])
    async def update_rollout_metadata(body: wire.MetadataBody) -> Response:
        return await svc.call(lambda: store.update_rollout_metadata(body.rollout_id, body.metadata))

    @api.post("/rollouts/wait", response_model=wire.RolloutList, tags=["rollouts"])
    async def wait_for_rollouts(body: wire.WaitBody) -> Response:
        """The listed rollouts that are terminal, long-polling up to ``timeout`` seconds."""
        wait = svc.wait_limit(body.timeout)
        return await svc.call(
            lambda: wire.RolloutList(rollouts=store.wait_for_rollouts(body.rollout_ids, timeout=wait)),
            waits=wait > 0,
        )

    # attempts
    @api.get("/attempts", response_model=wire.AttemptList, tags=["attempts"])
    async def get_attempts(rollout_id: str) -> Response:
        return await svc.call(lambda: wire.AttemptList(attempts=store.get_attempts(rollout_id)))

    @api.post("/attempts/update", response_model=wire.Attempt, tags=["attempts"])
    async def update_attempt(body: wire.AttemptUpdateBody) -> Response:
        return await svc.call(lambda: store.update_attempt(body.rollout_id, body.attempt_id, body.status, body.error))

    @api.post("/attempts/heartbeat", response_model=wire.Attempt, tags=["attempts"])
    async def heartbeat(body: wire.AttemptRef) -> Response:
        return await svc.call(lambda: store.heartbeat(body.rollout_id, body.attempt_id))

    @api.post("/watchdog/check", response_model=wire.AttemptList, tags=["attempts"])
    async def check_watchdog() -> Response:
        return await svc.call(lambda: wire.AttemptList(attempts=store.check_watchdog()))

    # spans
    @api.post("/spans", response_model=wire.SpanList, tags=["spans"])
    async def add_spans(body: wire.SpanList) -> Response:
        """Store spans idempotently on (rollout_id, attempt_id, span_id); returns stored copies."""

        def add() -> wire.SpanList:
            stored = store.add_spans(body.spans)
            svc.count_spans(added=len(stored))
            return wire.SpanList(spans=stored)

        return await svc.call(add)

    @api.get("/spans", response_model=wire.SpanList, tags=["spans"])
    async def query_spans(
        rollout_id: str,
        attempt_id: str | None = Query(None, description='an attempt id, or "latest"'),
        name: str | None = None,
        after_sequence_id: int = 0,
        limit: int | None = Query(None, ge=0),
    ) -> Response:
        return await svc.call(lambda: wire.SpanList(
            spans=store.query_spans(rollout_id, attempt_id, name, after_sequence_id, limit)))

    @api.post("/traces", tags=["spans"], openapi_extra=_OTLP_DOC)
    async def otlp_traces(request: Request) -> Response:
        """OTLP/HTTP trace export; spans name their attempt with agentgrad.rollout_id/attempt_id."""
        from agentgrad.store import otlp  # protobuf is only loaded when traces arrive

        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        reply_type = otlp.PROTOBUF if content_type == otlp.PROTOBUF else otlp.JSON
        try:
            body = otlp.decompress(await request.body(), request.headers.get("content-encoding"), svc.max_body)
            decoded = otlp.to_spans(otlp.parse_request(body, content_type))
        except InvalidInputError as exc:
            return _store_error(exc)
        except OverflowError as exc:
            return error_response(413, "payload_too_large", str(exc))
        rejected, problems = await anyio.to_thread.run_sync(svc.ingest, decoded)
        message = "; ".join(problems[:10]) + (f" (and {len(problems) - 10} more)" if len(problems) > 10 else "")
        if rejected:
            log.warning("OTLP: rejected %d span(s): %s", rejected, message)
        return Response(otlp.encode_response(rejected, message, reply_type), media_type=reply_type)

    # resources
    @api.post("/resources", response_model=wire.Resources, tags=["resources"])
    async def add_resources(body: wire.ResourcesBody, request: Request) -> Response:
        return await svc.write(request, lambda: store.add_resources(body.items, body.resources_id))

    @api.get("/resources", response_model=wire.ResourcesList, tags=["resources"])
    async def query_resources() -> Response:
        return await svc.call(lambda: wire.ResourcesList(resources=store.query_resources()))

    @api.get("/resources/latest", response_model=wire.LatestResources, tags=["resources"])
    async def get_latest_resources() -> Response:
        return await svc.call(lambda: wire.LatestResources(resources=store.get_latest_resources()))

    @api.get("/resources/get", response_model=wire.Resources, tags=["resources"])
    async def get_resources(resources_id: str) -> Response:
        return await svc.call(lambda: store.get_resources(resources_id))

    # workers and metrics
    @api.post("/workers", response_model=wire.Worker, tags=["workers"])
    async def update_worker(body: Worker) -> Response:
        return await svc.call(lambda: store.update_worker(body))

    @api.get("/workers", response_model=wire.WorkerList, tags=["workers"])
    async def query_workers() -> Response:
        return await svc.call(lambda: wire.WorkerList(workers=store.query_workers()))

    @api.post("/metrics", status_code=204, tags=["metrics"])
    async def add_metrics(body: wire.MetricList, request: Request) -> Response:
        return await svc.write(request, lambda: store.add_metrics(body.records))

    @api.get("/metrics", response_model=wire.MetricList, tags=["metrics"])
    async def query_metrics(run_id: str | None = None) -> Response:
        return await svc.call(lambda: wire.MetricList(records=store.query_metrics(run_id)))

    return api


_OTLP_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/x-protobuf": {"schema": {"type": "string", "format": "binary"}},
            "application/json": {"schema": {"type": "object", "description": "OTLP/JSON ExportTraceServiceRequest"}},
        },
    }
}


def create_app(
    store: Store,
    *,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    cors_origins: Sequence[str] | None = None,
    extra_routers: Sequence[APIRouter] = (),
    max_wait_seconds: float = wire.MAX_WAIT_SECONDS,
    dashboard: bool = True,
) -> FastAPI:
    """The store service as an ASGI app.

    Args:
        store: the backend every request reaches (``app.state.store``).
        token: when set, every endpoint but ``/health`` needs ``Authorization: Bearer <token>``.
        max_body_bytes: larger request bodies get 413 before they are read.
        cors_origins: origins allowed to call from a browser; CORS is off when None.
        extra_routers: mounted at ``/`` after the API.
        dashboard: serve the web dashboard at ``/`` (``/dashboard/…``); it enforces ``token``
            itself, with a browser login besides the bearer header.
        max_wait_seconds: cap on one long-poll (dequeue/wait) request.
    """
    metrics = _Metrics()
    svc = _Service(store, max_wait_seconds, max_body_bytes, metrics)
    app = FastAPI(
        title="AgentGrad store service",
        version=__version__,
        description="The AgentGrad Store protocol over HTTP. Errors are JSON: "
        "{error: kind, message, fields}.",
    )
    app.state.store = store
    app.state.token = token
    app.include_router(_api_router(svc))

    @app.get("/health", tags=["service"])
    async def health() -> dict[str, str]:
        """Liveness; never needs the token."""
        return {"status": "ok", "version": __version__}

    @app.get("/metrics", tags=["service"], response_class=Response)
    async def prometheus() -> Response:
        """Prometheus text exposition: requests, latency, rollouts by status, queue depth, spans."""
        counts = await anyio.to_thread.run_sync(svc.rollouts_by_status)
        return Response(metrics.render(counts), media_type="text/plain; version=0.0.4")

    for router in extra_routers:
        app.include_router(router)
    if dashboard:
        from agentgrad.dashboard.app import mount  # lazy: templates load only when served

        mount(app, store, token=token, prefix=DASHBOARD_PREFIX)
    _add_error_schema(app)

    @app.exception_handler(RequestValidationError)
    async def on_invalid_request(request: Request, exc: RequestValidationError) -> Response:
        return _validation_error(exc.errors(), "request")

    @app.exception_handler(AgentGradError)
    async def on_store_error(request: Request, exc: AgentGradError) -> Response:
        return _store_error(exc)

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, exc: HTTPException) -> Response:
        kind = _HTTP_KINDS.get(exc.status_code, "http_error")
        message = exc.detail if exc.status_code != 404 else f"no endpoint {request.method} {request.url.path}"
        return error_response(exc.status_code, kind, str(message), headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def on_bug(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(500, "internal_error", f"{type(exc).__name__}: {exc}")

    app.add_middleware(_Guard, token=token, max_body_bytes=max_body_bytes, metrics=metrics)
    if cors_origins:  # outermost, so browser preflights are answered before auth
        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["*"],
                           allow_headers=["*"])
    return app


def _add_error_schema(app: FastAPI) -> None:
    """Put ErrorBody into the OpenAPI components that every route's error responses reference."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        schema = build()
        schema.setdefault("components", {}).setdefault("schemas", {})["ErrorBody"] = wire.ErrorBody.model_json_schema()
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


# ---- running it -------------------------------------------------------------------------------


def _config(app: FastAPI, log_level: str, **kwargs: Any) -> uvicorn.Config:
    # One worker, one event loop: the store is shared state; speed comes from keep-alive and
    # the thread pool, not from forking.
    return uvicorn.Config(app, log_level=log_level, access_log=False, timeout_keep_alive=120,
                          timeout_graceful_shutdown=5, **kwargs)


class StoreServer:
    """The service in a background thread, for tests and for a Trainer sharing its store with
    runner processes: ``url = StoreServer(store).start()`` … ``.stop()``.

    Args:
        owns_store: close the store on :meth:`stop` (the server then owns its watchdog thread).
    """

    def __init__(
        self,
        store: Store,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        *,
        owns_store: bool = False,
        log_level: str = "warning",
        **app_options: Any,
    ) -> None:
        self.store = store
        self.host, self.port, self.token = host, port, token
        self.owns_store = owns_store
        self.app = create_app(store, token=token, **app_options)
        self._log_level = log_level
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.url: str | None = None

    def start(self, timeout: float = 10.0) -> str:
        """Bind (port 0 picks a free one), serve in a thread, and return the base URL once up."""
        if self._thread is not None:
            raise RuntimeError("StoreServer already started")
        sock = listening_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        self._server = uvicorn.Server(_config(self.app, self._log_level))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name=f"agentgrad-store-server:{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                sock.close()
                raise RuntimeError(f"store server failed to start on {self.host}:{self.port}")
            time.sleep(0.005)
        self.url = http_url(self.host, self.port)
        return self.url

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving (in-flight requests get a few seconds) and join the thread."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            if self.owns_store:  # wakes long-polls so shutdown does not wait for them
                self.store.close()
            self._thread.join(timeout)
            self._thread = self._server = None
        elif self.owns_store:
            self.store.close()

    def __enter__(self) -> StoreServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(
    store_url: str,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    cors_origins: Sequence[str] | None = None,
    log_level: str = "info",
    store_options: dict[str, Any] | None = None,
) -> None:
    """Open the store at ``store_url`` and serve it until SIGTERM/SIGINT, then close it."""
    from agentgrad.store import open_store

    store = open_store(store_url, **(store_options or {}))
    try:
        app = create_app(store, token=token, max_body_bytes=max_body_bytes, cors_origins=cors_origins)
        sock = listening_socket(host, port)
        server = uvicorn.Server(_config(app, log_level))
        log.info("AgentGrad store service: %r listening on %s (auth %s)", store,
                 http_url(host, sock.getsockname()[1]), "on" if token else "off")
        if threading.current_thread() is threading.main_thread():
            # uvicorn shuts down gracefully on SIGTERM/SIGINT, then re-raises the signal to the
            # handler that was there before; a no-op one lets us close the store and exit 0.
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: None)
        server.run(sockets=[sock])
        log.info("AgentGrad store service stopped")
    finally:
        store.close()

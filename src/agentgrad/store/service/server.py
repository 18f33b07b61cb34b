"""The store service: the whole :class:`Store` protocol over HTTP, plus OTLP ingestion and metrics.

One process owns the store (SQLite file, PostgreSQL or memory) and runs the watchdog; runners,
trainers and dashboards on other machines talk to it through :class:`~agentgrad.store.client.
StoreClient`, which is itself a ``Store``. Long-polling ``dequeue`` and ``wait`` calls run in
worker threads, so they never block the event loop.

Endpoints:

* ``/v1/...`` — one endpoint per Store method (:mod:`agentgrad.store.service.routes`, served as bare ASGI
  by :mod:`agentgrad.store.service.api`; JSON bodies are the models of :mod:`agentgrad.store.wire`, see
  ``/docs`` or ``/openapi.json``);
* ``POST /v1/traces`` — OTLP/HTTP trace export (protobuf or JSON);
* ``/health`` (never authenticated) and ``/metrics`` (Prometheus text format).

Layers, outermost first: CORS (when configured), the bearer/body-limit gate and request metrics
(:class:`_Guard`), the store API, then FastAPI for everything else.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentgrad._version import __version__
from agentgrad.errors import AgentGradError, InvalidInputError, NotFoundError
from agentgrad.http.guard import DEFAULT_MAX_BODY_BYTES, Guard, HostCheck, warn_if_exposed
from agentgrad.http.serve import http_url, listening_socket, serve_in_thread, serve_until_signal
from agentgrad.store import wire
from agentgrad.store.memory import MemoryStore
from agentgrad.store.protocol import RolloutFilter, Store
from agentgrad.store.service.api import StoreAPI
from agentgrad.store.service.openapi import ERROR_DOCS, document
from agentgrad.store.service.responses import HTTP_KINDS, error_response, store_error, validation_error
from agentgrad.store.service.routes import ENDPOINTS, Context, Endpoint
from agentgrad.store.sqlite import SqliteStore
from agentgrad.types import RolloutStatus

log = logging.getLogger(__name__)


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

    def count_spans(self, added: int = 0, rejected: int = 0) -> None:
        with self.lock:
            self.spans_added += added
            self.spans_rejected += rejected

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
            for bound, count in zip(self.BUCKETS, series, strict=False):
                lines.append(f'agentgrad_http_request_duration_seconds_bucket{{{labels},le="{bound}"}} {int(count)}')
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
    itself so that browsers can log in with a cookie). A path with a ``.`` or ``..`` segment
    (``/dashboard/../v1/spans``, as decoded from ``%2e%2e``) is never let through: whatever
    resolves it later must find the token checked."""
    if "/." in path and any(segment in (".", "..") for segment in path.split("/")):
        return False
    return path in ("/health", "/") or path == DASHBOARD_PREFIX or path.startswith(DASHBOARD_PREFIX + "/")


class _Guard:
    """Pure-ASGI gate in front of every route: metrics, then the package's gate
    (:class:`~agentgrad.http.guard.Guard`: allowed ``Host``, bearer token, body limit).

    Written as raw ASGI (not ``BaseHTTPMiddleware``) because it runs on every request and the
    store API is latency-bound. Content types are the store API's own check (422).
    """

    def __init__(
        self, app: ASGIApp, *, token: str | None, max_body_bytes: int, metrics: _Metrics, hosts: HostCheck | None = None
    ) -> None:
        self.app = app
        self.gate = Guard(
            token=token, hosts=hosts, max_body_bytes=max_body_bytes, content_types=None, open_path=_self_guarded
        )
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
        refusal = self.refusal(scope["path"], headers)
        if refusal is not None or b"content-length" in headers:
            return refusal, receive
        return None, self._counting(receive)

    def refusal(self, path: str, headers: dict[bytes, bytes]) -> Response | None:
        """The answer refusing a request by its headers (host, token, declared body size), or None."""
        refused = self.gate.refusal(path, headers)
        if refused is None:
            return None
        return error_response(refused.status, refused.code, refused.message, headers=refused.headers or None)

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


class _DirectAnswers:
    """Store calls answered from the HTTP parser (:mod:`agentgrad.store.service.fastpath`): the same gate,
    store API and metrics as the ASGI layers, without them.

    Accepted: a known ``/v1`` route and method, an exact path (no escapes), a declared body of
    at most ``max_direct_bytes``, and no ``Origin`` header when CORS is on (browsers get CORS's
    answers). Everything else, and whatever the store API cannot answer at once, goes through
    ASGI as before.
    """

    def __init__(self, api: StoreAPI, guard: _Guard, *, cors: bool, max_direct_bytes: int = 4 * 1024 * 1024) -> None:
        self.api, self.guard, self.cors = api, guard, cors
        self.max_body = min(max_direct_bytes, guard.max_body)

    def accepts(self, method: bytes, url: bytes, headers: list[tuple[bytes, bytes]]) -> Any:
        target, _, query = url.partition(b"?")
        if b"%" in target or b"#" in query:
            return None
        endpoint = self.api.route(method.decode("latin-1"), target.decode("latin-1"))
        if not isinstance(endpoint, Endpoint):
            return None
        fields = dict(headers)
        if self.cors and b"origin" in fields:
            return None
        if endpoint.body is not None:
            length = fields.get(b"content-length")
            if length is None or not length.isdigit() or int(length) > self.max_body:
                return None
        return endpoint, query, headers, fields

    def answer(self, accepted: Any, body: bytes) -> Response | None:
        started = time.perf_counter()
        endpoint, query, headers, fields = accepted
        response = self.guard.refusal(endpoint.path, fields) or self.api.answer_at_once(endpoint, query, headers, body)
        if response is not None:
            self.guard.metrics.observe(
                endpoint.method, endpoint.path, response.status_code, time.perf_counter() - started
            )
        return response


# ---- the service ------------------------------------------------------------------------------


def _serializes_calls(store: Store) -> bool:
    """Stores whose every call takes one in-process lock: their quick calls run on the event loop
    (a worker thread would only add context switches); others, like PostgreSQL, get threads."""
    return isinstance(store, (MemoryStore, SqliteStore))


def _ingest(store: Store, metrics: _Metrics, decoded: Any) -> tuple[int, list[str]]:
    """Store OTLP spans rollout by rollout; a group naming an unknown rollout/attempt is rejected
    whole (the store refuses it atomically) and reported, the others land."""
    groups: dict[str, list[Any]] = {}
    for span in decoded.spans:
        groups.setdefault(span.rollout_id, []).append(span)
    rejected, problems = decoded.rejected, list(decoded.problems)
    for group in groups.values():
        try:
            store.add_spans(group)
        except (NotFoundError, InvalidInputError) as exc:
            rejected += len(group)
            problems.append(str(exc))
    metrics.count_spans(added=len(decoded.spans) - (rejected - decoded.rejected), rejected=rejected)
    return rejected, problems


def _rollouts_by_status(store: Store) -> dict[str, int]:
    return {s.value: store.count_rollouts(RolloutFilter(status=[s])) for s in RolloutStatus}


def _service_routes(app: FastAPI, store: Store, metrics: _Metrics, max_body: int) -> None:
    """The routes beside the store API: liveness, Prometheus metrics and OTLP ingestion."""

    @app.get("/health", tags=["service"])
    async def health() -> dict[str, str]:
        """Liveness; never needs the token."""
        return {"status": "ok", "version": __version__}

    @app.get("/metrics", tags=["service"], response_class=Response)
    async def prometheus() -> Response:
        """Prometheus text exposition: requests, latency, rollouts by status, queue depth, spans."""
        counts = await anyio.to_thread.run_sync(_rollouts_by_status, store)
        return Response(metrics.render(counts), media_type="text/plain; version=0.0.4")

    @app.post("/v1/traces", tags=["spans"], openapi_extra=_OTLP_DOC, responses=ERROR_DOCS)
    async def otlp_traces(request: Request) -> Response:
        """OTLP/HTTP trace export; spans name their attempt with agentgrad.rollout_id/attempt_id."""
        from agentgrad.store.service import otlp  # protobuf is only loaded when traces arrive

        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        reply_type = otlp.PROTOBUF if content_type == otlp.PROTOBUF else otlp.JSON
        raw, encoding = await request.body(), request.headers.get("content-encoding")

        def decode() -> Any:  # decompressing and parsing a large export would hold every other call
            return otlp.to_spans(otlp.parse_request(otlp.decompress(raw, encoding, max_body), content_type))

        try:
            decoded = await anyio.to_thread.run_sync(decode)
        except InvalidInputError as exc:
            return store_error(exc)
        except OverflowError as exc:
            return error_response(413, "payload_too_large", str(exc))
        rejected, problems = await anyio.to_thread.run_sync(_ingest, store, metrics, decoded)
        message = "; ".join(problems[:10]) + (f" (and {len(problems) - 10} more)" if len(problems) > 10 else "")
        if rejected:
            log.warning("OTLP: rejected %d span(s): %s", rejected, message)
        return Response(otlp.encode_response(rejected, message, reply_type), media_type=reply_type)


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
    inline_calls: bool | None = None,
    allowed_hosts: HostCheck | None = None,
) -> FastAPI:
    """The store service as an ASGI app.

    Args:
        store: the backend every request reaches (``app.state.store``).
        token: when set, every endpoint but ``/health`` needs ``Authorization: Bearer <token>``.
        max_body_bytes: larger request bodies get 413 before they are read.
        cors_origins: origins allowed to call from a browser; CORS is off when None.
        extra_routers: mounted at ``/`` after the API (``agentgrad store serve`` adds the
            dashboard this way: ``agentgrad.dashboard.app.dashboard_router``; the bearer gate
            lets ``/`` and ``/dashboard`` through, since the dashboard checks the token itself).
        max_wait_seconds: cap on one long-poll (dequeue/wait) request.
        inline_calls: run quick store calls on the event loop instead of a worker thread; by
            default only for stores that serialize their calls on one lock (memory, SQLite).
        allowed_hosts: the ``Host`` names answered (421 otherwise); None: any. :class:`StoreServer`
            and :func:`serve` always set them (:meth:`~agentgrad.http.guard.HostCheck.for_bind`).
    """
    metrics = _Metrics()
    app = _ServiceApp(
        title="AgentGrad store service",
        version=__version__,
        description="The AgentGrad Store protocol over HTTP. Errors are JSON: {error: kind, message, fields}.",
    )
    app.state.store = store
    app.state.token = token
    _service_routes(app, store, metrics, max_body_bytes)
    for router in extra_routers:
        app.include_router(router)
    document(app, ENDPOINTS)

    @app.exception_handler(RequestValidationError)
    async def on_invalid_request(request: Request, exc: RequestValidationError) -> Response:
        return validation_error(exc.errors(), "request")

    @app.exception_handler(AgentGradError)
    async def on_store_error(request: Request, exc: AgentGradError) -> Response:
        return store_error(exc)

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, exc: HTTPException) -> Response:
        kind = HTTP_KINDS.get(exc.status_code, "http_error")
        message = exc.detail if exc.status_code != 404 else f"no endpoint {request.method} {request.url.path}"
        return error_response(exc.status_code, kind, str(message), headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def on_bug(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(500, "internal_error", f"{type(exc).__name__}: {exc}")

    ctx = Context(store, max_wait_seconds, metrics.count_spans)
    inline = _serializes_calls(store) if inline_calls is None else inline_calls
    api = StoreAPI(app.framework, ctx=ctx, endpoints=ENDPOINTS, inline=inline)
    guard = _Guard(api, token=token, max_body_bytes=max_body_bytes, metrics=metrics, hosts=allowed_hosts)
    # Stores whose calls run in worker threads (PostgreSQL) answer through ASGI, which awaits them.
    app.direct = _DirectAnswers(api, guard, cors=bool(cors_origins)) if inline else None
    front: ASGIApp = guard
    if cors_origins:  # outermost, so browser preflights are answered before auth
        front = CORSMiddleware(front, allow_origins=list(cors_origins), allow_methods=["*"], allow_headers=["*"])
    app.front = front
    return app


class _ServiceApp(FastAPI):
    """FastAPI behind the service's own ASGI layers (CORS, :class:`_Guard`, the store API).

    They run in front of FastAPI's middleware stack rather than inside it, so a store call skips
    FastAPI's error, telemetry and body-limit wrappers; the store API answers its own errors.
    """

    front: ASGIApp | None = None
    #: Store calls the HTTP protocol may answer without ASGI (:mod:`agentgrad.store.service.fastpath`).
    direct: _DirectAnswers | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await (self.front or self.framework)(scope, receive, send)

    async def framework(self, scope: Scope, receive: Receive, send: Send) -> None:
        """FastAPI itself: docs, health, metrics, OTLP, the dashboard, extra routers."""
        await super().__call__(scope, receive, send)


# ---- running it -------------------------------------------------------------------------------


def _config(app: FastAPI, log_level: str, **kwargs: Any) -> uvicorn.Config:
    # One worker, one event loop: the store is shared state; speed comes from keep-alive, a lean
    # request path and one write per response, not from forking.
    return uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        timeout_keep_alive=120,
        timeout_graceful_shutdown=5,
        http=_http_protocol(),
        **kwargs,
    )


def _http_protocol() -> type[asyncio.Protocol] | str:
    """httptools with one write per response and direct answers; uvicorn's own pick where
    httptools is missing."""
    try:
        from agentgrad.store.service.fastpath import StoreHttpProtocol
    except ImportError:
        return "auto"
    return StoreHttpProtocol


class StoreServer:
    """The service in a background thread, for tests and for a Trainer sharing its store with
    runner processes: ``url = StoreServer(store).start()`` … ``.stop()``.

    Args:
        owns_store: close the store on :meth:`stop` (the server then owns its watchdog thread).
        allowed_hosts: ``Host`` names answered beside the loopback names and ``host``.
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
        allowed_hosts: Sequence[str] = (),
        **app_options: Any,
    ) -> None:
        self.store = store
        self.host, self.port, self.token = host, port, token
        self.owns_store = owns_store
        self.app = create_app(store, token=token, allowed_hosts=HostCheck.for_bind(host, allowed_hosts), **app_options)
        self._log_level = log_level
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.url: str | None = None

    def start(self, timeout: float = 10.0) -> str:
        """Bind (port 0 picks a free one), serve in a thread, and return the base URL once up."""
        if self._thread is not None:
            raise RuntimeError("StoreServer already started")
        warn_if_exposed("the store service", self.host, self.token, log)
        sock = listening_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        self._server = uvicorn.Server(_config(self.app, self._log_level))
        self._thread = serve_in_thread(self._server, sock, name=f"agentgrad-store-server:{self.port}", timeout=timeout)
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
    extra_routers: Callable[[Store], Sequence[APIRouter]] | None = None,
    allowed_hosts: Sequence[str] = (),
) -> None:
    """Open the store at ``store_url`` and serve it until SIGTERM/SIGINT, then close it.

    ``extra_routers`` gets the opened store and returns routers to mount beside the API;
    ``allowed_hosts``: ``Host`` names answered beside the loopback names and ``host``.
    """
    from agentgrad.store import open_store

    store = open_store(store_url, **(store_options or {}))
    try:
        routers = extra_routers(store) if extra_routers else ()
        app = create_app(
            store,
            token=token,
            max_body_bytes=max_body_bytes,
            cors_origins=cors_origins,
            extra_routers=routers,
            allowed_hosts=HostCheck.for_bind(host, allowed_hosts),
        )
        warn_if_exposed("the store service", host, token, log)
        sock = listening_socket(host, port)
        server = uvicorn.Server(_config(app, log_level))
        log.info(
            "AgentGrad store service: %s listening on %s (auth %s)",
            store_url,
            http_url(host, sock.getsockname()[1]),
            "on" if token else "off",
        )
        if threading.current_thread() is threading.main_thread():  # the process is ours
            # Every request allocates thousands of objects (a batch of spans), so collections
            # run often; frozen, the modules and objects of start-up are no longer traversed
            # by each of them (a sixth of the server's CPU time on batched spans).
            gc.collect()
            gc.freeze()
        serve_until_signal(server, sock)  # then the store is closed, and the process exits 0
        log.info("AgentGrad store service stopped")
    finally:
        store.close()

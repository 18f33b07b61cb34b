"""The ``/v1`` store API as bare ASGI: the table of :mod:`agentgrad.store.routes`, served directly.

Why not FastAPI routes: a store call is small and latency-bound, and profiling showed most of the
server's time per call going to the framework (routing over every route, dependency solving,
request and response model handling) and to a thread-pool hop. Here a request is parsed straight
into its wire model, the store is called, and the answer is its model's JSON. Everything else
(``/health``, ``/metrics``, OTLP, docs, the dashboard) still goes to the FastAPI app behind.

Where store calls run: a call that may long-poll always gets a worker thread of its own pool, so
it never holds the event loop. Quick calls run on the event loop itself when ``inline`` is set —
for stores that serialize every call on one in-process lock anyway (memory, SQLite), a thread
adds two context switches per request and no concurrency — and in the default thread pool
otherwise (PostgreSQL: calls wait on the network and may run side by side).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import parse_qsl

import anyio
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from agentgrad.errors import AgentGradError
from agentgrad.store import wire
from agentgrad.store.responses import HTTP_KINDS, error_response, json_response, store_error, validation_error
from agentgrad.store.routes import Context, Endpoint

log = logging.getLogger(__name__)

_IDEMPOTENCY = wire.IDEMPOTENCY_HEADER.lower().encode()
#: Long polls run here, not in the default pool, so they cannot starve quick calls.
_MAX_WAITERS = 512


class Replays:
    """The answers to recent non-idempotent writes, by ``Idempotency-Key``.

    A client that lost a response retries with the same key and receives the first answer
    instead of enqueuing twice or claiming a second rollout. A retry that arrives while the first
    request still runs waits for it. Bounded by count and bytes; entries are only needed for the
    few seconds a client retries.
    """

    def __init__(self, max_entries: int = 10_000, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.done: OrderedDict[tuple[str, bytes], tuple[int, bytes]] = OrderedDict()
        self.running: dict[tuple[str, bytes], asyncio.Future[None]] = {}
        self.max_entries, self.max_bytes, self.bytes = max_entries, max_bytes, 0

    async def run(self, key: tuple[str, bytes], make: Callable[[], Awaitable[Response]]) -> Response:
        while key in self.running:
            await asyncio.shield(self.running[key])
        if key in self.done:
            self.done.move_to_end(key)
            status, body = self.done[key]
            return json_response(body, status)
        self.running[key] = asyncio.get_running_loop().create_future()
        try:
            response = await make()
            if response.status_code < 500:
                self._remember(key, response.status_code, bytes(response.body))
            return response
        finally:
            self.running.pop(key).set_result(None)

    def _remember(self, key: tuple[str, bytes], status: int, body: bytes) -> None:
        self.done[key] = (status, body)
        self.bytes += len(body)
        while self.done and (len(self.done) > self.max_entries or self.bytes > self.max_bytes):
            _, (_, old) = self.done.popitem(last=False)
            self.bytes -= len(old)


class StoreAPI:
    """ASGI middleware: answers the store endpoints, passes every other request to ``app``.

    Args:
        endpoints: what to serve (by exact path and method; a known path with another method is
            405).
        inline: run quick store calls on the event loop (see the module docstring).
    """

    def __init__(self, app: ASGIApp, *, ctx: Context, endpoints: Iterable[Endpoint], inline: bool) -> None:
        self.app = app
        self.ctx = ctx
        self.inline = inline
        self.routes: dict[str, dict[str, Endpoint]] = {}
        for endpoint in endpoints:
            self.routes.setdefault(endpoint.path, {})[endpoint.method] = endpoint
        self.replays = Replays()
        self._waiters: anyio.CapacityLimiter | None = None  # made on first use: needs a running loop

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        methods = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if methods is None:
            await self.app(scope, receive, send)
            return
        endpoint = methods.get(scope["method"])
        scope["route"] = endpoint or next(iter(methods.values()))  # its path labels the request's metrics
        if endpoint is None:
            allowed = ", ".join(sorted(methods))
            response = error_response(405, "method_not_allowed", f"{scope['method']} is not allowed on "
                                      f"{scope['path']} (allowed: {allowed})", headers={"Allow": allowed})
        else:
            try:
                response = await self._serve(endpoint, scope, receive)
            except Exception as exc:  # a bug; answered here, as FastAPI's error handler is behind us
                log.exception("unexpected error on %s %s", scope["method"], scope["path"])
                response = error_response(500, "internal_error", f"{type(exc).__name__}: {exc}")
        await response(scope, receive, send)

    async def _serve(self, endpoint: Endpoint, scope: Scope, receive: Receive) -> Response:
        try:
            arg = await _parse(endpoint, scope, receive)
        except ValidationError as exc:
            return validation_error(exc.errors(include_url=False, include_context=False), "request")
        except HTTPException as exc:  # the body limit, enforced while reading a chunked body
            return error_response(exc.status_code, HTTP_KINDS.get(exc.status_code, "http_error"), str(exc.detail))
        except _Refused as exc:
            return error_response(422, "validation_error", f"invalid request: {exc}")
        key = _header(scope, _IDEMPOTENCY) if endpoint.replayable else None
        if key:
            return await self.replays.run((endpoint.path, key), lambda: self._run(endpoint, arg))
        return await self._run(endpoint, arg)

    async def _run(self, endpoint: Endpoint, arg: Any) -> Response:
        call = functools.partial(endpoint.call, self.ctx, arg)
        try:
            if endpoint.blocks is not None and endpoint.blocks(self.ctx, arg):
                if self._waiters is None:
                    self._waiters = anyio.CapacityLimiter(_MAX_WAITERS)
                result = await anyio.to_thread.run_sync(call, limiter=self._waiters)
            elif self.inline:
                result = call()
            else:
                result = await anyio.to_thread.run_sync(call)
        except AgentGradError as exc:
            return store_error(exc)
        except ValidationError as exc:  # the store validating what it was given
            return validation_error(exc.errors(include_url=False, include_context=False), "input")
        if result is None:
            return Response(status_code=204)
        return json_response(result.model_dump_json())


class _Refused(Exception):
    """A request the endpoint cannot read at all (no body, not JSON)."""


async def _parse(endpoint: Endpoint, scope: Scope, receive: Receive) -> BaseModel | None:
    """The endpoint's input model from the query string or the JSON body (ValidationError when
    it does not fit)."""
    if endpoint.query is not None:
        return endpoint.query.model_validate(dict(parse_qsl(scope["query_string"].decode("latin-1"),
                                                             keep_blank_values=True)))
    if endpoint.body is None:
        return None
    body = await _read_body(receive)
    if not body:
        raise _Refused("the body is empty; send a JSON object")
    if not _is_json(_header(scope, b"content-type") or b""):
        # Also what keeps a web page from posting here without a CORS preflight.
        raise _Refused("send the body as JSON with 'Content-Type: application/json'")
    return endpoint.body.model_validate_json(body)


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


def _is_json(content_type: bytes) -> bool:
    kind = content_type.split(b";", 1)[0].strip().lower()
    return kind == b"application/json" or (kind.startswith(b"application/") and kind.endswith(b"+json"))

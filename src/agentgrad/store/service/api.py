"""The ``/v1`` store API as bare ASGI: the table of :mod:`agentgrad.store.service.routes`, served directly.

Why not FastAPI routes: a store call is small and latency-bound, and profiling showed most of the
server's time per call going to the framework (routing over every route, dependency solving,
request and response model handling) and to a thread-pool hop. Here a request is parsed straight
into its wire model, the store is called, and the answer is its model's JSON. Everything else
(``/health``, ``/metrics``, OTLP, docs, the dashboard) still goes to the FastAPI app behind.

Where store calls run: a call that may long-poll always gets a worker thread of its own pool, so
it never holds the event loop. A ``heavy`` read (a page of spans, lists of rollouts, metrics,
workers, resources: answers that grow with the store) runs in the default thread pool, so a long
read never stalls the heartbeats and claims behind it (the SQLite store reads on connections of
its own, beside its writer). Quick calls run on the event loop itself when ``inline`` is set —
for stores that serialize every call on one in-process lock anyway (memory, SQLite), a thread
adds two context switches per request and no concurrency — and in the default thread pool
otherwise (PostgreSQL: calls wait on the network and may run side by side).

``Idempotency-Key``: a ``replayable`` endpoint hands the request's key to the store, which keeps
the answer in its own database in the write's transaction and answers a repeat with it (see
:mod:`agentgrad.store.idempotency`). Nothing is remembered here: an answer must outlive this
process, and a repeat that arrives while the first request still runs is serialized behind it
by the store's own write lock, where it finds the record.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl

import anyio
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from agentgrad.errors import AgentGradError
from agentgrad.store import wire
from agentgrad.store.service.responses import HTTP_KINDS, error_response, json_response, store_error, validation_error
from agentgrad.store.service.routes import Context, Endpoint

log = logging.getLogger(__name__)

_IDEMPOTENCY = wire.IDEMPOTENCY_HEADER.lower().encode()
#: Long polls run here, not in the default pool, so they cannot starve quick calls.
_MAX_WAITERS = 512
#: Bodies larger than this are parsed in a worker thread (a 32 MB batch of spans takes a
#: noticeable fraction of a second to validate: not on the event loop).
_PARSE_OFF_LOOP_BYTES = 1024 * 1024


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
        self._waiters: anyio.CapacityLimiter | None = None  # made on first use: needs a running loop

    def route(self, method: str, path: str) -> Endpoint | Response | None:
        """The endpoint serving ``method path``, a 405 answer for a known path with another
        method, or None when the path is not the store API's."""
        methods = self.routes.get(path)
        if methods is None:
            return None
        endpoint = methods.get(method)
        if endpoint is not None:
            return endpoint
        allowed = ", ".join(sorted(methods))
        return error_response(
            405,
            "method_not_allowed",
            f"{method} is not allowed on {path} (allowed: {allowed})",
            headers={"Allow": allowed},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self.route(scope["method"], scope["path"]) if scope["type"] == "http" else None
        if found is None:
            await self.app(scope, receive, send)
            return
        if isinstance(found, Response):  # a 405: any endpoint of the path labels the metrics
            scope["route"] = next(iter(self.routes[scope["path"]].values()))
            response = found
        else:
            scope["route"] = found  # its path labels the request's metrics
            try:
                response = await self._serve(found, scope, receive)
            except Exception as exc:  # a bug; answered here, as FastAPI's error handler is behind us
                response = _internal_error(scope["method"], scope["path"], exc)
        await response(scope, receive, send)

    def answer_at_once(
        self, endpoint: Endpoint, query_string: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> Response | None:
        """The whole answer to a request whose body has arrived, computed on the spot, the store
        called in this thread (for ``inline`` stores only); None when it must be awaited instead
        (a long poll, a heavy read). The HTTP protocol calls this straight
        from its parser, without the ASGI machinery (see :mod:`agentgrad.store.service.fastpath`)."""
        if endpoint.heavy:
            return None
        try:
            try:
                arg = _parse_input(endpoint, query_string, headers, body)
            except (ValidationError, _Refused) as exc:
                return _input_error(exc)
            if endpoint.blocks is not None and endpoint.blocks(self.ctx, arg):
                return None
            return self._call_now(endpoint, arg, self._context(endpoint, headers))
        except Exception as exc:  # a bug
            return _internal_error(endpoint.method, endpoint.path, exc)

    async def _serve(self, endpoint: Endpoint, scope: Scope, receive: Receive) -> Response:
        headers = scope["headers"]
        try:
            body = await _read_body(receive) if endpoint.body is not None else b""
            if len(body) > _PARSE_OFF_LOOP_BYTES:  # a big batch: parsed in a worker thread
                arg = await anyio.to_thread.run_sync(_parse_input, endpoint, scope["query_string"], headers, body)
            else:
                arg = _parse_input(endpoint, scope["query_string"], headers, body)
        except (ValidationError, _Refused) as exc:
            return _input_error(exc)
        except HTTPException as exc:  # the body limit, enforced while reading a chunked body
            return error_response(exc.status_code, HTTP_KINDS.get(exc.status_code, "http_error"), str(exc.detail))
        return await self._run(endpoint, arg, self._context(endpoint, headers))

    def _context(self, endpoint: Endpoint, headers: list[tuple[bytes, bytes]]) -> Context:
        """The endpoints' context, with the request's Idempotency-Key where the endpoint honours
        one (the store checks the key's size and characters)."""
        key = _header(headers, _IDEMPOTENCY) if endpoint.replayable else None
        if not key:
            return self.ctx
        return dataclasses.replace(self.ctx, idempotency_key=key.decode("latin-1"))

    async def _run(self, endpoint: Endpoint, arg: Any, ctx: Context) -> Response:
        if endpoint.blocks is not None and endpoint.blocks(ctx, arg):
            if self._waiters is None:
                self._waiters = anyio.CapacityLimiter(_MAX_WAITERS)
            return await anyio.to_thread.run_sync(self._call_now, endpoint, arg, ctx, limiter=self._waiters)
        if self.inline and not endpoint.heavy:
            return self._call_now(endpoint, arg, ctx)
        return await anyio.to_thread.run_sync(self._call_now, endpoint, arg, ctx)

    def _call_now(self, endpoint: Endpoint, arg: Any, ctx: Context) -> Response:
        """Call the store in this thread; its answer, or the error it raised, as a response."""
        try:
            result = endpoint.call(ctx, arg)
        except AgentGradError as exc:
            return store_error(exc)
        except ValidationError as exc:  # the store validating what it was given
            return validation_error(exc.errors(include_url=False, include_context=False), "input")
        if result is None:
            return Response(status_code=204)
        return json_response(result.model_dump_json())


def _internal_error(method: str, path: str, exc: Exception) -> Response:
    log.exception("unexpected error on %s %s", method, path, exc_info=exc)
    return error_response(500, "internal_error", f"{type(exc).__name__}: {exc}")


class _Refused(Exception):
    """A request the endpoint cannot read at all (no body, not JSON)."""


def _input_error(exc: ValidationError | _Refused) -> Response:
    if isinstance(exc, _Refused):
        return error_response(422, "validation_error", f"invalid request: {exc}")
    return validation_error(exc.errors(include_url=False, include_context=False), "request")


def _parse_input(
    endpoint: Endpoint, query_string: bytes, headers: list[tuple[bytes, bytes]], body: bytes
) -> BaseModel | None:
    """The endpoint's input model from the query string or the JSON body (ValidationError when
    it does not fit)."""
    if endpoint.query is not None:
        return endpoint.query.model_validate(dict(parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)))
    if endpoint.body is None:
        return None
    if not body:
        raise _Refused("the body is empty; send a JSON object")
    if not _is_json(_header(headers, b"content-type") or b""):
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


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key == name:
            return value
    return None


def _is_json(content_type: bytes) -> bool:
    kind = content_type.split(b";", 1)[0].strip().lower()
    return kind == b"application/json" or (kind.startswith(b"application/") and kind.endswith(b"+json"))

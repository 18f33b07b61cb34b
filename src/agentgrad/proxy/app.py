"""The capture proxy's ASGI app: OpenAI-compatible in front, any OpenAI-compatible engine behind.

Routes (each also under ``/rollout/{rollout_id}/attempt/{attempt_id}``): ``POST /v1/chat/completions``,
``POST /v1/responses``, ``POST /v1/completions``, ``GET /v1/models``; plus ``GET /metrics``,
``GET /health`` and ``POST /agentgrad/flush``.

Consistency rule (``record_mode="async"``, the default): the span of a call is handed to a
background writer (:mod:`agentgrad.proxy.writer`) before the client has the complete answer, and
``POST /agentgrad/flush`` (:meth:`LLMProxy.flush`) answers once every call of an attempt is stored.
The runner flushes before it reports an attempt, so when an attempt is reported every call its
agent made is stored — the runner's "no LLM calls" check and the adapters rely on it. With
``record_mode="sync"`` the span is committed before the client has the complete answer.

Built on bare Starlette (FastAPI's base) rather than FastAPI routes: the proxy sits on every LLM
call, and request validation is done by hand anyway, so the extra layers would only add latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from agentgrad import semconv
from agentgrad.proxy.capture import (
    Api,
    CallContext,
    Capture,
    Requested,
    StreamAccumulator,
    build_span,
    strip_for_client,
    upstream_body,
)
from agentgrad.proxy.errors import ProxyError, error_body
from agentgrad.proxy.responses import ResponsesStreamWriter, from_chat_completion, to_chat_request
from agentgrad.proxy.upstream import Upstream, UpstreamResponse, UpstreamUnreachable
from agentgrad.proxy.writer import FlushError, FlushTimeout, SpanWriter

if TYPE_CHECKING:
    from agentgrad.store.protocol import Store

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
_JSON = "application/json"
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")
_RETRIES_REMEMBERED = 4096
_UPSTREAM_PATH = {"chat": "/chat/completions", "responses": "/chat/completions", "completions": "/completions"}
RecordMode = Literal["async", "sync"]

try:  # optional: orjson parses and serializes the bodies several times faster than json
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None


def _loads(raw: bytes) -> Any:
    """``json.loads``, via orjson when installed (falling back for what it refuses: NaN, huge ints)."""
    if _orjson is not None:
        try:
            return _orjson.loads(raw)
        except _orjson.JSONDecodeError:
            pass
    return json.loads(raw)


def _dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON, via orjson when installed."""
    if _orjson is not None:
        try:
            return _orjson.dumps(obj)
        except TypeError:
            pass
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


@dataclass
class ProxyMetrics:
    """Counters exposed at ``/metrics`` and on :attr:`LLMProxy.metrics`.

    ``unattributed`` (calls with no rollout: forwarded, not recorded) and ``missing_token_ids``
    (recorded calls the upstream gave no token ids for: untrainable) are the ones to watch — both
    mean an agent is producing no training data. ``store_errors`` counts spans lost after retries,
    ``store_retries`` retried store writes, ``store_batches`` store transactions (one per batch of
    spans in ``async`` record mode).
    """

    calls: int = 0
    recorded: int = 0
    unattributed: int = 0
    missing_token_ids: int = 0
    retries_deduplicated: int = 0
    rejected: int = 0
    upstream_errors: int = 0
    upstream_unreachable: int = 0
    store_errors: int = 0
    store_batches: int = 0
    store_retries: int = 0
    streams_aborted: int = 0
    attempts: set[tuple[str, str]] = field(default_factory=set, repr=False)

    def as_dict(self) -> dict[str, int]:
        values = {k: v for k, v in vars(self).items() if isinstance(v, int)}
        values["attempts_with_calls"] = len(self.attempts)
        return values


class ProxyState:
    """Everything the routes share: the store, the upstream client, counters, retry memory."""

    def __init__(self, store: Store, upstream_url: str, *, model: str | None = None,
                 upstream_api_key: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 upstream_timeout: float = 600.0, record_mode: RecordMode = "async") -> None:
        if record_mode not in ("async", "sync"):
            raise ValueError(f"record_mode must be 'async' or 'sync', got {record_mode!r}")
        self.store = store
        self.record_mode = record_mode
        self.upstream_url = upstream_url.rstrip("/")
        self.model = model
        self.upstream_api_key = upstream_api_key
        self.max_body_bytes = max_body_bytes
        self.upstream_timeout = upstream_timeout
        self.metrics = ProxyMetrics()
        self.writer = SpanWriter(store, self.metrics)
        self.client: Upstream | None = None
        self._served: list[str] | None = None
        self._recent: OrderedDict[tuple[str, str, bytes], str] = OrderedDict()

    # ---- upstream --------------------------------------------------------------------------------
    def http(self) -> Upstream:
        if self.client is None:  # created on the serving loop (lifespan), or lazily in tests
            self.client = Upstream(self.upstream_url, timeout=self.upstream_timeout)
        return self.client

    def headers(self, request: Request) -> dict[str, str]:
        headers = {"content-type": _JSON}
        auth = f"Bearer {self.upstream_api_key}" if self.upstream_api_key else request.headers.get("authorization")
        if auth:
            headers["authorization"] = auth
        return headers

    async def served_model(self, asked: Any) -> str | None:
        """The upstream model for a requested name: kept if served, else the first served model.

        Frameworks insist on names they know (LlamaIndex, CrewAI via env vars); the engine may
        serve any name. Asked once per proxy; if the upstream has no ``/models``, names pass as is.
        """
        if self.model is not None:
            return self.model
        if self._served is None:
            try:
                response = await self.http().request("GET", "/models")
                body = await response.read()
                self._served = [m["id"] for m in json.loads(body)["data"]] if response.status_code == 200 else []
            except (UpstreamUnreachable, ValueError, KeyError, TypeError):
                self._served = []
        if not self._served or asked in self._served:
            return asked if isinstance(asked, str) else (self._served[0] if self._served else None)
        return self._served[0]

    # ---- capture ---------------------------------------------------------------------------------
    def span_id_for(self, context: CallContext, request: Request, raw: bytes) -> str | None:
        """Reuse the span id of the first try when the openai SDK retries the same body.

        The store keeps the first copy of a span id, so a retry of a call that was already
        recorded (e.g. the client timed out reading it) does not count twice.
        """
        key = (context.rollout_id, context.attempt_id, hashlib.blake2b(raw, digest_size=16).digest())
        retry = request.headers.get("x-stainless-retry-count", "0")
        if retry not in ("", "0") and key in self._recent:
            self.metrics.retries_deduplicated += 1
            return self._recent[key]
        span_id = hashlib.blake2b(key[2] + time.time_ns().to_bytes(8, "little"), digest_size=8).hexdigest()
        self._recent[key] = span_id
        if len(self._recent) > _RETRIES_REMEMBERED:
            self._recent.popitem(last=False)
        return span_id

    def drop(self, call: _Call) -> None:
        """The call ends without a span (error, aborted stream): release it from the flush barrier."""
        if call.key is not None and call.open:
            call.open = False
            self.writer.cancel(call.key)

    async def record(self, call: _Call, response: dict[str, Any], capture: Capture, *, streamed: bool) -> None:
        """Hand the call's span to the writer (``async``) or store it now (``sync``)."""
        key, context = call.key, call.context
        if key is None or context is None or not call.open:
            return
        call.open = False
        if capture.prompt_token_ids is None or capture.completion_token_ids is None:
            self.metrics.missing_token_ids += 1
            log.warning("upstream %s returned no token ids for a call of rollout %s: the call is stored but "
                        "cannot be trained on (does the engine support return_token_ids?)",
                        self.upstream_url, context.rollout_id)
        ended = time.time()

        def make_span() -> Any:
            return build_span(context, call.api, call.body, response, capture, streamed=streamed,
                              started=call.started, translated=call.chat if call.api == "responses" else None,
                              span_id=call.span_id, ended=ended)

        if self.record_mode == "async":
            self.writer.submit(key, make_span)
            return
        try:  # a SQL commit must not stall the loop
            await asyncio.to_thread(self.writer.write_now, key, make_span())
        except Exception:  # the agent still gets its answer; the writer counted and logged the loss
            return


@dataclass
class _Call:
    """One client request on its way through the proxy."""

    api: Api
    body: dict[str, Any]
    chat: dict[str, Any]
    asked: Requested
    context: CallContext | None
    started: float
    span_id: str | None = None
    key: tuple[str, str] | None = None  # (rollout_id, attempt_id) of a recorded call
    open: bool = False  # accepted by the flush barrier, span not yet handed over
    streaming: bool = False  # the relayed stream's response owns the call from here


def call_context(request: Request) -> CallContext | None:
    """Rollout, attempt, agent and parent span of a request (headers win over the URL prefix).

    Headers win because they come from the context variable of the code making the call, while a
    URL may belong to a client object built for an earlier rollout and then shared.
    """
    headers, params = request.headers, request.path_params
    rollout_id = headers.get(semconv.HEADER_ROLLOUT_ID) or params.get("rollout_id")
    attempt_id = headers.get(semconv.HEADER_ATTEMPT_ID) or params.get("attempt_id")
    if not rollout_id or not attempt_id:
        return None
    trace_id = parent_id = None
    match = _TRACEPARENT.match(headers.get("traceparent", ""))
    if match:
        trace_id, parent_id = match.groups()
    return CallContext(rollout_id=rollout_id, attempt_id=attempt_id, agent_name=headers.get(semconv.HEADER_AGENT_NAME),
                       parent_id=headers.get(semconv.HEADER_PARENT_ID) or parent_id, trace_id=trace_id)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ProxyError(f"request body of {declared} bytes exceeds the proxy's limit of {limit} bytes", status=413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ProxyError(f"request body exceeds the proxy's limit of {limit} bytes", status=413)
        chunks.append(chunk)
    return b"".join(chunks)


def _parse(raw: bytes, api: Api) -> dict[str, Any]:
    try:
        body = _loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProxyError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ProxyError(f"request body must be a JSON object, got {type(body).__name__}")
    if api == "chat" and (not isinstance(body.get("messages"), list) or not body["messages"]):
        raise ProxyError("'messages' must be a non-empty list", param="messages")
    if api == "completions" and not isinstance(body.get("prompt"), (str, list)):
        raise ProxyError("'prompt' must be a string or a list", param="prompt")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise ProxyError("'stream' must be a boolean", param="stream")
    return body


def _error(exc: ProxyError) -> Response:
    return Response(exc.body(), status_code=exc.status, media_type=_JSON)


def _unreachable(state: ProxyState, exc: Exception) -> Response:
    state.metrics.upstream_unreachable += 1
    message = f"upstream {state.upstream_url} is unreachable: {type(exc).__name__}: {exc}"
    log.warning("%s", message)
    return Response(error_body(message, kind="upstream_error", code="upstream_unreachable"), status_code=502,
                    media_type=_JSON)


async def _handle(state: ProxyState, request: Request, api: Api) -> Response:
    started = time.time()
    state.metrics.calls += 1
    try:
        raw = await _read_body(request, state.max_body_bytes)
        body = _parse(raw, api)
        chat = to_chat_request(body) if api == "responses" else body
    except ProxyError as exc:
        state.metrics.rejected += 1
        return _error(exc)
    context = call_context(request)
    call = _Call(api=api, body=body, chat=chat, asked=Requested.of(body), context=context, started=started)
    if context is None:
        state.metrics.unattributed += 1
    else:
        call.span_id = state.span_id_for(context, request, raw)
        call.key = (context.rollout_id, context.attempt_id)
        call.open = True
        state.writer.begin(call.key)  # from now on, a flush of this attempt waits for this call
    try:
        return await _forward(state, request, call)
    finally:
        if not call.streaming:
            state.drop(call)  # no-op once recorded; a stream's response settles it when it ends


async def _forward(state: ProxyState, request: Request, call: _Call) -> Response:
    sent = upstream_body(call.chat, "completions" if call.api == "completions" else "chat",
                         await state.served_model(call.chat.get("model")))
    try:
        response = await state.http().request("POST", _UPSTREAM_PATH[call.api], _dumps(sent), state.headers(request))
        if response.status_code != 200:
            state.metrics.upstream_errors += 1
            return Response(await response.read(), status_code=response.status_code,
                            media_type=response.headers.get("content-type", _JSON))
        if sent.get("stream"):
            call.streaming = True
            return _RelayResponse(state, call, response)
        raw_answer = await response.read()
    except (UpstreamUnreachable, TimeoutError) as exc:
        return _unreachable(state, exc)
    try:
        data = _loads(raw_answer)
    except ValueError:
        state.metrics.upstream_errors += 1
        return Response(error_body("upstream answered 200 with a body that is not JSON", kind="upstream_error"),
                        status_code=502, media_type=_JSON)
    capture = Capture.of_body(data)
    view = strip_for_client(data, call.asked)
    if call.api == "responses":
        view = _responses_view(call, view, capture)
    content = _dumps(view)  # serialized before recording: the span may be built on another thread
    await state.record(call, view, capture, streamed=False)
    return Response(content, media_type=_JSON)


class _RelayResponse(StreamingResponse):
    """The relayed stream; whatever happens (even a client gone before the first byte), the call is
    released from the flush barrier and the upstream response closed."""

    def __init__(self, state: ProxyState, call: _Call, upstream: UpstreamResponse) -> None:
        super().__init__(_relay(state, call, upstream), media_type="text/event-stream",
                         headers={"cache-control": "no-cache"})
        self._state, self._call, self._upstream = state, call, upstream

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._state.drop(self._call)
            await self._upstream.aclose()


def _responses_view(call: _Call, completion: dict[str, Any], capture: Capture,
                    writer: ResponsesStreamWriter | None = None) -> dict[str, Any]:
    view = writer.final_response(completion) if writer else from_chat_completion(call.body, completion)
    if call.asked.token_ids:
        view["prompt_token_ids"], view["token_ids"] = capture.prompt_token_ids, capture.completion_token_ids
    return view


def _sse_events(buffer: bytearray) -> list[bytes]:
    """Cut complete SSE events (blank-line separated) off the front of ``buffer``."""
    events = []
    while True:
        end = buffer.find(b"\n\n")
        if end < 0:
            return events
        events.append(bytes(buffer[:end]))
        del buffer[: end + 2]


def _sse_data(event: bytes) -> bytes | None:
    lines = [line[5:].lstrip() for line in event.replace(b"\r", b"").split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


async def _relay(state: ProxyState, call: _Call, response: UpstreamResponse) -> AsyncIterator[bytes]:
    """Pass a stream through event by event while accumulating it; record before the last event."""
    accumulator = StreamAccumulator("completions" if call.api == "completions" else "chat")
    writer = ResponsesStreamWriter(call.body) if call.api == "responses" else None
    buffer = bytearray()
    saw_done = finished = False
    try:
        if writer:
            yield writer.start()
        async for piece in response.iter_raw():
            buffer += piece.replace(b"\r\n", b"\n") if b"\r" in piece else piece
            out = bytearray()
            for event in _sse_events(buffer):
                data = _sse_data(event)
                if data is None:
                    continue
                if data == b"[DONE]":
                    saw_done = True
                    continue
                try:
                    chunk = _loads(data)
                except ValueError:
                    out += event + b"\n\n"  # not ours to judge: pass it on untouched
                    continue
                accumulator.add(chunk)
                if writer:
                    out += writer.chunk(chunk)
                elif chunk.get("choices") or call.asked.usage_chunk or "error" in chunk:
                    out += b"data: " + _dumps(strip_for_client(chunk, call.asked)) + b"\n\n"
            if out:
                yield bytes(out)
        completion = accumulator.completion()
        if writer:
            view = _responses_view(call, completion, accumulator.capture, writer)
        else:  # as the client saw it: no usage unless it asked for the usage chunk
            view = completion if call.asked.usage_chunk else {**completion, "usage": None}
        await state.record(call, view, accumulator.capture, streamed=True)
        finished = True
        if writer:
            yield writer.finish(completion)
        elif saw_done:
            yield b"data: [DONE]\n\n"
    finally:
        if not finished:
            state.metrics.streams_aborted += 1
        await response.aclose()


async def flush_response(state: ProxyState, rollout_id: str, attempt_id: str, timeout: float) -> Response:
    """200 once every accepted call of the attempt is stored; 504 on timeout; 500 if spans were lost."""
    writer = state.writer
    try:
        if writer.pending((rollout_id, attempt_id)):  # only then block (in a thread, off the loop)
            await asyncio.to_thread(writer.flush, rollout_id, attempt_id, timeout)
        else:
            writer.flush(rollout_id, attempt_id, 0)
    except FlushTimeout as exc:
        return Response(error_body(str(exc), kind="timeout_error", code="flush_timeout"), status_code=504,
                        media_type=_JSON)
    except FlushError as exc:
        return Response(error_body(str(exc), kind="store_error", code="store_error"), status_code=500,
                        media_type=_JSON)
    return Response(b'{"status":"stored"}', media_type=_JSON)


async def _models(state: ProxyState, request: Request) -> Response:
    try:
        response = await state.http().request("GET", "/models", headers=state.headers(request))
        content = await response.read()
    except (UpstreamUnreachable, TimeoutError) as exc:
        return _unreachable(state, exc)
    return Response(content, status_code=response.status_code, media_type=response.headers.get("content-type", _JSON))


def create_proxy_app(store: Store, upstream_url: str, *, model: str | None = None,
                     upstream_api_key: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                     upstream_timeout: float = 600.0, record_mode: RecordMode = "async") -> Starlette:
    """The proxy as an ASGI app (mount it, or serve it with :class:`LLMProxy`).

    Args:
        store: where LLM call spans go.
        upstream_url: the engine's OpenAI base URL, e.g. ``http://127.0.0.1:8000/v1``.
        model: the upstream model every request is sent to; None: keep a name the upstream
            serves, map any other to the first model its ``/models`` lists.
        upstream_api_key: sent upstream instead of the client's ``Authorization``.
        max_body_bytes: larger request bodies are refused with 413.
        record_mode: ``"async"`` (default): spans are written behind the answer by a background
            writer, in batches; ``POST /agentgrad/flush`` waits until an attempt's calls are
            stored. ``"sync"``: each span is committed before the client has the complete answer.
    """
    state = ProxyState(store, upstream_url, model=model, upstream_api_key=upstream_api_key,
                       max_body_bytes=max_body_bytes, upstream_timeout=upstream_timeout, record_mode=record_mode)

    def endpoint(api: Api) -> Any:
        async def run(request: Request) -> Response:
            return await _handle(state, request, api)
        return run

    async def models(request: Request) -> Response:
        return await _models(state, request)

    async def metrics(request: Request) -> Response:
        return Response(json.dumps(state.metrics.as_dict()), media_type=_JSON)

    async def flush(request: Request) -> Response:
        try:
            payload = _loads(await request.body())
            rollout_id, attempt_id = payload["rollout_id"], payload["attempt_id"]
            timeout = float(payload.get("timeout", 30.0))
            if not isinstance(rollout_id, str) or not isinstance(attempt_id, str) or not timeout >= 0:
                raise TypeError
        except (ValueError, KeyError, TypeError, AttributeError):
            return _error(ProxyError("flush needs a JSON body {\"rollout_id\": str, \"attempt_id\": str, "
                                     "\"timeout\": seconds ≥ 0}"))
        return await flush_response(state, rollout_id, attempt_id, timeout)

    async def health(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type=_JSON)

    async def not_found(request: Request, exc: Exception) -> Response:
        message = f"no route {request.method} {request.url.path} (the proxy serves /v1/chat/completions, " \
                  "/v1/responses, /v1/completions and /v1/models)"
        return Response(error_body(message), status_code=getattr(exc, "status_code", 404), media_type=_JSON)

    routes = [Route("/metrics", metrics), Route("/health", health),
              Route("/agentgrad/flush", flush, methods=["POST"])]
    for prefix in ("", "/rollout/{rollout_id}/attempt/{attempt_id}"):
        routes += [
            Route(prefix + "/v1/chat/completions", endpoint("chat"), methods=["POST"]),
            Route(prefix + "/v1/responses", endpoint("responses"), methods=["POST"]),
            Route(prefix + "/v1/completions", endpoint("completions"), methods=["POST"]),
            Route(prefix + "/v1/models", models, methods=["GET"]),
        ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.client = None  # a fresh client bound to this serving loop
        try:
            yield
        finally:
            if state.client is not None:
                await state.client.aclose()
            await asyncio.to_thread(state.writer.close)  # drain: every accepted span is written

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found})
    app.state.proxy = state
    return app

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
For the same reason the API routes' POSTs skip even Starlette's middleware and router (see
:mod:`agentgrad.proxy.incoming`); Starlette serves everything else.

Non-streamed answers that need no change for the client (it asked for the token ids and logprobs
the proxy adds) pass through as the upstream's bytes, parsed only where the span is built: off the
client's path in ``record_mode="async"``, and not at all for a call without rollout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agentgrad import semconv
from agentgrad.http.guard import DEFAULT_MAX_BODY_BYTES, MODEL_TOKEN_ENV, Guard, GuardMiddleware, HostCheck, env_token
from agentgrad.http.jsonbody import BadJson, dumps, loads, parse_object
from agentgrad.http.openai_errors import OpenAIError, error_body, openai_refusal
from agentgrad.http.upstream import UpstreamUnreachable
from agentgrad.proxy.capture import Api, CallContext, Capture, Requested, strip_for_client, upstream_body
from agentgrad.proxy.incoming import API_ROUTES, FLUSH_PATH, ROLLOUT_PREFIX, Incoming, api_route, is_flush
from agentgrad.proxy.relay import RelayResponse, responses_view
from agentgrad.proxy.responses import to_chat_request
from agentgrad.proxy.state import Call, ProxyState, RecordMode
from agentgrad.proxy.writer import FlushError, FlushTimeout

if TYPE_CHECKING:
    from agentgrad.store.protocol import Store

log = logging.getLogger(__name__)

_JSON = "application/json"
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")
#: The longest a flush may be asked to wait, in seconds (longer asks are refused, not clamped).
MAX_FLUSH_TIMEOUT = 3600.0
_UPSTREAM_PATH = {"chat": "/chat/completions", "responses": "/chat/completions", "completions": "/completions"}
#: The context headers, as :class:`Incoming` names them (lowercase).
_ROLLOUT_ID, _ATTEMPT_ID, _AGENT_NAME, _PARENT_ID = (
    name.lower()
    for name in (
        semconv.HEADER_ROLLOUT_ID,
        semconv.HEADER_ATTEMPT_ID,
        semconv.HEADER_AGENT_NAME,
        semconv.HEADER_PARENT_ID,
    )
)


def call_context(request: Incoming) -> CallContext | None:
    """Rollout, attempt, agent and parent span of a request (headers win over the URL prefix).

    Headers win because they come from the context variable of the code making the call, while a
    URL may belong to a client object built for an earlier rollout and then shared.
    """
    headers = request.headers
    rollout_id = headers.get(_ROLLOUT_ID) or request.rollout_id
    attempt_id = headers.get(_ATTEMPT_ID) or request.attempt_id
    if not rollout_id or not attempt_id:
        return None
    trace_id = parent_id = None
    match = _TRACEPARENT.match(headers.get("traceparent", ""))
    if match:
        trace_id, parent_id = match.groups()
    agent_name = headers.get(_AGENT_NAME)  # percent-encoded by instrument() where HTTP needs it
    return CallContext(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        agent_name=unquote(agent_name) if agent_name else None,
        parent_id=headers.get(_PARENT_ID) or parent_id,
        trace_id=trace_id,
    )


def _parse(raw: bytes, api: Api) -> dict[str, Any]:
    try:
        body = parse_object(raw)
    except BadJson as exc:
        raise OpenAIError(str(exc)) from None
    if api == "chat" and (not isinstance(body.get("messages"), list) or not body["messages"]):
        raise OpenAIError("'messages' must be a non-empty list", param="messages")
    if api == "completions" and not isinstance(body.get("prompt"), (str, list)):
        raise OpenAIError("'prompt' must be a string or a list", param="prompt")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise OpenAIError("'stream' must be a boolean", param="stream")
    if "return_token_ids" in body and not isinstance(body["return_token_ids"], bool):
        raise OpenAIError("'return_token_ids' must be a boolean", param="return_token_ids")
    if body.get("stream_options") is not None and not isinstance(body["stream_options"], dict):
        raise OpenAIError("'stream_options' must be an object", param="stream_options")
    return body


def _error(exc: OpenAIError) -> Response:
    return Response(exc.body(), status_code=exc.status, media_type=_JSON)


def _unreachable(state: ProxyState, exc: Exception) -> Response:
    state.metrics.upstream_unreachable += 1
    message = f"upstream {state.upstream_url} is unreachable: {type(exc).__name__}: {exc}"
    log.warning("%s", message)
    return Response(
        error_body(message, kind="upstream_error", code="upstream_unreachable"), status_code=502, media_type=_JSON
    )


def _timed_out(state: ProxyState) -> Response:
    """The upstream took the connection but no answer came in ``upstream_timeout`` seconds: not
    unreachable — most often a generation with no ``max_tokens`` running on toward the context's end."""
    state.metrics.upstream_timeouts += 1
    message = (
        f"upstream {state.upstream_url} did not answer within {state.upstream_timeout:g} s "
        "(a long generation? give the request a max_tokens)"
    )
    log.warning("%s", message)
    return Response(
        error_body(message, kind="upstream_error", code="upstream_timeout"), status_code=504, media_type=_JSON
    )


async def _handle(state: ProxyState, request: Incoming, api: Api) -> Response | RelayResponse:
    started = time.time()
    state.metrics.calls += 1
    try:
        raw = await request.body()
        body = _parse(raw, api)
        chat = to_chat_request(body) if api == "responses" else body
    except OpenAIError as exc:
        state.metrics.rejected += 1
        return _error(exc)
    context = call_context(request)
    call = Call(api=api, body=body, chat=chat, asked=Requested.of(body), context=context, started=started)
    if context is None:
        state.metrics.unattributed += 1
    else:
        call.span_id = state.span_id_for(context, request.headers, raw)
        call.key = (context.rollout_id, context.attempt_id)
        call.open = True
        state.writer.begin(call.key)  # from now on, a flush of this attempt waits for this call
    try:
        return await _forward(state, request, call)
    finally:
        if not call.streaming:
            state.drop(call)  # no-op once recorded; a stream's response settles it when it ends


async def _forward(state: ProxyState, request: Incoming, call: Call) -> Response | RelayResponse:
    try:
        sent = upstream_body(
            call.chat,
            "completions" if call.api == "completions" else "chat",
            await state.served_model(call.chat.get("model")),
        )
        response = await state.http().request(
            "POST", _UPSTREAM_PATH[call.api], dumps(sent), state.headers(request.headers)
        )
        if response.status_code != 200:
            state.metrics.upstream_errors += 1
            return Response(
                await response.read(),
                status_code=response.status_code,
                media_type=response.headers.get("content-type", _JSON),
            )
        if sent.get("stream"):
            call.streaming = True
            return RelayResponse(state, call, response)
        raw_answer = await response.read()
    except UpstreamUnreachable as exc:
        return _unreachable(state, exc)
    except TimeoutError:
        return _timed_out(state)
    if call.api != "responses" and call.asked.token_ids and call.asked.logprobs:  # nothing to hide from the client
        await state.record(call, lambda: _answer(raw_answer), streamed=False)
        return Response(raw_answer, media_type=response.headers.get("content-type", _JSON))
    try:
        data = loads(raw_answer)
    except ValueError:
        state.metrics.upstream_errors += 1
        return Response(
            error_body("upstream answered 200 with a body that is not JSON", kind="upstream_error"),
            status_code=502,
            media_type=_JSON,
        )
    capture = Capture.of_body(data)
    view = strip_for_client(data, call.asked)
    if call.api == "responses":
        view = responses_view(call, view, capture)
    content = dumps(view)  # serialized before recording: the span may be built on another thread
    await state.record(call, lambda: (view, capture), streamed=False)
    return Response(content, media_type=_JSON)


def _answer(raw: bytes) -> tuple[dict[str, Any], Capture]:
    """A passed-through answer, parsed for its span (raises if it is not a JSON object: the span is lost)."""
    data = loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"upstream answered 200 with a JSON {type(data).__name__}, not an object")
    return data, Capture.of_body(data)


async def _flush(state: ProxyState, body: Callable[[], Awaitable[bytes]]) -> Response:
    """``POST /agentgrad/flush``: its body read and checked, then :func:`flush_response`."""
    try:
        rollout_id, attempt_id, timeout = _flush_request(await body())
    except OpenAIError as exc:
        return _error(exc)
    return await flush_response(state, rollout_id, attempt_id, timeout)


async def flush_response(state: ProxyState, rollout_id: str, attempt_id: str, timeout: float) -> Response:
    """200 once every accepted call of the attempt is stored; 504 on timeout; 500 if spans were lost."""
    try:
        result = await state.writer.flushed(rollout_id, attempt_id, timeout)
    except FlushTimeout as exc:
        return Response(
            error_body(str(exc), kind="timeout_error", code="flush_timeout"), status_code=504, media_type=_JSON
        )
    except FlushError as exc:
        return Response(error_body(str(exc), kind="store_error", code="store_error"), status_code=500, media_type=_JSON)
    recorded = b"true" if result.recorded_calls else b"false"
    return Response(b'{"status":"stored","recorded_calls":' + recorded + b"}", media_type=_JSON)


async def _models(state: ProxyState, request: Request) -> Response:
    try:
        response = await state.http().request("GET", "/models", headers=state.headers(request.headers))
        content = await response.read()
    except UpstreamUnreachable as exc:
        return _unreachable(state, exc)
    except TimeoutError:
        return _timed_out(state)
    return Response(content, status_code=response.status_code, media_type=response.headers.get("content-type", _JSON))


def create_proxy_app(
    store: Store,
    upstream_url: str,
    *,
    model: str | None = None,
    upstream_api_key: str | None = None,
    token: str | None = None,
    allowed_hosts: HostCheck | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    upstream_timeout: float = 600.0,
    record_mode: RecordMode = "async",
    write_linger: float = 0.0,
) -> Starlette:
    """The proxy as an ASGI app (mount it, or serve it with :class:`LLMProxy`).

    Args:
        store: where LLM call spans go.
        upstream_url: the engine's OpenAI base URL, e.g. ``http://127.0.0.1:8000/v1``.
        model: the upstream model every request is sent to; None: keep a name the upstream
            serves, map any other to the first model its ``/models`` lists.
        upstream_api_key: sent upstream as ``Authorization: Bearer <key>``; default
            ``$AGENTGRAD_MODEL_TOKEN`` (a token-protected model server), else the client's own
            ``Authorization`` is passed on (never when the proxy has a ``token``: that one is ours).
        token: when set, every route but ``/health`` needs ``Authorization: Bearer <token>`` (the
            ``api_key`` of an OpenAI client); see :mod:`agentgrad.http.guard`.
        allowed_hosts: the ``Host`` names answered; None: any (:class:`LLMProxy` always sets them).
        max_body_bytes: larger request bodies are refused with 413.
        record_mode: ``"async"`` (default): spans are written behind the answer by a background
            writer, in batches; ``POST /agentgrad/flush`` waits until an attempt's calls are
            stored. ``"sync"``: each span is committed before the client has the complete answer.
        write_linger: ``async`` mode: seconds a span that comes alone waits for others before the
            store write (see :mod:`agentgrad.proxy.writer`). 0 (default): written at once, so spans
            show up promptly even where nobody flushes; the CLI waits 50 ms, as its runners flush.
    """
    if upstream_api_key is None:
        upstream_api_key = env_token(MODEL_TOKEN_ENV)
    state = ProxyState(
        store,
        upstream_url,
        model=model,
        upstream_api_key=upstream_api_key,
        forward_client_auth=token is None,
        upstream_timeout=upstream_timeout,
        record_mode=record_mode,
        write_linger=write_linger,
    )

    def endpoint(api: Api) -> Any:  # reached only by what the fast path leaves to Starlette
        async def run(request: Request) -> Response | RelayResponse:
            params = request.path_params
            return await _handle(
                state, Incoming(request.scope, request.receive, params.get("rollout_id"), params.get("attempt_id")), api
            )

        return run

    async def models(request: Request) -> Response:
        return await _models(state, request)

    async def metrics(request: Request) -> Response:
        return Response(json.dumps(state.metrics.as_dict()), media_type=_JSON)

    async def flush(request: Request) -> Response:
        return await _flush(state, request.body)

    async def health(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type=_JSON)

    async def not_found(request: Request, exc: Exception) -> Response:
        message = (
            f"no route {request.method} {request.url.path} (the proxy serves /v1/chat/completions, "
            "/v1/responses, /v1/completions and /v1/models)"
        )
        return Response(error_body(message), status_code=getattr(exc, "status_code", 404), media_type=_JSON)

    async def bug(request: Request, exc: Exception) -> Response:
        return _internal_error(exc)

    routes = [Route("/metrics", metrics), Route("/health", health), Route(FLUSH_PATH, flush, methods=["POST"])]
    for prefix in ("", ROLLOUT_PREFIX):
        routes += [Route(prefix + path, endpoint(api), methods=["POST"]) for path, api in API_ROUTES.items()]
        routes.append(Route(prefix + "/v1/models", models, methods=["GET"]))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.client = None  # a fresh client bound to this serving loop
        try:
            yield
        finally:
            if state.client is not None:
                await state.client.aclose()
            await asyncio.to_thread(state.writer.close)  # drain: every accepted span is written

    app = _ProxyApp(
        routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found, Exception: bug}
    )
    app.state.proxy = state
    app.gate = GuardMiddleware(
        app.dispatch, Guard(token=token, hosts=allowed_hosts, max_body_bytes=max_body_bytes), openai_refusal
    )
    return app


def _flush_request(raw: bytes) -> tuple[str, str, float]:
    """``(rollout_id, attempt_id, timeout)`` of a flush body; :class:`OpenAIError` naming what is wrong."""
    usage = (
        'flush needs a JSON body {"rollout_id": str, "attempt_id": str, '
        f'"timeout": seconds from 0 to {MAX_FLUSH_TIMEOUT:g}}}'
    )
    try:
        payload = parse_object(raw)
    except BadJson as exc:
        raise OpenAIError(f"{exc}; {usage}") from None
    rollout_id, attempt_id = payload.get("rollout_id"), payload.get("attempt_id")
    timeout = payload.get("timeout", 30.0)
    if not isinstance(rollout_id, str) or not isinstance(attempt_id, str):
        raise OpenAIError(usage, param="rollout_id" if not isinstance(rollout_id, str) else "attempt_id")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 <= timeout <= MAX_FLUSH_TIMEOUT:
        raise OpenAIError(usage, param="timeout")
    return rollout_id, attempt_id, float(timeout)


def _internal_error(exc: Exception) -> Response:
    """A bug's answer: logged with its traceback, and still an OpenAI-style body for the client."""
    log.error("unexpected error in the LLM proxy", exc_info=exc)
    return Response(
        error_body(f"internal error: {type(exc).__name__}: {exc}", kind="server_error"),
        status_code=500,
        media_type=_JSON,
    )


class _ProxyApp(Starlette):
    """Starlette behind the gate (:mod:`agentgrad.http.guard`), except that the API routes' POSTs go
    straight to their handler (see :mod:`.incoming`)."""

    gate: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await (self.gate or self.dispatch)(scope, receive, send)

    async def dispatch(self, scope: Any, receive: Any, send: Any) -> None:
        route = api_route(scope)
        if route is None and not is_flush(scope):
            await super().__call__(scope, receive, send)
            return
        response: Response | RelayResponse
        try:
            if route is None:
                response = await _flush(self.state.proxy, Incoming(scope, receive).body)
            else:
                api, rollout_id, attempt_id = route
                response = await _handle(self.state.proxy, Incoming(scope, receive, rollout_id, attempt_id), api)
        except Exception as exc:  # a bug: still JSON, as every other answer
            response = _internal_error(exc)
        await response(scope, receive, send)

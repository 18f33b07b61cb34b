"""Streamed calls: the upstream's server-sent events passed on event by event, accumulated for the span.

Time to first token is kept: each event goes to the client as soon as it is complete. The whole
answer is reassembled meanwhile (:class:`StreamAccumulator`), and recorded before the last event.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from agentgrad.http.jsonbody import dumps, loads
from agentgrad.proxy.capture import Capture, StreamAccumulator, strip_for_client
from agentgrad.proxy.responses import ResponsesStreamWriter, from_chat_completion

if TYPE_CHECKING:
    from agentgrad.http.upstream import UpstreamResponse
    from agentgrad.proxy.state import Call, ProxyState

_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


class RelayResponse:
    """The relayed stream, as an ASGI response.

    Whatever happens (even a client gone before the first byte), the call is released from the
    flush barrier and the upstream response closed. A client that goes away cancels the relay at
    once, which closes the upstream connection (the engine stops generating). One plain task
    watches for that: Starlette's ``StreamingResponse`` uses a task group, which costs ~50 µs a
    stream on the project machine and sends the first event a loop turn later.
    """

    def __init__(self, state: ProxyState, call: Call, upstream: UpstreamResponse) -> None:
        self._state, self._call, self._upstream = state, call, upstream

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        relaying = asyncio.current_task()
        assert relaying is not None  # an ASGI app is always called from a task
        ended = False

        def client_gone(_: asyncio.Future[None]) -> None:
            if not ended:
                relaying.cancel()

        watcher = asyncio.ensure_future(_disconnect(receive))
        watcher.add_done_callback(client_gone)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
            async for chunk in _relay(self._state, self._call, self._upstream):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not watcher.done() or watcher.cancelled():  # cancelled by someone else: not ours to absorb
                raise
            relaying.uncancel()  # the client went away: the stream just ends
        finally:
            ended = True
            watcher.cancel()
            self._state.drop(self._call)
            await self._upstream.aclose()


async def _disconnect(receive: Any) -> None:
    """Returns once the client is gone (or, for uvicorn, once the response is complete)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def responses_view(
    call: Call, completion: dict[str, Any], capture: Capture, writer: ResponsesStreamWriter | None = None
) -> dict[str, Any]:
    """A chat completion as the Responses-API object the client of a ``/v1/responses`` call sees."""
    view = writer.final_response(completion) if writer else from_chat_completion(call.body, completion)
    if call.asked.token_ids:
        view["prompt_token_ids"], view["token_ids"] = capture.prompt_token_ids, capture.completion_token_ids
    return view


def _sse_events(buffer: bytearray) -> list[bytes]:
    """Cut complete SSE events (blank-line separated) off the front of ``buffer``."""
    events: list[bytes] = []
    while True:
        end = buffer.find(b"\n\n")
        if end < 0:
            return events
        events.append(bytes(buffer[:end]))
        del buffer[: end + 2]


def _sse_data(event: bytes) -> bytes | None:
    lines = [line[5:].lstrip() for line in event.replace(b"\r", b"").split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


async def _relay(state: ProxyState, call: Call, response: UpstreamResponse) -> AsyncIterator[bytes]:
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
                    chunk = loads(data)
                except ValueError:
                    out += event + b"\n\n"  # not ours to judge: pass it on untouched
                    continue
                accumulator.add(chunk)
                if writer:
                    out += writer.chunk(chunk)
                elif chunk.get("choices") or call.asked.usage_chunk or "error" in chunk:
                    out += b"data: " + dumps(strip_for_client(chunk, call.asked)) + b"\n\n"
            if out:
                yield bytes(out)
        completion = accumulator.completion()
        if writer:
            view = responses_view(call, completion, accumulator.capture, writer)
        else:  # as the client saw it: no usage unless it asked for the usage chunk
            view = completion if call.asked.usage_chunk else {**completion, "usage": None}
        await state.record(call, lambda: (view, accumulator.capture), streamed=True)
        finished = True
        if writer:
            yield writer.finish(completion)
        elif saw_done:
            yield b"data: [DONE]\n\n"
    finally:
        if not finished:
            state.metrics.streams_aborted += 1
        await response.aclose()

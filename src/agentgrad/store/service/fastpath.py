"""uvicorn's HTTP protocol, tuned for the store service: one write per response, and store calls
answered straight from the HTTP parser.

One write per response. uvicorn writes a response's status line and headers as soon as the app
sends them, then the body in a second write. Over TCP with Nagle off that is two packets and two
wake-ups of the client for every store call; on a loopback or LAN the second round of kernel
work was about a third of the store server's time per request. Here writes made during one
event-loop step are held and handed to the transport together (``writelines``: one ``writev``,
no copy) at the end of the step.

Direct answers. For each request uvicorn builds an ASGI scope, a request-response cycle with its
own event and an asyncio task, then runs the app's middleware layers; on a store call that was
about two thirds of the server's CPU time (a bare httptools server answers in a fifth of it).
When the app offers a :class:`DirectAnswers` (the store service does), a request it accepts from
its method, URL and headers has its body collected here, and the app answers it synchronously in
the parser's callback — the same checks, store call and answer as through ASGI, without the
machinery. The app may still decline once it has read the body (a long poll, a write whose retry
is in flight): the request then takes uvicorn's ordinary path, as if it had just arrived. Only
requests that need nothing else of HTTP go direct: keep-alive, no ``Expect: 100-continue``, no
upgrade, and no earlier request still answering on the connection (pipelined requests queue as
uvicorn queues them).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from starlette.responses import Response
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from agentgrad.store.service.responses import error_response

log = logging.getLogger(__name__)

Headers = list[tuple[bytes, bytes]]


class DirectAnswers(Protocol):
    """What an ASGI app offers (as its ``direct`` attribute) to be answered from the parser."""

    def accepts(self, method: bytes, url: bytes, headers: Headers) -> Any:
        """A token for a request this app can answer directly once its body is in, else None."""
        ...

    def answer(self, accepted: Any, body: bytes) -> Response | None:
        """The response to an accepted request, or None to let it take the ASGI path."""
        ...


class _CoalescingTransport:
    """A transport whose writes are gathered until the current event-loop step ends."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def _flush(self) -> None:
        if self._pending:
            if not self._transport.is_closing():
                self._transport.writelines(self._pending)
            self._pending = []

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:  # everything else is the real transport's
        return getattr(self._transport, name)


class _Collecting:
    """A request accepted for a direct answer, while its body arrives."""

    __slots__ = ("accepted", "body")

    def __init__(self, accepted: Any) -> None:
        self.accepted = accepted
        self.body: list[bytes] = []


class StoreHttpProtocol(HttpToolsProtocol):
    """``uvicorn.Config(http=StoreHttpProtocol)``: httptools parsing, coalesced writes, and direct
    answers when the app (``config.app``) has a ``direct`` attribute (see the module docstring)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_CoalescingTransport(transport, asyncio.get_running_loop()))  # type: ignore[arg-type]
        self._direct: DirectAnswers | None = getattr(self.config.app, "direct", None)
        self._collecting: _Collecting | None = None

    def on_headers_complete(self) -> None:
        parser = self.parser
        if (
            self._direct is not None
            and (self.cycle is None or self.cycle.response_complete)
            and not self.expect_100_continue
            and parser.should_keep_alive()
            and not parser.should_upgrade()
        ):
            accepted = self._direct.accepts(parser.get_method(), self.url, self.headers)
            if accepted is not None:
                self._collecting = _Collecting(accepted)
                return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._collecting is not None:
            self._collecting.body.append(body)
        else:
            super().on_body(body)

    def on_message_complete(self) -> None:
        collecting = self._collecting
        if collecting is None:
            super().on_message_complete()
            return
        self._collecting = None
        body = b"".join(collecting.body)
        try:
            response = self._direct.answer(collecting.accepted, body)  # type: ignore[union-attr]
        except Exception as exc:  # a bug: raised from a parser callback it would become a 400
            log.exception("unexpected error answering a request directly")
            response = error_response(500, "internal_error", f"{type(exc).__name__}: {exc}")
        if response is None:  # declined: the ordinary path, as if the request had just arrived
            super().on_headers_complete()
            self.cycle.body = body  # type: ignore[assignment]  # uvicorn reads bytes as it reads bytearray
            super().on_message_complete()
            return
        head: list[bytes | memoryview] = [STATUS_LINE[response.status_code]]
        for name, value in (*self.server_state.default_headers, *response.raw_headers):
            head += (name, b": ", value, b"\r\n")
        head += (b"\r\n", response.body)
        self.transport.write(b"".join(head))
        self.on_response_complete()

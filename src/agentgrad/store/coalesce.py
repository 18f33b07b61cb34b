"""uvicorn's HTTP protocol with each response sent in one write instead of two.

uvicorn writes a response's status line and headers as soon as the app sends them, then the
body in a second write. Over TCP with Nagle off that is two packets and two wake-ups of the
client for every store call; on a loopback or LAN the second round of kernel work was about a
third of the store server's time per request. Here writes made during one event-loop step are
held and handed to the transport together (``writelines``: one ``writev``, no copy) at the end
of the step, which for a store call is the whole response.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


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


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """``uvicorn.Config(http=CoalescingHttpToolsProtocol)``: httptools parsing, coalesced writes."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_CoalescingTransport(transport, asyncio.get_running_loop()))  # type: ignore[arg-type]

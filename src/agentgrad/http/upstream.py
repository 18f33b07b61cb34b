"""A lean keep-alive HTTP/1.1 client for the proxy's upstream: asyncio protocols parsed by httptools.

Why not httpx: measured on the project machine, ``httpx.AsyncClient`` spends ~3–6 ms per request
on loopback, and the proxy's budget for its own overhead is 0.5 ms per call. Why not h11 on
asyncio streams (this module's previous version): h11 parses in pure Python, ~60 µs per
request/response cycle there against ~2 µs for httptools (llhttp, in C; installed with
``uvicorn[standard]``), and a stream costs a future and a buffer copy per read. The proxy needs
little: POST/GET with a body, keep-alive connection reuse, content-length and chunked responses
read whole (:meth:`UpstreamResponse.read`) or piece by piece (:meth:`UpstreamResponse.iter_raw`).
A pooled connection the upstream closed while idle is replaced by the rule of the synchronous
transport (:func:`agentgrad.http.transport.resend_once`): this is its asyncio twin.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools

from agentgrad.http.serve import header_lines
from agentgrad.http.transport import NoAnswer, resend_once

#: Body bytes buffered for a stream that is read slower than the upstream writes it; reading from
#: the socket pauses above this, so a slow client cannot make the proxy buffer a whole answer.
_HIGH_WATER = 1 << 20


class UpstreamUnreachable(ConnectionError):
    """The upstream could not be connected to, or dropped the connection before answering fully."""


class _Broken(Exception):
    """The connection ended, or sent what is not HTTP, before the response was complete."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection and the response of the request under way on it.

    httptools calls the ``on_*`` methods while :meth:`data_received` feeds it; the reader waits in
    :meth:`wait` until something it needs has arrived.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.start()

    def start(self) -> None:
        """Forget the previous response: a request is about to be sent."""
        self.status = 0
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.head_done = self.complete = self.reusable = self.paused = False
        self.answered = False  # whether any byte of the response arrived yet
        self.error: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None

    # ---- asyncio.Protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.complete:  # nothing asked for this (e.g. a 408 before an idle close): the connection is spoilt
            self.close()
            return
        self.answered = True
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self.error = _Broken(f"unparsable response: {exc!r}")
            self.close()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.head_done and not self.complete and self._ends_at_close():
            self.complete = True
        elif not self.complete and self.error is None:
            reason = f": {exc}" if exc else ""
            self.error = (
                _Broken(f"connection closed before the end of the response{reason}")
                if self.answered
                else NoAnswer(f"connection closed before any byte of the response{reason}")
            )
        self._wake()

    # ---- httptools callbacks ----------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.head_done = self.status >= 200  # a 1xx is followed by the real response

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and not self.paused:
            self.paused = True
            assert self.transport is not None  # bytes came through it
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self.status < 200:
            self.headers = {}
            return
        self.complete = True
        self.reusable = self.parser.should_keep_alive()

    # ---- the reading side -------------------------------------------------------------------------
    def _ends_at_close(self) -> bool:
        """A body with neither length nor chunked encoding is delimited by the connection's close."""
        return "content-length" not in self.headers and "transfer-encoding" not in self.headers

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, timeout: float) -> None:
        """Until more of the response arrived, or the connection ended; raises what went wrong
        (:class:`TimeoutError` after ``timeout`` seconds without news)."""
        if self.error is not None:
            raise self.error
        waiter = self._waiter = self.loop.create_future()
        timer = self.loop.call_later(timeout, _expire, waiter)  # ~10 µs a wait cheaper than asyncio.timeout
        try:
            await waiter
        finally:
            timer.cancel()
        if self.error is not None:
            raise self.error

    def take(self) -> bytes:
        """The body bytes that have arrived and were not taken yet."""
        chunks = self.chunks
        piece = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.chunks, self.buffered = [], 0
        if self.paused:
            self.paused = False
            assert self.transport is not None  # paused above, so connected
            self.transport.resume_reading()
        return piece

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class UpstreamResponse:
    """Status and headers at once; the body read whole (:meth:`read`) or piece by piece (:meth:`iter_raw`)."""

    def __init__(self, client: Upstream, connection: _Connection) -> None:
        self._client, self._connection = client, connection
        self.status_code = connection.status
        self.headers = connection.headers
        self._done = False

    async def iter_raw(self) -> AsyncIterator[bytes]:
        connection, timeout = self._connection, self._client.timeout
        while not self._done:
            if connection.chunks:
                yield connection.take()
            elif connection.complete:
                self._finish()
            else:
                await self._wait(timeout)

    async def read(self) -> bytes:
        connection, timeout, pieces = self._connection, self._client.timeout, []
        while not connection.complete:
            if connection.chunks:
                pieces.append(connection.take())  # keeps reading from pausing on a large body
            await self._wait(timeout)
        if connection.chunks:
            pieces.append(connection.take())
        self._finish()
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def _wait(self, timeout: float) -> None:
        try:
            await self._connection.wait(timeout)
        except (_Broken, NoAnswer) as exc:
            self._abandon()
            raise UpstreamUnreachable(f"{self._client.address} broke off its answer: {exc}") from exc
        except BaseException:  # timeout, cancellation: the rest of the answer would be on no one's request
            self._abandon()
            raise

    def _finish(self) -> None:
        self._done = True
        self._client._release(self._connection)

    def _abandon(self) -> None:
        if not self._done:
            self._done = True
            self._connection.close()

    async def aclose(self) -> None:
        """Stop reading; a connection with an unread body cannot be reused and is closed."""
        self._abandon()


class Upstream:
    """Requests to one base URL (``http(s)://host:port/prefix``) over pooled keep-alive connections."""

    def __init__(self, base_url: str, *, timeout: float = 600.0, connect_timeout: float = 10.0) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        self.address = f"{self.host}:{self.port}"
        self.prefix = parts.path.rstrip("/")
        self.authority = parts.netloc.rsplit("@", 1)[-1]
        self.timeout, self.connect_timeout = timeout, connect_timeout
        self._idle: list[_Connection] = []

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, connection = await loop.create_connection(
                    lambda: _Connection(loop),
                    self.host,
                    self.port,
                    ssl=ssl.create_default_context() if self.tls else None,
                )
        except (OSError, TimeoutError) as exc:
            raise UpstreamUnreachable(f"cannot connect to {self.address}: {exc or type(exc).__name__}") from exc
        return connection

    def _pooled(self) -> _Connection | None:
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed:  # the upstream may have closed it while idle
                return connection
        return None

    def _release(self, connection: _Connection) -> None:
        if connection.reusable and not connection.closed:
            self._idle.append(connection)
        else:
            connection.close()

    def _head(self, method: str, path: str, body: bytes, headers: dict[str, str] | None) -> bytes:
        head = f"{method} {self.prefix}{path} HTTP/1.1\r\nhost: {self.authority}\r\n" + header_lines(headers or {})
        if method != "GET" or body:
            head += f"content-length: {len(body)}\r\n"
        return (head + "\r\n").encode("latin-1")

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> UpstreamResponse:
        """Send a request and return once the status line and headers have arrived."""
        payload = self._head(method, path, body, headers) + body
        connection = self._pooled()
        reused = connection is not None
        while True:
            connection = connection or await self._connect()
            connection.start()
            assert connection.transport is not None  # pooled and new connections are connected
            connection.transport.write(payload)  # flow control not needed: the answer comes after it all
            try:
                while not connection.head_done:
                    await connection.wait(self.timeout)
            except (_Broken, NoAnswer) as exc:
                connection.close()
                if resend_once(reused, exc):  # closed by the upstream while idle: it never saw the request
                    connection, reused = None, False
                    continue
                raise UpstreamUnreachable(f"{self.address} dropped the connection: {exc}") from exc
            except BaseException:  # timeout, cancellation: the answer may still come, on no one's request
                connection.close()
                raise
            return UpstreamResponse(self, connection)

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop().close()

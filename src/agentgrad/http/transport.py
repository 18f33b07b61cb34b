"""The one synchronous HTTP transport of the package, and the lean HTTP/1.1 pool behind it.

Every blocking HTTP client of the package sends through a :class:`Transport`: the store client,
the runner's flush of the capture proxy, APO's critic and editor calls, the vLLM publisher and
launcher. :func:`transport_for` picks one for a URL: the lean :class:`ConnectionPool` (a
thread-safe pool of keep-alive TCP connections) for plain ``http://`` URLs, an ``httpx.Client``
(:class:`HttpxTransport`) for ``https`` URLs, proxies named by the environment and custom httpx
transports. Both raise :class:`OSError` when the server cannot be reached or breaks off its answer
(:class:`TimeoutError` when it is too slow), so callers handle failures one way;
:func:`request_json` is a one-off JSON request over either.

Why not httpx on the store's path: the store's calls are small JSON requests, and profiling showed
httpx spending ~0.4 ms of client CPU on each (URL merging, cookies, the h11 state machine, headers
and body in separate writes) — more than the server needed to answer. Here a request is one
``sendall`` and a response one header parse. It speaks just the HTTP/1.1 the service needs:
``Content-Length`` or chunked bodies, keep-alive and ``Connection: close``.

Errors are :class:`OSError` (refused, reset, timed out…) or :class:`ProtocolError`; the caller
decides whether to retry. A connection that failed mid-request is closed, never reused. The one
failure handled here is a pooled connection that the server closed while it sat idle: the server
never saw the request, so it is sent again at once on a new connection (:func:`resend_once`, the
rule the proxy's async :mod:`~agentgrad.http.upstream` client follows too).

System calls are the client's main cost on a loopback or LAN, so a call makes as few as it can:
sockets are blocking, with their time limits set in the kernel (``SO_RCVTIMEO``/``SO_SNDTIMEO``)
rather than by Python, which would ``poll`` before every ``send`` and ``recv``; and a connection
used moments ago is reused without first peeking whether the server closed it (a stale one is
caught anyway, as above). One request is then a ``send`` and, usually, one ``recv``.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import time
import urllib.parse
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from agentgrad._version import __version__
from agentgrad.http.serve import header_lines

if TYPE_CHECKING:
    import httpx

_MAX_HEAD = 64 * 1024
#: The most one read takes from a socket.
_RECV_SIZE = 256 * 1024
_NO_BODY_STATUS = (204, 304)
#: An idle connection younger than this is reused without peeking whether the server closed it.
_FRESH_SECONDS = 1.0
#: Kernel-enforced time limits (``struct timeval`` options); elsewhere Python's own, which poll.
_KERNEL_TIMEOUTS = sys.platform.startswith(("linux", "darwin", "freebsd"))


class ProtocolError(ConnectionError):
    """The peer answered something that is not an HTTP/1.1 response."""


class NoAnswer(ProtocolError):
    """The connection was closed or reset before any byte of the response arrived."""


def resend_once(reused: bool, error: BaseException) -> bool:
    """Whether a request that failed with ``error`` is sent again, once, on a new connection.

    The one retry both lean clients make (this pool and the proxy's async upstream): only when the
    connection came from the idle pool (``reused``) and ended before one byte of the answer
    (:class:`NoAnswer`). The server then closed it while it sat idle (its keep-alive timeout, a
    restart) and never saw the request, so sending it again is safe even for a non-idempotent
    POST. Any other failure (a fresh connection dropped, a timeout, an answer cut short or not
    HTTP) the server may have acted on: it goes to the caller, who knows whether a retry is safe.
    """
    return reused and isinstance(error, NoAnswer)


class Transport(Protocol):
    """Sends one request to the service it was made for; ``target`` is the path plus query.

    Returns (status, body); raises :class:`OSError` when the service could not be reached or
    broke off its answer (:class:`TimeoutError` when it was too slow).
    """

    def request(
        self,
        method: str,
        target: str,
        body: bytes | None = None,
        *,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> tuple[int, bytes]: ...

    def close(self) -> None: ...


class _Connection:
    """One socket plus the bytes read past the end of the previous response."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        # Reads land in this one buffer, allocated once: ``recv(256 KiB)`` would allocate a fresh
        # 256 KiB object per read, and whether malloc serves that from the heap or maps and unmaps
        # pages on every call depends on the process's allocation history (measured: +35 µs of
        # kernel time per call when it maps, in a client that had not imported httpx).
        self._scratch = memoryview(bytearray(_RECV_SIZE))
        self.idle_since = 0.0
        self.answered = False  # whether the current exchange received any byte yet
        self.timeout: float | None = None  # the time limit the socket has now

    def alive(self) -> bool:
        """True while the idle connection is still open: an idle HTTP/1.1 connection must have
        nothing to read, so EOF (the server closed it) or stray bytes both mean "drop it"."""
        try:
            if _KERNEL_TIMEOUTS:
                data = self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            else:
                self.sock.settimeout(0)
                data = self.sock.recv(1, socket.MSG_PEEK)
            return not data  # b"" is EOF; data is junk: both dead
        except BlockingIOError:
            return True
        except OSError:
            return False

    def _limit(self, timeout: float) -> None:
        """Give every following send and receive ``timeout`` seconds (a system call only when it
        changes)."""
        if timeout == self.timeout:
            return
        if _KERNEL_TIMEOUTS:
            self.sock.settimeout(None)
            seconds = int(timeout)
            micros = max(int((timeout - seconds) * 1e6), 0 if seconds else 1)  # 0 would mean "none"
            limit = struct.pack("ll", seconds, micros)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)
        else:
            self.sock.settimeout(timeout)
        self.timeout = timeout

    def exchange(self, request: bytes, timeout: float, head_only: bool) -> tuple[int, bytes, bool]:
        """Send ``request``; returns (status, body, whether the connection may be reused)."""
        self.answered = False
        self._limit(timeout)
        try:
            self.sock.sendall(request)
            return self._read_response(head_only)
        except (ConnectionResetError, BrokenPipeError) as exc:
            if self.answered:
                raise
            raise NoAnswer(f"connection reset before the response ({exc})") from exc
        except BlockingIOError as exc:  # a kernel time limit ran out
            raise TimeoutError(f"timed out after {timeout} s") from exc

    def _read_response(self, head_only: bool) -> tuple[int, bytes, bool]:
        status, headers = self._read_head()
        keep = headers.get(b"connection", b"").lower() != b"close"
        if head_only or status in _NO_BODY_STATUS or 100 <= status < 200:
            return status, b"", keep
        length = headers.get(b"content-length")
        if length is not None:
            if not length.isdigit():
                raise ProtocolError(f"bad Content-Length {length[:40]!r}")
            return status, self._read_exact(int(length)), keep
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            return status, self._read_chunked(), keep
        return status, self._read_to_eof(), False

    def _recv(self) -> int:
        """Read what the socket has into :attr:`buffer`; the count (0: the server closed it)."""
        n = self.sock.recv_into(self._scratch)
        self.buffer += self._scratch[:n]
        return n

    def _fill(self) -> None:
        if not self._recv():
            if not self.answered:
                raise NoAnswer("connection closed by the server before it answered")
            raise ProtocolError("connection closed by the server before the response was complete")
        self.answered = True

    def _read_line_block(self, end: bytes) -> bytes:
        """Bytes up to and including ``end`` (the head's blank line or a chunk-size line)."""
        start = 0
        while (found := self.buffer.find(end, start)) < 0:
            if len(self.buffer) > _MAX_HEAD:
                raise ProtocolError("response header too large")
            start = max(0, len(self.buffer) - len(end) + 1)
            self._fill()
        block = bytes(self.buffer[: found + len(end)])
        del self.buffer[: found + len(end)]
        return block

    def _read_head(self) -> tuple[int, dict[bytes, bytes]]:
        lines = self._read_line_block(b"\r\n\r\n").split(b"\r\n")
        status_line = lines[0]
        if not status_line.startswith(b"HTTP/1.") or len(status_line) < 12 or not status_line[9:12].isdigit():
            raise ProtocolError(f"not an HTTP/1.x response: {status_line[:60]!r}")
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if not status_line.startswith(b"HTTP/1.1"):  # HTTP/1.0 closes unless told otherwise
            headers.setdefault(b"connection", b"close")
        return int(status_line[9:12]), headers

    def _read_exact(self, n: int) -> bytes:
        while len(self.buffer) < n:
            self._fill()
        body = bytes(self.buffer[:n])
        del self.buffer[:n]
        return body

    def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size_line = self._read_line_block(b"\r\n").split(b";")[0].strip()
            try:
                size = int(size_line, 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size {size_line[:40]!r}") from None
            if size == 0:
                while self._read_line_block(b"\r\n") != b"\r\n":  # trailer fields, then the end
                    pass
                return b"".join(parts)
            parts.append(self._read_exact(size))
            if self._read_exact(2) != b"\r\n":
                raise ProtocolError("chunk not followed by CRLF")

    def _read_to_eof(self) -> bytes:
        while self._recv():
            pass
        body = bytes(self.buffer)
        self.buffer.clear()
        return body

    def close(self) -> None:
        self.sock.close()


class ConnectionPool:
    """Keep-alive connections to one ``host:port``, shared by every thread of a client.

    Each request takes an idle connection (or opens one), uses it alone, and puts it back when
    the response allows; so N threads use at most N connections at once.

    Args:
        headers: sent with every request (``Authorization``, ``Content-Type``…).
        prefix: path every request target is under (a service mounted below ``/``).
        max_idle: idle connections kept; more are closed when returned.
        idle_expiry: idle connections older than this are closed instead of reused.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        headers: dict[str, str] | None = None,
        prefix: str = "",
        max_idle: int = 64,
        idle_expiry: float = 60.0,
    ) -> None:
        self.address = (host, port)
        self.prefix = prefix
        authority = f"[{host}]" if ":" in host else host
        fixed = {"Host": f"{authority}:{port}", "User-Agent": f"agentgrad/{__version__}", **(headers or {})}
        self._fixed = header_lines(fixed)
        self.max_idle = max_idle
        self.idle_expiry = idle_expiry
        self._idle: deque[_Connection] = deque()  # append/pop are atomic: no lock needed
        self._closed = False

    def request(
        self,
        method: str,
        target: str,
        body: bytes | None = None,
        *,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> tuple[int, bytes]:
        """Send one request and return (status, body); ``target`` is the path plus query."""
        head = f"{method} {self.prefix}{target} HTTP/1.1\r\n{self._fixed}"
        if body is not None or method in ("POST", "PUT", "PATCH"):
            head += f"Content-Length: {len(body or b'')}\r\n"
        if headers:
            head += header_lines(headers)
        request = (head + "\r\n").encode("latin-1") + (body or b"")
        head_only = method == "HEAD"
        conn = self._idle_connection()
        reused = conn is not None
        while True:
            try:
                return self._exchange(conn or self._connect(timeout), request, timeout, head_only)
            except OSError as exc:
                if not resend_once(reused, exc):
                    raise
                conn, reused = None, False  # the server closed it while idle; it never saw the request

    def _exchange(self, conn: _Connection, request: bytes, timeout: float, head_only: bool) -> tuple[int, bytes]:
        try:
            status, content, keep = conn.exchange(request, timeout, head_only)
        except BaseException:
            conn.close()
            raise
        if keep and not conn.buffer and not self._closed and len(self._idle) < self.max_idle:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.close()
        return status, content

    def _idle_connection(self) -> _Connection | None:
        now = time.monotonic()
        while True:
            try:
                conn = self._idle.pop()  # most recently used first: the likeliest to be open
            except IndexError:
                return None
            idle = now - conn.idle_since
            if idle < _FRESH_SECONDS or (idle < self.idle_expiry and conn.alive()):
                return conn
            conn.close()

    def _connect(self, timeout: float) -> _Connection:
        sock = socket.create_connection(self.address, timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _Connection(sock)

    def close(self) -> None:
        """Close the idle connections; ones in use close when their request ends."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()


class HttpxTransport:
    """The httpx route, for what the lean pool does not do: TLS, proxies, custom httpx transports.

    httpx is imported here, on first use: most processes only ever talk plain HTTP.
    """

    def __init__(
        self,
        url: str,
        *,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        import httpx

        self._transport_error, self._timeout_error = httpx.TransportError, httpx.TimeoutException
        self._http = httpx.Client(
            base_url=url,
            headers=headers,
            timeout=timeout,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64, keepalive_expiry=60),
            transport=transport,
        )

    def request(
        self,
        method: str,
        target: str,
        body: bytes | None = None,
        *,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> tuple[int, bytes]:
        try:
            response = self._http.request(method, target, content=body, headers=headers, timeout=timeout)
        except self._timeout_error as exc:
            raise TimeoutError(f"{type(exc).__name__}: {exc}") from exc
        except self._transport_error as exc:
            raise ConnectionError(f"{type(exc).__name__}: {exc}") from exc
        return response.status_code, response.content

    def close(self) -> None:
        self._http.close()


def transport_for(
    url: str,
    *,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
    httpx_transport: httpx.BaseTransport | None = None,
) -> Transport:
    """A transport for requests under ``url`` (its path prefixes every target).

    The lean pool where it applies (plain http, no proxy in the environment, no custom httpx
    transport); httpx otherwise, so TLS and proxy settings behave as httpx users expect.
    """
    parts = urllib.parse.urlsplit(url)
    if httpx_transport is None and parts.scheme == "http" and parts.hostname and not env_proxy(url):
        return ConnectionPool(parts.hostname, parts.port or 80, headers=headers, prefix=parts.path.rstrip("/"))
    return HttpxTransport(url, headers=headers, timeout=timeout, transport=httpx_transport)


def env_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url``'s scheme (``HTTP_PROXY``, ``HTTPS_PROXY``,
    ``ALL_PROXY``), or None. ``NO_PROXY`` is left to httpx, which the caller then goes through."""
    import urllib.request  # lazy: it imports a good part of the standard library

    proxies = urllib.request.getproxies()
    return proxies.get(urllib.parse.urlsplit(url).scheme) or proxies.get("all")


@dataclass(frozen=True)
class Reply:
    """What :func:`request_json` got back: the status and the raw body."""

    status: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body parsed as JSON (:class:`ValueError` when it is not)."""
        return json.loads(self.body)


def request_json(
    method: str, url: str, payload: Any = None, *, headers: dict[str, str] | None = None, timeout: float = 30.0
) -> Reply:
    """One request to the full ``url`` with ``payload`` (if any) sent as JSON, on a connection of
    its own; for the occasional call (an LLM critic, a vLLM admin endpoint, a health check).

    Raises :class:`OSError` when the server cannot be reached or breaks off its answer
    (:class:`TimeoutError` past ``timeout``); an HTTP error status is returned, not raised.
    """
    parts = urllib.parse.urlsplit(url)
    root = urllib.parse.urlunsplit((parts.scheme, parts.netloc, "", "", ""))
    target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    sent = dict(headers or {})
    body = None
    if payload is not None:
        body = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        sent.setdefault("Content-Type", "application/json")
    transport = transport_for(root, timeout=timeout)
    try:
        return Reply(*transport.request(method, target, body, headers=sent or None, timeout=timeout))
    finally:
        transport.close()

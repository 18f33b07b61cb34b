"""A lean HTTP/1.1 client for the store service: a thread-safe pool of keep-alive TCP connections.

Why not httpx on this path: the store's calls are small JSON requests, and profiling showed httpx
spending ~0.4 ms of client CPU on each (URL merging, cookies, the h11 state machine, headers and
body in separate writes) — more than the server needed to answer. Here a request is one
``sendall`` and a response one header parse. It speaks just the HTTP/1.1 the service needs:
``Content-Length`` or chunked bodies, keep-alive and ``Connection: close``. ``https`` URLs,
proxies and custom transports keep using httpx (see :mod:`agentgrad.store.client`).

Errors are :class:`OSError` (refused, reset, timed out…) or :class:`ProtocolError`; the caller
decides whether to retry. A connection that failed mid-request is closed, never reused. The one
failure handled here is a pooled connection that the server closed while it sat idle: the server
never saw the request, so it is sent again at once on a new connection.

System calls are the client's main cost on a loopback or LAN, so a call makes as few as it can:
sockets are blocking, with their time limits set in the kernel (``SO_RCVTIMEO``/``SO_SNDTIMEO``)
rather than by Python, which would ``poll`` before every ``send`` and ``recv``; and a connection
used moments ago is reused without first peeking whether the server closed it (a stale one is
caught anyway, as above). One request is then a ``send`` and, usually, one ``recv``.
"""

from __future__ import annotations

import socket
import struct
import sys
import time
from collections import deque

from agentgrad._version import __version__
from agentgrad.http.serve import header_lines

_MAX_HEAD = 64 * 1024
_NO_BODY_STATUS = (204, 304)
#: An idle connection younger than this is reused without peeking whether the server closed it.
_FRESH_SECONDS = 1.0
#: Kernel-enforced time limits (``struct timeval`` options); elsewhere Python's own, which poll.
_KERNEL_TIMEOUTS = sys.platform.startswith(("linux", "darwin", "freebsd"))


class ProtocolError(ConnectionError):
    """The peer answered something that is not an HTTP/1.1 response."""


class _NoAnswer(ProtocolError):
    """The connection was closed or reset before any byte of the response arrived."""


class _Connection:
    """One socket plus the bytes read past the end of the previous response."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
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
            raise _NoAnswer(f"connection reset before the response ({exc})") from exc
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

    def _fill(self) -> None:
        chunk = self.sock.recv(256 * 1024)
        if not chunk:
            if not self.answered:
                raise _NoAnswer("connection closed by the server before it answered")
            raise ProtocolError("connection closed by the server before the response was complete")
        self.answered = True
        self.buffer += chunk

    def _read_line_block(self, end: bytes) -> bytes:
        """Bytes up to and including ``end`` (the head's blank line or a chunk-size line)."""
        start = 0
        while (found := self.buffer.find(end, start)) < 0:
            if len(self.buffer) > _MAX_HEAD:
                raise ProtocolError("response header too large")
            start = max(0, len(self.buffer) - len(end) + 1)
            self._fill()
        block = bytes(self.buffer[:found + len(end)])
        del self.buffer[:found + len(end)]
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
        parts = []
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
        while True:
            chunk = self.sock.recv(256 * 1024)
            if not chunk:
                body = bytes(self.buffer)
                self.buffer.clear()
                return body
            self.buffer += chunk

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

    def __init__(self, host: str, port: int, *, headers: dict[str, str] | None = None, prefix: str = "",
                 max_idle: int = 64, idle_expiry: float = 60.0) -> None:
        self.address = (host, port)
        self.prefix = prefix
        authority = f"[{host}]" if ":" in host else host
        fixed = {"Host": f"{authority}:{port}", "User-Agent": f"agentgrad-store-client/{__version__}", **(headers or {})}
        self._fixed = header_lines(fixed)
        self.max_idle = max_idle
        self.idle_expiry = idle_expiry
        self._idle: deque[_Connection] = deque()  # append/pop are atomic: no lock needed
        self._closed = False

    def request(self, method: str, target: str, body: bytes | None = None, *, headers: dict[str, str] | None = None,
                timeout: float = 30.0) -> tuple[int, bytes]:
        """Send one request and return (status, body); ``target`` is the path plus query."""
        head = f"{method} {self.prefix}{target} HTTP/1.1\r\n{self._fixed}"
        if body is not None or method in ("POST", "PUT", "PATCH"):
            head += f"Content-Length: {len(body or b'')}\r\n"
        if headers:
            head += header_lines(headers)
        request = (head + "\r\n").encode("latin-1") + (body or b"")
        head_only = method == "HEAD"
        idle = self._idle_connection()
        if idle is not None:
            try:
                return self._exchange(idle, request, timeout, head_only)
            except _NoAnswer:
                pass  # the server closed it while we reused it; it never saw the request
        return self._exchange(self._connect(timeout), request, timeout, head_only)

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

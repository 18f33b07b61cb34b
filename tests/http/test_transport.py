"""The sync transport: the lean HTTP/1.1 pool against scripted servers (framing, keep-alive, failures,
the stale-connection rule), the httpx route and the choice between them."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from agentgrad.http.transport import (
    ConnectionPool,
    HttpxTransport,
    NoAnswer,
    ProtocolError,
    request_json,
    resend_once,
    transport_for,
)

Handler = Callable[[socket.socket, bytes], bool]  # answers one request; False closes the connection


class _ScriptedServer:
    """Accepts connections and answers every request with ``handler``; records request heads."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.heads: list[bytes] = []
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buffer = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buffer:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                while len(buffer) < length:
                    buffer += conn.recv(65536)
                body, buffer = buffer[:length], buffer[length:]
                self.heads.append(head)
                if not self.handler(conn, body):
                    return

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def serve() -> Iterator[Callable[[Handler], _ScriptedServer]]:
    servers: list[_ScriptedServer] = []

    def start(handler: Handler) -> _ScriptedServer:
        servers.append(_ScriptedServer(handler))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _answer(raw: bytes, keep: bool = True) -> Handler:
    def handler(conn: socket.socket, body: bytes) -> bool:
        conn.sendall(raw)
        return keep

    return handler


def test_content_length_body_and_keep_alive(serve):
    server = serve(
        lambda conn, body: (conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)), True)[
            1
        ]
    )
    pool = ConnectionPool("127.0.0.1", server.port, headers={"Authorization": "Bearer t"})
    for i in range(3):
        assert pool.request("POST", "/echo", b'{"i":%d}' % i) == (200, b'{"i":%d}' % i)
    assert server.connections == 1, "one kept-alive connection"
    assert server.heads[0].startswith(b"POST /echo HTTP/1.1\r\n")
    assert b"Authorization: Bearer t" in server.heads[0] and b"Content-Length: 7" in server.heads[0]


def test_a_header_with_a_line_break_is_refused_before_sending(serve):
    server = serve(_answer(b"HTTP/1.1 204 No Content\r\n\r\n"))
    with pytest.raises(ValueError, match="line break"):
        ConnectionPool("127.0.0.1", server.port, headers={"Authorization": "Bearer t\r\nX-Evil: 1"})
    pool = ConnectionPool("127.0.0.1", server.port)
    with pytest.raises(ValueError, match="line break"):
        pool.request("POST", "/m", b"{}", headers={"Idempotency-Key": "k\nX-Evil: 1"})
    assert server.connections == 0, "nothing was sent"


def test_chunked_body_and_a_204(serve):
    server = serve(
        _answer(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n"
        )
    )
    pool = ConnectionPool("127.0.0.1", server.port)
    assert pool.request("GET", "/c") == (200, b"hello world")
    assert pool.request("GET", "/c") == (200, b"hello world"), "the connection stays usable"
    empty = serve(_answer(b"HTTP/1.1 204 No Content\r\n\r\n"))
    assert ConnectionPool("127.0.0.1", empty.port).request("POST", "/m", b"{}") == (204, b"")


def test_connection_close_and_http10_open_a_new_connection(serve):
    server = serve(_answer(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", keep=False))
    pool = ConnectionPool("127.0.0.1", server.port)
    assert pool.request("GET", "/a") == pool.request("GET", "/a") == (200, b"ok")
    assert server.connections == 2
    to_eof = serve(_answer(b"HTTP/1.0 200 OK\r\n\r\nuntil the end", keep=False))
    assert ConnectionPool("127.0.0.1", to_eof.port).request("GET", "/b") == (200, b"until the end")


def test_an_idle_connection_the_server_closed_is_replaced(serve):
    served = []

    def once_per_connection(conn: socket.socket, body: bytes) -> bool:
        served.append(1)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        return False  # closes without saying so: the pooled connection goes stale

    server = serve(once_per_connection)
    pool = ConnectionPool("127.0.0.1", server.port)
    for _ in range(3):
        assert pool.request("GET", "/x") == (200, b"ok")
    assert server.connections == 3 and len(served) == 3


def test_only_a_reused_connection_closed_before_answering_is_resent_and_only_once(serve):
    answered = []

    def drops_every_request(conn: socket.socket, body: bytes) -> bool:
        return False  # closes without a byte: a fresh connection's request may have been seen

    fresh = serve(drops_every_request)
    with pytest.raises(NoAnswer):
        ConnectionPool("127.0.0.1", fresh.port).request("POST", "/x", b"{}")
    assert fresh.connections == 1 and len(fresh.heads) == 1, "never resent on a fresh connection"

    def answers_once_then_drops(conn: socket.socket, body: bytes) -> bool:
        if not answered:
            answered.append(1)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            return False  # the pooled connection goes stale
        return False

    flaky = serve(answers_once_then_drops)
    pool = ConnectionPool("127.0.0.1", flaky.port)
    assert pool.request("GET", "/a") == (200, b"ok")
    with pytest.raises(NoAnswer):
        pool.request("POST", "/b", b"{}")
    assert flaky.connections == 2, "the stale pooled one, then one fresh try that is not resent"
    assert [head.split(b" ")[1] for head in flaky.heads] == [b"/a", b"/b"]


def test_resend_once_is_the_stale_pooled_connection_rule():
    assert resend_once(True, NoAnswer("closed"))
    assert not resend_once(False, NoAnswer("closed"))
    assert not resend_once(True, TimeoutError())
    assert not resend_once(True, ProtocolError("cut short"))


def test_transport_for_picks_the_lean_pool_only_for_plain_http(monkeypatch):
    import httpx

    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert isinstance(transport_for("http://127.0.0.1:1"), ConnectionPool)
    assert isinstance(transport_for("https://store.test"), HttpxTransport)
    assert isinstance(transport_for("http://127.0.0.1:1", httpx_transport=httpx.HTTPTransport()), HttpxTransport)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.test:3128")
    assert isinstance(transport_for("http://127.0.0.1:1"), HttpxTransport)


def test_request_json_sends_json_and_returns_any_status(serve):
    server = serve(_answer(b'HTTP/1.1 418 I\'m a teapot\r\nContent-Length: 11\r\n\r\n{"tea": 1}\n'))
    reply = request_json(
        "POST",
        f"http://127.0.0.1:{server.port}/v1/brew?x=1",
        {"cup": "é"},
        headers={"Authorization": "Bearer t"},
        timeout=5,
    )
    assert reply.status == 418 and reply.json() == {"tea": 1} and reply.text == '{"tea": 1}\n'
    head = server.heads[0].decode()
    assert head.startswith("POST /v1/brew?x=1 HTTP/1.1\r\n")
    assert "Content-Type: application/json" in head and "Authorization: Bearer t" in head
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    with pytest.raises(OSError):
        request_json("GET", f"http://127.0.0.1:{port}/health", timeout=1)


def test_the_httpx_route_raises_oserrors_too():
    import httpx

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused (test)", request=request)

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow (test)", request=request)

    with pytest.raises(ConnectionError, match="refused"):
        HttpxTransport("https://x.test", transport=httpx.MockTransport(refuse)).request("GET", "/")
    with pytest.raises(TimeoutError, match="slow"):
        HttpxTransport("https://x.test", transport=httpx.MockTransport(slow)).request("GET", "/")
    ok = HttpxTransport(
        "https://x.test/base",
        transport=httpx.MockTransport(lambda request: httpx.Response(201, content=request.url.path.encode())),
    )
    assert ok.request("POST", "/v1/a", b"{}") == (201, b"/base/v1/a")


def test_truncated_and_garbage_answers_raise_and_are_not_reused(serve):
    truncated = serve(_answer(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", keep=False))
    with pytest.raises(ProtocolError, match="before the response was complete"):
        ConnectionPool("127.0.0.1", truncated.port).request("GET", "/t")
    garbage = serve(_answer(b"SSH-2.0-OpenSSH\r\n\r\n"))
    pool = ConnectionPool("127.0.0.1", garbage.port)
    with pytest.raises(ProtocolError, match="not an HTTP/1.x response"):
        pool.request("GET", "/g")
    assert not pool._idle


def test_timeouts_and_refusals_are_oserrors(serve):
    silent = serve(lambda conn, body: (threading.Event().wait(2), False)[1])
    with pytest.raises(TimeoutError):
        ConnectionPool("127.0.0.1", silent.port).request("GET", "/slow", timeout=0.2)
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    with pytest.raises(ConnectionRefusedError):
        ConnectionPool("127.0.0.1", port).request("GET", "/", timeout=1)


def test_prefix_is_put_before_every_target(serve):
    server = serve(_answer(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"))
    ConnectionPool("127.0.0.1", server.port, prefix="/store").request("GET", "/v1/workers?x=1")
    assert server.heads[0].startswith(b"GET /store/v1/workers?x=1 HTTP/1.1\r\n")

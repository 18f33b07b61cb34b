"""The proxy's upstream client against a raw HTTP/1.1 server: framings, keep-alive, broken answers, timeouts."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from agentgrad.http.upstream import Upstream, UpstreamUnreachable

BIG = b"x" * (3 << 20)
ANSWERS = {
    b"/v1/length": b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 5\r\n\r\nhello",
    b"/v1/chunked": b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
    b"/v1/continue": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\nX-Kind: b\r\n\r\nok",
    b"/v1/until-close": b"HTTP/1.1 200 OK\r\n\r\nto the end",
    b"/v1/close": b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok",
    b"/v1/cut": b"HTTP/1.1 200 OK\r\ncontent-length: 20\r\n\r\nshort",
    b"/v1/garbage": b"NOT HTTP\r\n\r\n",
    b"/v1/big": b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(BIG) + BIG,
}
CLOSES_AFTER = {b"/v1/until-close", b"/v1/close", b"/v1/cut", b"/v1/garbage"}


def serve(test: Callable[[Upstream, list[bytes]], Awaitable[None]], timeout: float = 5.0) -> None:
    """Run ``test(client, requests_seen)`` against a scripted server: ``/v1/hang`` never answers,
    ``/v1/flaky`` drops the connection the first time (as a keep-alive timeout can) and answers then."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                seen.append(head)
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                path = head.split(b" ")[1]
                if path == b"/v1/hang":
                    await asyncio.sleep(30)
                if path == b"/v1/flaky":
                    if seen.count(head) == 1:
                        break
                    path = b"/v1/length"
                writer.write(ANSWERS[path])
                await writer.drain()
                if path in CLOSES_AFTER:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        client = Upstream(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", timeout=timeout)
        try:
            await test(client, seen)
        finally:
            await client.aclose()
            server.close()

    asyncio.run(main())


def test_framings_and_keep_alive() -> None:
    async def test(client: Upstream, seen: list[bytes]) -> None:
        answers = []
        for path in ("/length", "/length", "/chunked", "/continue"):
            response = await client.request("POST", path, b'{"a": 1}', {"content-type": "application/json"})
            answers.append((response.status_code, await response.read()))
        assert answers == [(200, b"hello"), (200, b"hello"), (200, b"abcde"), (201, b"ok")]
        assert response.headers == {"content-length": "2", "x-kind": "b"}  # the 100's headers are not mixed in
        assert len(client._idle) == 1  # one connection served all four
        assert seen[0].startswith(b"POST /v1/length HTTP/1.1\r\nhost: 127.0.0.1:")
        assert b"content-length: 8\r\n" in seen[0]
        response = await client.request("GET", "/chunked")
        assert [piece async for piece in response.iter_raw()] == [b"abcde"] and len(client._idle) == 1

    serve(test)


def test_answers_ending_with_the_connection() -> None:
    async def test(client: Upstream, seen: list[bytes]) -> None:
        for path, body in (("/until-close", b"to the end"), ("/close", b"ok")):
            response = await client.request("POST", path, b"x")
            assert await response.read() == body
            assert not client._idle  # not reusable
        response = await client.request("POST", "/length", b"x")  # on a new connection
        assert await response.read() == b"hello"

    serve(test)


def test_broken_answers_are_unreachable_upstreams() -> None:
    async def test(client: Upstream, seen: list[bytes]) -> None:
        response = await client.request("POST", "/cut", b"x")
        with pytest.raises(UpstreamUnreachable, match="broke off"):
            await response.read()
        with pytest.raises(UpstreamUnreachable, match="unparsable"):
            await client.request("POST", "/garbage", b"x")
        assert len(seen) == 2  # asked for once: an answer that is not HTTP is never resent

    serve(test)


def test_a_pooled_connection_dropped_by_the_upstream_is_retried_on_a_new_one() -> None:
    async def test(client: Upstream, seen: list[bytes]) -> None:
        await (await client.request("POST", "/length", b"x")).read()
        (pooled,) = client._idle
        assert await (await client.request("POST", "/flaky", b"x")).read() == b"hello"
        assert pooled.closed and client._idle and client._idle[0] is not pooled

    serve(test)


def test_a_fresh_connection_dropped_before_answering_is_not_resent() -> None:
    async def test(client: Upstream, seen: list[bytes]) -> None:
        with pytest.raises(UpstreamUnreachable, match="dropped the connection"):
            await client.request("POST", "/flaky", b"x")  # nothing pooled: the upstream may have seen it
        assert len(seen) == 1

    serve(test)


def test_unreachable_and_silent_upstreams() -> None:
    async def test(client: Upstream, seen: list[bytes]) -> None:
        with pytest.raises(TimeoutError):
            await client.request("POST", "/hang", b"x")
        with pytest.raises(UpstreamUnreachable, match="cannot connect"):
            await Upstream("http://127.0.0.1:1/v1").request("GET", "/models")

    serve(test, timeout=0.2)


def test_a_slow_reader_pauses_the_socket_instead_of_buffering_everything() -> None:
    async def test(client: Upstream, seen: list[bytes]) -> None:
        response = await client.request("GET", "/big")
        most, total = 0, 0
        async for piece in response.iter_raw():
            total += len(piece)
            await asyncio.sleep(0.005)
            most = max(most, response._connection.buffered)
        assert total == len(BIG) and most < 2 << 20
        assert len(await (await client.request("GET", "/big")).read()) == len(BIG)

    serve(test)

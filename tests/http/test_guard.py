"""The gate of every server (``agentgrad.http.guard``) and the safe JSON body parser, piece by piece;
the servers' wiring is tested over real HTTP in tests/proxy, tests/inference and tests/store."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from agentgrad.http.guard import (
    ALLOWED_HOSTS_ENV,
    Guard,
    GuardMiddleware,
    HostCheck,
    bearer_matches,
    is_loopback,
    warn_if_exposed,
)
from agentgrad.http.jsonbody import MAX_DEPTH, BadJson, parse_object

JSON = {b"content-type": b"application/json"}


# ---- hosts ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header", ["localhost", "localhost:8400", "127.0.0.1:1", "[::1]:8000", "LOCALHOST.", "[::1]", "myserver.example:9"]
)
def test_loopback_names_and_the_bound_host_are_allowed(monkeypatch, header: str) -> None:
    monkeypatch.delenv(ALLOWED_HOSTS_ENV, raising=False)
    assert HostCheck.for_bind("myserver.example").allows(header)


@pytest.mark.parametrize(
    "header",
    [
        "attacker.example",
        "attacker.example:8400",
        "127.0.0.1.attacker.example",
        "localhost.attacker.example",
        "10.0.0.7:80",
        "",
    ],
)
def test_other_names_are_refused(monkeypatch, header: str) -> None:
    monkeypatch.delenv(ALLOWED_HOSTS_ENV, raising=False)
    assert not HostCheck.for_bind("127.0.0.1").allows(header)


def test_extra_names_come_from_the_flag_and_the_environment(monkeypatch) -> None:
    monkeypatch.setenv(ALLOWED_HOSTS_ENV, "gpu-box.lan, proxy.internal")
    check = HostCheck.for_bind("127.0.0.1", ["train.example"])
    assert all(check.allows(h) for h in ("gpu-box.lan:8000", "proxy.internal", "train.example"))
    assert not check.allows("other.lan")
    assert HostCheck(["*"]).allows("anything.example")


def test_a_wildcard_bind_takes_ip_literals_and_the_host_name_but_no_other_name(monkeypatch) -> None:
    import socket

    monkeypatch.delenv(ALLOWED_HOSTS_ENV, raising=False)
    check = HostCheck.for_bind("0.0.0.0")
    assert check.allows("10.1.2.3:8400") and check.allows("[fe80::1]:80") and check.allows(socket.gethostname())
    assert not check.allows("attacker.example")


def test_a_request_without_host_is_not_a_rebinding() -> None:
    assert HostCheck.for_bind("127.0.0.1").allows(None)  # HTTP/1.0 clients; browsers always send one


# ---- the gate's checks --------------------------------------------------------------------------


def test_refusals_in_order_host_token_size_type(monkeypatch) -> None:
    monkeypatch.delenv(ALLOWED_HOSTS_ENV, raising=False)
    guard = Guard(token="t0k", hosts=HostCheck.for_bind("127.0.0.1"), max_body_bytes=100)
    ok = {b"host": b"127.0.0.1:1", b"authorization": b"Bearer t0k", b"content-length": b"2", **JSON}
    assert guard.refusal("/v1/chat/completions", ok) is None
    assert guard.refusal("/v1/x", {**ok, b"host": b"evil.example"}).status == 421
    refused = guard.refusal("/v1/x", {**ok, b"authorization": b"Bearer nope"})
    assert refused.status == 401 and refused.headers == {"WWW-Authenticate": "Bearer"} and "wrong" in refused.message
    assert "missing" in guard.refusal("/v1/x", {k: v for k, v in ok.items() if k != b"authorization"}).message
    assert guard.refusal("/health", {b"host": b"localhost"}) is None  # open without the token
    assert guard.refusal("/v1/x", {**ok, b"content-length": b"101"}).status == 413
    assert guard.refusal("/v1/x", {**ok, b"content-length": b"1e3"}).status == 400
    for kind in (b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data; boundary=x"):
        assert guard.refusal("/v1/x", {**ok, b"content-type": kind}).status == 415
    no_type = {k: v for k, v in ok.items() if k != b"content-type"}
    assert guard.refusal("/v1/x", no_type).status == 415  # a Blob body from a page has no type either
    assert guard.refusal("/v1/x", {**no_type, b"content-length": b"0"}) is None  # no body, nothing to type
    assert guard.refusal("/v1/x", {**ok, b"content-type": b"Application/JSON; charset=utf-8"}) is None


def test_bearer_matches_only_the_exact_token() -> None:
    assert bearer_matches(b"Bearer abc", "abc")
    assert not any(bearer_matches(v, "abc") for v in (b"Bearer abcd", b"bearer abc", b"abc", b""))


def test_loopback_and_the_exposure_warning(caplog) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("127.8.0.1") and is_loopback("[::1]") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1") and not is_loopback("box.lan")
    with caplog.at_level(logging.WARNING, logger="agentgrad.http.guard"):
        warn_if_exposed("the proxy", "127.0.0.1", None)
        warn_if_exposed("the proxy", "0.0.0.0", "t")
        assert not caplog.records
        warn_if_exposed("the proxy", "0.0.0.0", None)
    assert "the proxy listens on 0.0.0.0 without a token" in caplog.text


# ---- the middleware -----------------------------------------------------------------------------


class _Echo:
    """An ASGI app answering with the body it read (and counting its calls)."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += 1
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})


def _call(app: Any, headers: dict[bytes, bytes], chunks: list[bytes]) -> tuple[int, bytes, dict[bytes, bytes]]:
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/x", "headers": list(headers.items())}
    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:]), dict(sent[0]["headers"])


def test_middleware_refuses_before_the_app_runs_and_renders_json() -> None:
    echo = _Echo()
    app = GuardMiddleware(echo, Guard(token="t", max_body_bytes=10))
    status, body, headers = _call(app, {b"content-length": b"2", **JSON}, [b"{}"])
    assert status == 401 and json.loads(body)["error"] == "unauthorized" and headers[b"www-authenticate"] == b"Bearer"
    assert headers[b"content-type"] == b"application/json" and echo.calls == 0


def test_middleware_counts_a_chunked_body_and_replays_it_whole() -> None:
    echo = _Echo()
    app = GuardMiddleware(echo, Guard(max_body_bytes=10))
    chunked = {b"transfer-encoding": b"chunked", **JSON}
    assert _call(app, chunked, [b'{"a":', b"1}"])[:2] == (200, b'{"a":1}')
    status, body, _ = _call(app, chunked, [b'{"a":"', b"x" * 20, b'"}'])
    assert status == 413 and "limit of 10 bytes" in json.loads(body)["message"] and echo.calls == 1


# ---- JSON bodies --------------------------------------------------------------------------------


def test_parse_object_takes_ordinary_bodies() -> None:
    body = {"messages": [{"role": "user", "content": "caf\u00e9 \U0001f600"}], "n": 1, "nested": [[[{"a": [1]}]]]}
    escaped = json.dumps(body).encode()  # ensure_ascii: the emoji travels as a surrogate *pair*
    assert b"\\ud83d" in escaped and parse_object(escaped) == body
    deep_but_allowed = b'{"a":' + b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1) + b"}"
    parse_object(deep_but_allowed)
    parse_object(json.dumps({"many": [[] for _ in range(MAX_DEPTH * 3)]}).encode())  # wide, not deep
    assert parse_object(b'{"content": "NaN and Infinity are words"}')["content"].startswith("NaN")


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b'{"a": "\\ud800"}', "surrogate"),
        (b'{"a": ["ok", {"b": "x\\udfff"}]}', "surrogate"),
        (b'{"\\udc00": 1}', "surrogate"),
        (b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested"),
        (b'{"a":' + b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1) + b"}", "nested"),
        (b"[1]", "object"),
        (b'{"temperature": NaN}', "NaN"),
        (b'{"a": [1, -Infinity]}', "-Infinity"),
        (b"{nope", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
def test_parse_object_refuses_what_would_fail_later(raw: bytes, why: str) -> None:
    with pytest.raises(BadJson, match=why):
        parse_object(raw)

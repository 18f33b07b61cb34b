"""The gate in front of every server of the package (store service, capture proxy, model server,
dashboard): one home for the checks a request passes before any handler reads it.

* **Host** (:class:`HostCheck`): the ``Host`` header must name the server — a loopback name, the
  address it is bound to, or a name allowed with ``--allowed-host`` / ``$AGENTGRAD_ALLOWED_HOSTS``.
  A web page that re-points its own domain at 127.0.0.1 (DNS rebinding) sends its domain as the
  Host, so it is refused with 421 even where no token is set.
* **Token**: with a token configured, ``Authorization: Bearer <token>`` (what OpenAI clients send
  for their ``api_key``) on every path but the open ones (``/health``); 401 otherwise.
* **Content type**: a request with a body must declare one of the server's types (JSON); 415
  otherwise. ``text/plain``, form types and an absent type are exactly what a browser sends
  cross-site without asking the server first (a CORS preflight), so refusing them means no web
  page can make a browser POST to a local server behind the user's back.
* **Body size**: a declared ``Content-Length`` beyond the limit gets 413 before a byte is read; a
  chunked body is counted as it arrives (:class:`GuardMiddleware`).

Each server renders a :class:`Refusal` in its own error format (OpenAI-style for the proxy and the
model server, the store's ``{error, message}`` elsewhere). The environment variables of the tokens
live here too, so servers and the clients that call them (runners, publishers) name them once.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: The capture proxy's bearer token, when none is passed: ``agentgrad proxy`` serves with it, and
#: runners send it (their flush calls, and the ``api_key`` of the LLM resources they point at it).
PROXY_TOKEN_ENV = "AGENTGRAD_PROXY_TOKEN"
#: The model server's bearer token: ``agentgrad serve-model`` serves with it; the proxy (upstream
#: calls) and the weight publishers send it.
MODEL_TOKEN_ENV = "AGENTGRAD_MODEL_TOKEN"
#: Extra ``Host`` names every server accepts, comma-separated (beside loopback and its bind address).
ALLOWED_HOSTS_ENV = "AGENTGRAD_ALLOWED_HOSTS"

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
JSON_TYPES: tuple[str, ...] = ("application/json",)
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})

log = logging.getLogger(__name__)


def env_token(name: str) -> str | None:
    """The token in environment variable ``name`` (None when unset or empty)."""
    return os.environ.get(name) or None


def bearer_matches(authorization: bytes, token: str) -> bool:
    """Whether an ``Authorization`` header value is ``Bearer <token>`` (constant-time)."""
    return hmac.compare_digest(authorization, f"Bearer {token}".encode())


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps a server reachable from this machine only."""
    host = _normalise(host)
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_if_exposed(what: str, host: str, token: str | None, logger: logging.Logger = log) -> None:
    """Log a warning when ``what`` binds beyond loopback with no token: anyone who can reach the
    address can use it (swap weights, write spans, read and change the store)."""
    if token is None and not is_loopback(host):
        logger.warning(
            "%s listens on %s without a token: anyone who can reach it can use it "
            "(set one with --token or its environment variable)",
            what,
            host,
        )


def _normalise(host: str) -> str:
    host = host.strip().lower().rstrip(".")
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _host_of(header: str) -> str:
    """The name in a ``Host`` header (port and IPv6 brackets removed)."""
    header = header.strip()
    if header.startswith("["):
        return _normalise(header[: header.find("]") + 1])
    return _normalise(header.rsplit(":", 1)[0] if header.count(":") == 1 else header)


class HostCheck:
    """The ``Host`` names a server answers to; ``"*"`` among them lets every name in."""

    def __init__(self, names: Iterable[str], *, any_ip: bool = False) -> None:
        self.names = frozenset(_normalise(n) for n in names if n.strip())
        self.any_ip = any_ip  # an IP literal names no domain, so it cannot come from DNS rebinding

    @classmethod
    def for_bind(cls, host: str, extra: Iterable[str] = ()) -> HostCheck:
        """Loopback names, ``host`` itself, ``extra`` and ``$AGENTGRAD_ALLOWED_HOSTS``.

        A wildcard bind (``0.0.0.0``, ``::``) also takes any IP address and this machine's host
        name; other names (a DNS name of the machine) must be listed.
        """
        names = set(LOOPBACK_NAMES) | set(extra)
        names |= {n for n in os.environ.get(ALLOWED_HOSTS_ENV, "").split(",") if n.strip()}
        wildcard = _normalise(host) in _WILDCARDS
        names.add(socket.gethostname() if wildcard else host)
        return cls(names, any_ip=wildcard)

    def allows(self, header: str | None) -> bool:
        """Whether a request with this ``Host`` header (None: absent, as in HTTP/1.0) is for us."""
        if header is None or "*" in self.names:
            return True  # browsers always send one: a request without it is not a rebinding
        name = _host_of(header)
        if name in self.names:
            return True
        if self.any_ip:
            try:
                ipaddress.ip_address(name)
                return True
            except ValueError:
                return False
        return False

    def __str__(self) -> str:
        return ", ".join(sorted(self.names)) + (" and any IP address" if self.any_ip else "")


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused before its handler runs: HTTP status, a machine-readable code,
    a message for people, and headers to send (``WWW-Authenticate`` on 401)."""

    status: int
    code: str
    message: str
    headers: dict[str, str] = field(default_factory=dict)


def json_refusal(refusal: Refusal) -> bytes:
    """``{"error": code, "message": ...}``: the store service's error shape, the default rendering."""
    return json.dumps({"error": refusal.code, "message": refusal.message}).encode()


class Guard:
    """The checks of the module doc, in order: host, token, declared size, content type.

    Args:
        token: when set, every path but the open ones needs ``Authorization: Bearer <token>``.
        hosts: the allowed ``Host`` names; None: any (an app embedded by its caller, e.g. in a
            test client; every server started by the package passes :meth:`HostCheck.for_bind`).
        max_body_bytes: larger bodies get 413.
        content_types: media types a body may have; None: any (the server checks them itself).
        open_path: paths served without the token (default: ``/health``).
    """

    def __init__(
        self,
        *,
        token: str | None = None,
        hosts: HostCheck | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        content_types: Iterable[str] | None = JSON_TYPES,
        open_path: Callable[[str], bool] = lambda path: path == "/health",
    ) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be at least 1, got {max_body_bytes}")
        self.token = token or None
        self.hosts = hosts
        self.max_body_bytes = max_body_bytes
        self.content_types = frozenset(content_types) if content_types is not None else None
        self.open_path = open_path

    def refusal(self, path: str, headers: Mapping[bytes, bytes]) -> Refusal | None:
        """The refusal of a request by its path and headers (lowercase names), or None."""
        raw_host = headers.get(b"host")
        host = None if raw_host is None else raw_host.decode("latin-1")
        if self.hosts is not None and not self.hosts.allows(host):
            return Refusal(
                421,
                "host_not_allowed",
                f"Host {host!r} is not a name of this server (allowed: {self.hosts}); "
                f"add it with --allowed-host or ${ALLOWED_HOSTS_ENV}",
            )
        if self.token is not None and not self.open_path(path):
            given = headers.get(b"authorization", b"")
            if not bearer_matches(given, self.token):
                return Refusal(
                    401,
                    "unauthorized",
                    f"{'wrong' if given else 'missing'} bearer token: send 'Authorization: Bearer <token>'",
                    {"WWW-Authenticate": "Bearer"},
                )
        length = headers.get(b"content-length")
        if length is not None:
            if not length.isdigit():
                return Refusal(400, "invalid_input", "Content-Length is not a number")
            if int(length) > self.max_body_bytes:
                return self.too_large()
        has_body = (length is not None and int(length) > 0) or b"transfer-encoding" in headers
        if has_body and self.content_types is not None:
            declared = headers.get(b"content-type", b"").decode("latin-1").split(";", 1)[0].strip().lower()
            if declared not in self.content_types:
                return Refusal(
                    415,
                    "unsupported_media_type",
                    f"Content-Type {declared or '(none)'!r} is not accepted: send "
                    f"{' or '.join(sorted(self.content_types))}",
                )
        return None

    def too_large(self) -> Refusal:
        return Refusal(413, "payload_too_large", f"request body exceeds the limit of {self.max_body_bytes} bytes")


class GuardMiddleware:
    """Pure-ASGI middleware applying a :class:`Guard` to every HTTP request of ``app``.

    A body sent without ``Content-Length`` (chunked) is read here, up to the limit, and handed
    on whole; a declared one is left to the app (the server stops it at the declared length).
    ``render`` turns a refusal into the server's error body (JSON).
    """

    def __init__(self, app: Any, guard: Guard, render: Callable[[Refusal], bytes] = json_refusal) -> None:
        self.app, self.guard, self.render = app, guard, render

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        refusal = self.guard.refusal(scope["path"], headers)
        if refusal is None and b"content-length" not in headers and b"transfer-encoding" in headers:
            receive, refusal = await self._read_whole(receive)
        if refusal is not None:
            await self.send_refusal(refusal, send)
            return
        await self.app(scope, receive, send)

    async def send_refusal(self, refusal: Refusal, send: Any) -> None:
        body = self.render(refusal)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in refusal.headers.items()]
        await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _read_whole(self, receive: Any) -> tuple[Any, Refusal | None]:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # a disconnect: the app sees it
                first = message
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.guard.max_body_bytes:
                return receive, self.guard.too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                first = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
                break
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return first
            return await receive()

        return replay, None

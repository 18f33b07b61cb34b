""":class:`LLMProxy`: the capture proxy served by uvicorn, in a background thread or in the foreground."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from agentgrad.http.guard import HostCheck, warn_if_exposed
from agentgrad.http.serve import http_url, listening_socket, serve_in_thread, serve_until_signal
from agentgrad.proxy.app import create_proxy_app
from agentgrad.proxy.hooks import rollout_endpoint
from agentgrad.proxy.metrics import ProxyMetrics

if TYPE_CHECKING:
    import uvicorn

    from agentgrad.store.protocol import Store

log = logging.getLogger(__name__)


def uvicorn_server(app: Any) -> uvicorn.Server:
    """A quiet uvicorn server for ``app`` (no access log: the proxy is on every LLM call), to run on
    a socket of :func:`~agentgrad.http.serve.listening_socket`."""
    import uvicorn  # lazy: only a serving process needs it

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=5)
    return uvicorn.Server(config)


class LLMProxy:
    """The OpenAI-compatible capture proxy in front of ``upstream_url``, recording into ``store``.

    ``start()`` serves it from a daemon thread (embedded use: tests, ``Trainer``) and returns the
    OpenAI base URL; ``run()`` serves it in the foreground until SIGTERM/SIGINT (the CLI).
    Extra keyword arguments go to :func:`create_proxy_app` (e.g. ``record_mode="sync"``,
    ``token="…"``: clients then send it as their ``api_key``).

    Requests must name the proxy in their ``Host`` header: a loopback name, ``host``, one of
    ``allowed_hosts`` or of ``$AGENTGRAD_ALLOWED_HOSTS`` (:class:`~agentgrad.http.guard.HostCheck`).
    Binding beyond loopback without a token logs a warning.

    Spans are written behind the answers (``record_mode="async"``): call :meth:`flush` (or
    ``POST /agentgrad/flush``) before relying on an attempt's calls being in the store.
    """

    def __init__(
        self,
        store: Store,
        upstream_url: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        allowed_hosts: Iterable[str] = (),
        **options: Any,
    ) -> None:
        self.store = store
        self.upstream_url = upstream_url
        self.host, self.port = host, port
        self._token = options.get("token")
        self.app = create_proxy_app(
            store, upstream_url, allowed_hosts=HostCheck.for_bind(host, allowed_hosts), **options
        )
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None

    @property
    def metrics(self) -> ProxyMetrics:
        """Live counters (calls, recorded, unattributed, missing token ids…)."""
        return self.app.state.proxy.metrics

    @property
    def url(self) -> str:
        """The proxy's root URL (``http://host:port``); valid once bound or started."""
        return http_url(self.host, self.port)

    @property
    def base_url(self) -> str:
        """The OpenAI base URL of the proxy without a rollout prefix (``…/v1``)."""
        return self.url + "/v1"

    def flush(self, rollout_id: str, attempt_id: str, timeout: float | None = 30.0) -> bool:
        """Block until every call of the attempt the proxy has accepted is stored. Returns whether
        the proxy recorded a call of it (False: none, or too many attempts ago to remember).

        Raises :class:`~agentgrad.proxy.writer.FlushTimeout` (calls still in flight or queued after
        ``timeout``) or :class:`~agentgrad.proxy.writer.FlushError` (spans lost after retries).
        """
        return self.app.state.proxy.writer.flush(rollout_id, attempt_id, timeout).recorded_calls

    async def flushed(self, rollout_id: str, attempt_id: str, timeout: float | None = 30.0) -> bool:
        """:meth:`flush` for an event loop (any loop, not only the proxy's): it awaits the span
        writer instead of blocking a thread."""
        return (await self.app.state.proxy.writer.flushed(rollout_id, attempt_id, timeout)).recorded_calls

    def endpoint_for(self, rollout_id: str, attempt_id: str) -> str:
        """The OpenAI base URL that attributes calls to one attempt."""
        return rollout_endpoint(self.url, rollout_id, attempt_id)

    def _take_socket(self) -> socket.socket:
        self.bind()
        sock, self._socket = self._socket, None
        return sock  # type: ignore[return-value]

    def start(self, timeout: float = 30.0) -> str:
        """Serve from a background thread; returns the OpenAI base URL (``http://127.0.0.1:PORT/v1``)."""
        if self._thread is None:
            self._server = uvicorn_server(self.app)
            self._thread = serve_in_thread(
                self._server, self._take_socket(), name="agentgrad-llm-proxy", timeout=timeout
            )
            log.info("LLM proxy listening on %s, forwarding to %s", self.url, self.upstream_url)
        return self.base_url

    def bind(self) -> str:
        """Bind the listening socket now (resolving port 0); returns the OpenAI base URL."""
        if self._socket is None:
            warn_if_exposed("the LLM proxy", self.host, self._token, log)
            sock = listening_socket(self.host, self.port)
            self.port = sock.getsockname()[1]
            self._socket = sock
        return self.base_url

    def run(self) -> None:
        """Serve in the foreground until SIGTERM/SIGINT, then return normally (after draining the
        span writer), so the caller can close the store and exit 0
        (:func:`~agentgrad.http.serve.serve_until_signal`)."""
        self._server = uvicorn_server(self.app)
        try:
            serve_until_signal(self._server, self._take_socket())
        finally:
            self.app.state.proxy.writer.close()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and wait for the thread (in-flight calls get a few seconds to finish), then
        drain the span writer: every span accepted before the stop is written."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        self._server = self._thread = None
        self.app.state.proxy.writer.close()  # the lifespan drains it too; this covers a stuck shutdown

    def __enter__(self) -> LLMProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

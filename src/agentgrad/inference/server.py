"""Run the model server from a background thread (for the embedded demo, notebooks and tests) or
in the foreground until SIGTERM/SIGINT (``agentgrad serve-model``)."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agentgrad.http.guard import DEFAULT_MAX_BODY_BYTES, HostCheck, warn_if_exposed
from agentgrad.http.serve import http_url, listening_socket, serve_in_thread, serve_until_signal
from agentgrad.inference.engine import Engine


class ModelServer:
    """Serve an engine (or a model directory) over HTTP on ``host:port``.

    ``port=0`` binds a free port. ``start()`` serves from a background thread and returns the
    OpenAI base URL (``http://127.0.0.1:PORT/v1``); ``stop()`` shuts uvicorn down, and closes the
    engine when the server created it. ``bind()`` then ``run()`` serve in the foreground instead.

    ``token``: every route but ``/health`` then needs ``Authorization: Bearer <token>`` (clients'
    ``api_key``; ``$AGENTGRAD_MODEL_TOKEN`` for the proxy and the weight publishers). Requests must
    name the server in their ``Host`` header: a loopback name, ``host``, one of ``allowed_hosts``
    or of ``$AGENTGRAD_ALLOWED_HOSTS``. Binding beyond loopback without a token logs a warning.
    """

    def __init__(
        self,
        engine_or_model_dir: Engine | str | Path,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        served_model_name: str | None = None,
        token: str | None = None,
        allowed_hosts: Iterable[str] = (),
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        **engine_kwargs: Any,
    ) -> None:
        if isinstance(engine_or_model_dir, (str, Path)):
            self.engine, self._owns_engine = Engine(engine_or_model_dir, **engine_kwargs), True
        else:  # an Engine, or another engine with its surface (the Tinker sampler)
            self.engine, self._owns_engine = engine_or_model_dir, False
        self.host, self.port = host, port
        self.served_model_name = served_model_name
        self.token = token or None
        self.allowed_hosts = HostCheck.for_bind(host, allowed_hosts)
        self.max_body_bytes = max_body_bytes
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self.base_url: str | None = None

    def bind(self) -> str:
        """Bind the listening socket now (resolving port 0); returns the OpenAI base URL."""
        if self._socket is None:
            warn_if_exposed("the model server", self.host, self.token, logging.getLogger(__name__))
            self._socket = listening_socket(self.host, self.port)
            self.port = self._socket.getsockname()[1]
            self.base_url = http_url(self.host, self.port) + "/v1"
        return self.base_url  # type: ignore[return-value]

    def _uvicorn(self) -> Any:
        import uvicorn

        from agentgrad.inference.app import create_app

        app = create_app(
            self.engine,
            served_model_name=self.served_model_name,
            token=self.token,
            allowed_hosts=self.allowed_hosts,
            max_body_bytes=self.max_body_bytes,
        )
        return uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=5))

    def _take_socket(self) -> socket.socket:
        self.bind()
        sock, self._socket = self._socket, None
        return sock  # type: ignore[return-value]

    def start(self, timeout: float = 30.0) -> str:
        """Start serving; returns the base URL once the server accepts connections."""
        url = self.bind()
        self._server = self._uvicorn()
        self._thread = serve_in_thread(
            self._server, self._take_socket(), name="agentgrad-model-server", timeout=timeout
        )
        return url

    def run(self) -> None:
        """Serve in the foreground until SIGTERM/SIGINT, then return normally (the engine stays
        open unless the server created it: see :meth:`stop`)."""
        self.bind()
        self._server = self._uvicorn()
        try:
            serve_until_signal(self._server, self._take_socket())
        finally:
            self._server = None

    def stop(self) -> None:
        """Stop serving (idempotent)."""
        if self._server is not None:
            self._server.should_exit = True
            if self._thread is not None:
                self._thread.join(timeout=15)
            self._server = self._thread = None
        if self._socket is not None:  # bound, never served
            self._socket.close()
            self._socket = None
        if self._owns_engine:
            self.engine.close()

    def __enter__(self) -> ModelServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

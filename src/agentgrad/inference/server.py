"""Run the model server in a background thread (for the embedded demo, notebooks and tests)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from agentgrad.http.serve import listening_socket
from agentgrad.inference.engine import Engine


class ModelServer:
    """Serve an engine (or a model directory) over HTTP on ``host:port`` from a background thread.

    ``port=0`` binds a free port. ``start()`` returns the OpenAI base URL
    (``http://127.0.0.1:PORT/v1``); ``stop()`` shuts uvicorn down, and closes the engine when the
    server created it.
    """

    def __init__(self, engine_or_model_dir: Engine | str | Path, host: str = "127.0.0.1", port: int = 0,
                 *, served_model_name: str | None = None, **engine_kwargs: Any) -> None:
        if isinstance(engine_or_model_dir, Engine):
            self.engine, self._owns_engine = engine_or_model_dir, False
        else:
            self.engine, self._owns_engine = Engine(engine_or_model_dir, **engine_kwargs), True
        self.host, self.port = host, port
        self.served_model_name = served_model_name
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.base_url: str | None = None

    def start(self, timeout: float = 30.0) -> str:
        """Start serving; returns the base URL once the server accepts connections."""
        import uvicorn

        from agentgrad.inference.app import create_app

        app = create_app(self.engine, served_model_name=self.served_model_name)
        sock = listening_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=5)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name="agentgrad-model-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"model server failed to start on {self.host}:{self.port}")
            time.sleep(0.02)
        self.base_url = f"http://{self.host}:{self.port}/v1"
        return self.base_url

    def stop(self) -> None:
        """Stop serving (idempotent)."""
        if self._server is not None:
            self._server.should_exit = True
            if self._thread is not None:
                self._thread.join(timeout=15)
            self._server = None
        if self._owns_engine:
            self.engine.close()

    def __enter__(self) -> ModelServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

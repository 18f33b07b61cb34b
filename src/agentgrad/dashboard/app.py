"""The dashboard on its own: a read-only FastAPI app over a store, and a blocking ``serve``."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import RedirectResponse

from agentgrad.dashboard.router import create_router
from agentgrad.http.guard import Guard, GuardMiddleware, HostCheck, warn_if_exposed
from agentgrad.http.serve import http_url, listening_socket, serve_until_signal
from agentgrad.store.protocol import Store

log = logging.getLogger(__name__)


def dashboard_router(
    store: Store, token: str | None = None, *, prefix: str = "/dashboard", **router_options: Any
) -> APIRouter:
    """The dashboard under ``prefix``, with ``/`` redirecting to it, as one router to include.

    The store service takes it through ``create_app(extra_routers=...)`` (``agentgrad store serve``
    composes the two). The dashboard checks the token itself (bearer header or the ``?token=``
    browser login), so an app with its own bearer-only gate must let ``/`` and ``prefix`` through.
    """
    router = APIRouter()
    router.include_router(create_router(store, token, prefix=prefix, **router_options))

    @router.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse(f"{prefix}/rollouts")

    return router


def create_app(store: Store, *, token: str | None = None, prefix: str = "/dashboard", **router_options: Any) -> FastAPI:
    """An app serving only the dashboard (no store API)."""
    app = FastAPI(title="AgentGrad dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(dashboard_router(store, token, prefix=prefix, **router_options))
    return app


def serve(
    store_url: str,
    host: str = "127.0.0.1",
    port: int = 8766,
    token: str | None = None,
    *,
    log_level: str = "warning",
    allowed_hosts: Sequence[str] = (),
    tokenizers: Mapping[str, str] | None = None,
) -> None:
    """Open the store at ``store_url`` read-only and serve the dashboard until SIGTERM/SIGINT, to
    requests naming it in their ``Host`` (loopback, ``host``, ``allowed_hosts``; see
    :mod:`agentgrad.http.guard`). ``tokenizers``: as :func:`create_router`'s."""
    import uvicorn

    from agentgrad.store import open_store

    store = open_store(store_url, watchdog=False, existing=True)
    try:
        app = GuardMiddleware(
            create_app(store, token=token, tokenizers=tokenizers), Guard(hosts=HostCheck.for_bind(host, allowed_hosts))
        )
        warn_if_exposed("the dashboard", host, token, log)
        sock = listening_socket(host, port)  # bound here so that --port 0 reports the port it got
        url = http_url(host, sock.getsockname()[1]) + "/dashboard/"
        log.info("dashboard for %s at %s (auth %s)", store_url, url, "on" if token else "off")
        print(
            f"AgentGrad dashboard for {store_url} at {url} (token {'required' if token else 'off'}; Ctrl-C to stop)",
            flush=True,
        )
        server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, access_log=False, timeout_graceful_shutdown=5))
        serve_until_signal(server, sock)  # then the store is closed, and the process exits 0
    finally:
        store.close()
    log.info("dashboard stopped")

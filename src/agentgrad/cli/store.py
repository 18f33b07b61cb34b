"""``agentgrad store serve``: the store service, with the dashboard mounted beside its API.

``agentgrad store serve --backend runs/store.db --port 8765 --token T`` serves a store
to runners and trainers on other machines, logs the URL it listens on, and shuts down cleanly
(closing the store) on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import logging

from agentgrad.cli.serving import add_guard_arguments, token_of
from agentgrad.store import TOKEN_ENV


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register ``store serve`` on the top-level parser's subparsers."""
    store = subparsers.add_parser("store", help="the store service")
    commands = store.add_subparsers(dest="store_command", required=True)
    serve = commands.add_parser("serve", help="serve a store over HTTP (REST API, OTLP ingestion, metrics)")
    serve.add_argument(
        "--backend",
        default="agentgrad-store.db",
        help="memory | path/to/file.db | sqlite:///abs/path.db | postgresql://user@host/db | redis://host:6379/0 "
        "(default: %(default)s)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: %(default)s)")
    serve.add_argument("--port", type=int, default=8765, help="0 picks a free port (default: %(default)s)")
    add_guard_arguments(serve, TOKEN_ENV)
    serve.add_argument("--max-body-mb", type=float, default=32.0, help="largest request body (default: %(default)s)")
    serve.add_argument(
        "--cors-origin",
        action="append",
        default=None,
        dest="cors_origins",
        help="allow browser calls from this origin (repeatable; CORS is off by default)",
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.set_defaults(func=serve_command)


def serve_command(args: argparse.Namespace) -> int:
    from agentgrad.dashboard.app import dashboard_router  # FastAPI is only imported when serving
    from agentgrad.store.service.server import serve

    # The CLI configured logging at WARNING already (a second basicConfig is a no-op): the service
    # logs the URL it listens on at INFO.
    logging.getLogger("agentgrad").setLevel(args.log_level.upper())
    token = token_of(args, TOKEN_ENV)  # serve() warns when it binds beyond loopback without one
    serve(
        args.backend,
        args.host,
        args.port,
        token,
        max_body_bytes=int(args.max_body_mb * 1024 * 1024),
        cors_origins=args.cors_origins,
        log_level=args.log_level,
        extra_routers=lambda store: [dashboard_router(store, token)],
        allowed_hosts=args.allowed_hosts,
    )
    return 0

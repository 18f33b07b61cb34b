"""``agentgrad dashboard``: serve the web dashboard for a store."""

from __future__ import annotations

import argparse
import os
from typing import Any

TOKEN_ENV = "AGENTGRAD_TOKEN"


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from agentgrad.dashboard.app import serve  # lazy: FastAPI/Jinja2 only when serving

    serve(args.store, args.host, args.port, args.token or os.environ.get(TOKEN_ENV) or None,
          log_level="info" if args.verbose else "warning")
    return 0


def add_commands(subparsers: Any) -> None:
    """Register ``agentgrad dashboard`` on the main CLI's sub-command parsers."""
    parser = subparsers.add_parser(
        "dashboard", help="serve the web dashboard for a store",
        description="Serve the read-only web dashboard for a store (rollouts, spans, training curves, "
        "resources, runners). Stops cleanly on SIGTERM/SIGINT.",
    )
    parser.add_argument("--store", required=True, help="store URL (sqlite:///path/to/file.db, postgresql://…)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8766, help="port to listen on (0 picks a free one)")
    parser.add_argument("--token", default=None,
                        help=f"require this token to see any data (default: ${TOKEN_ENV}; off when unset)")
    parser.set_defaults(func=_cmd_dashboard)

"""``agentgrad dashboard``: serve the web dashboard for a store."""

from __future__ import annotations

import argparse
from typing import Any

from agentgrad.cli.serving import add_guard_arguments, token_of
from agentgrad.store import TOKEN_ENV

#: The dashboard's first name for the same token, still read (docs/dashboard.md shows it), and
#: first, so a setup that gave the dashboard a token of its own keeps it.
LEGACY_TOKEN_ENV = "AGENTGRAD_TOKEN"


def _token(args: argparse.Namespace) -> str | None:
    """``--token``, else ``$AGENTGRAD_TOKEN``, else the store service's ``$AGENTGRAD_STORE_TOKEN``:
    one token guards a store's data over HTTP, whether the dashboard runs alone or is mounted by
    ``agentgrad store serve``."""
    return token_of(args, LEGACY_TOKEN_ENV, TOKEN_ENV)


def parse_tokenizers(values: list[str]) -> dict[str, str]:
    """``--tokenizer`` values as ``create_router``'s ``tokenizers``: ``MODEL=PATH`` for one model
    (as LLM-call spans name it), a bare ``PATH`` for any model (``"*"``)."""
    tokenizers: dict[str, str] = {}
    for value in values:
        model, sep, path = value.partition("=")  # a model name has no "=", a path may
        if not sep:
            model, path = "*", value
        if not model or not path:
            raise SystemExit(f"--tokenizer {value!r}: expected MODEL=PATH or PATH")
        tokenizers[model] = path
    return tokenizers


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from agentgrad.dashboard.app import serve  # lazy: FastAPI/Jinja2 only when serving

    serve(
        args.store,
        args.host,
        args.port,
        _token(args),
        log_level="info" if args.verbose else "warning",
        allowed_hosts=args.allowed_hosts,
        tokenizers=parse_tokenizers(args.tokenizer),
    )
    return 0


def add_commands(subparsers: Any) -> None:
    """Register ``agentgrad dashboard`` on the main CLI's sub-command parsers."""
    parser = subparsers.add_parser(
        "dashboard",
        help="serve the web dashboard for a store",
        description="Serve the read-only web dashboard for a store (rollouts, spans, training curves, "
        "resources, runners). Stops cleanly on SIGTERM/SIGINT.",
    )
    parser.add_argument(
        "--store", required=True, help="store URL (path/to/file.db, sqlite:///abs/path.db, postgresql://…)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8766, help="port to listen on (0 picks a free one)")
    parser.add_argument(
        "--tokenizer",
        action="append",
        default=[],
        metavar="[MODEL=]PATH",
        help="show completion tokens as text: a tokenizer.json or a model directory holding one, for MODEL "
        "(as LLM calls name it) or, without MODEL=, for any model; repeatable",
    )
    add_guard_arguments(
        parser,
        TOKEN_ENV,
        token_help=f"require this token to see any data (default: "
        f"${LEGACY_TOKEN_ENV}, else ${TOKEN_ENV}; off when neither is set)",
    )
    parser.set_defaults(func=_cmd_dashboard)

"""The flags every serving command shares (``store serve``, ``dashboard``, ``proxy``,
``serve-model``): its token, read from the command line or from its environment variable, and the
extra ``Host`` names it answers to (:mod:`agentgrad.http.guard`). Not a command group itself."""

from __future__ import annotations

import argparse
import os

from agentgrad.http.guard import ALLOWED_HOSTS_ENV


def add_guard_arguments(parser: argparse.ArgumentParser, token_env: str, *, token_help: str | None = None) -> None:
    """``--token`` (default ``$token_env``) and the repeatable ``--allowed-host``."""
    parser.add_argument(
        "--token",
        default=None,
        help=token_help
        or f"require 'Authorization: Bearer <token>' on every route but /health (default: ${token_env}, else no token)",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        dest="allowed_hosts",
        metavar="NAME",
        help="answer requests whose Host header is NAME too, beside the loopback names and the "
        f"--host address (repeatable; also ${ALLOWED_HOSTS_ENV}, comma-separated; '*': any)",
    )


def token_of(args: argparse.Namespace, *envs: str) -> str | None:
    """``--token``, else the first of ``envs`` that is set, else None."""
    return args.token or next((os.environ[e] for e in envs if os.environ.get(e)), None)

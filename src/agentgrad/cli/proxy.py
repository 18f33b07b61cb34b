"""``agentgrad proxy``: serve the capture proxy from the command line."""

from __future__ import annotations

import argparse
import logging

from agentgrad.cli.serving import add_guard_arguments, token_of
from agentgrad.http.guard import DEFAULT_MAX_BODY_BYTES, MODEL_TOKEN_ENV, PROXY_TOKEN_ENV


def _cmd_proxy(args: argparse.Namespace) -> int:
    from agentgrad.proxy.server import LLMProxy
    from agentgrad.store import open_store

    store = open_store(args.store, watchdog=False)
    proxy = LLMProxy(
        store,
        args.upstream,
        host=args.host,
        port=args.port,
        model=args.model,
        upstream_api_key=args.upstream_api_key,
        max_body_bytes=args.max_body_bytes,
        record_mode=args.record_mode,
        write_linger=args.write_linger_ms / 1000,
        token=token_of(args, PROXY_TOKEN_ENV),
        allowed_hosts=args.allowed_hosts,
    )
    message = f"LLM proxy on {proxy.bind()} → {args.upstream}, recording into {args.store}"
    logging.getLogger("agentgrad.proxy").info("%s", message)
    print(message, flush=True)
    try:
        proxy.run()  # returns on SIGTERM/SIGINT after in-flight calls finish
    finally:
        store.close()
    print(f"LLM proxy stopped: {proxy.metrics.as_dict()}", flush=True)
    return 0


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    proxy = subparsers.add_parser("proxy", help="serve the OpenAI-compatible capture proxy")
    proxy.add_argument("--store", required=True, help="store URL (http://host:port, path/to/file.db, …)")
    proxy.add_argument("--upstream", required=True, help="OpenAI base URL of the engine, e.g. http://127.0.0.1:8000/v1")
    proxy.add_argument("--host", default="127.0.0.1", help="address to listen on")
    proxy.add_argument("--port", type=int, default=8400, help="port to listen on")
    proxy.add_argument(
        "--model",
        default=None,
        help="send every call to this upstream model (default: map "
        "unknown names to the first model the upstream serves)",
    )
    proxy.add_argument(
        "--upstream-api-key",
        default=None,
        help=f"API key for the upstream (default: ${MODEL_TOKEN_ENV}, else the client's own, "
        "unless the proxy has a --token)",
    )
    proxy.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="refuse larger requests (413; default: %(default)s)",
    )
    add_guard_arguments(proxy, PROXY_TOKEN_ENV)
    proxy.add_argument(
        "--record-mode",
        choices=("async", "sync"),
        default="async",
        help="async: write spans behind the answers, in batches (runners flush per attempt); "
        "sync: commit each span before the client has the whole answer",
    )
    proxy.add_argument(
        "--write-linger-ms",
        type=float,
        default=50.0,
        help="async: a span that comes alone waits this long for others before the store write, so "
        "back-to-back calls share a transaction and the write does not compete with the next call "
        "(a flush never waits for it; readers that do not flush see spans this much later); 0: at once",
    )
    proxy.set_defaults(func=_cmd_proxy)

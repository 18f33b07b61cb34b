"""``agentgrad serve-model``: serve a model over an OpenAI-compatible API (local engine or vLLM).

The main CLI wires these in with :func:`add_commands`; each parser's ``func`` takes the parsed
arguments and returns an exit code.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from agentgrad.cli.named_models import (
    MODEL_HELP,
    add_engine_dtype_argument,
    add_prefix_cache_arguments,
    prefix_cache_mb,
    resolve_model,
)
from agentgrad.cli.serving import add_guard_arguments, token_of
from agentgrad.http.guard import DEFAULT_MAX_BODY_BYTES, MODEL_TOKEN_ENV

log = logging.getLogger("agentgrad.inference")


def add_commands(subparsers: Any) -> None:
    """Register ``serve-model`` on an argparse sub-parsers action."""
    serve = subparsers.add_parser("serve-model", help="serve a model over an OpenAI-compatible API")
    serve.add_argument("model", metavar="MODEL_DIR", help=MODEL_HELP)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    serve.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (hf engine)")
    add_engine_dtype_argument(serve, "--dtype", "hf engine: ")
    serve.add_argument("--max-batch-size", type=int, default=32)
    serve.add_argument("--served-model-name", default=None)
    add_prefix_cache_arguments(serve, "hf engine: ")
    serve.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="refuse larger requests (413; default: %(default)s; hf engine)",
    )
    add_guard_arguments(
        serve,
        MODEL_TOKEN_ENV,
        token_help="require 'Authorization: Bearer <token>' on every route "
        f"but /health (default: ${MODEL_TOKEN_ENV}, else no token; vLLM gets it as $VLLM_API_KEY)",
    )
    serve.set_defaults(func=serve_model)


def serve_model(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; logs the endpoint it listens on."""
    logging.getLogger("agentgrad").setLevel(logging.INFO)  # the URL it serves at is logged at INFO
    model = str(resolve_model(args.model))
    if args.engine == "vllm":
        return _serve_vllm(args, model)
    from agentgrad.inference.engine import Engine
    from agentgrad.inference.server import ModelServer

    try:
        engine = Engine(
            model,
            device=args.device,
            dtype=args.dtype,
            max_batch_size=args.max_batch_size,
            prefix_caching=args.prefix_caching,
            prefix_cache_mb=prefix_cache_mb(args),
        )
    except OSError as exc:
        print(f"error: cannot load model {args.model!r}: {exc}", file=sys.stderr)
        return 2
    server = ModelServer(
        engine,
        args.host,
        args.port,
        served_model_name=args.served_model_name,
        token=token_of(args, MODEL_TOKEN_ENV),
        allowed_hosts=args.allowed_hosts,
        max_body_bytes=args.max_body_bytes,
    )
    try:
        url = server.bind()  # listening: a client connecting now waits in the backlog
        log.info("serving %s (version %s) at %s", args.served_model_name or Path(model).name, engine.model_version, url)
        server.run()  # until SIGTERM/SIGINT
    finally:
        server.stop()
        engine.close()
    log.info("model server stopped")
    return 0


def _serve_vllm(args: argparse.Namespace, model: str) -> int:
    from agentgrad.inference.vllm import launch_vllm

    token = token_of(args, MODEL_TOKEN_ENV)
    if token:  # vLLM reads its key from the environment it inherits (not argv, which ps shows)
        os.environ["VLLM_API_KEY"] = token
    try:
        proc, url = launch_vllm(model, host=args.host, port=args.port, served_model_name=args.served_model_name)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    log.info("vLLM serving %s at %s", model, url)
    print(url, flush=True)

    def forward(signum: int, frame: Any) -> None:
        proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return proc.wait()

"""``agentgrad models``: build the models the project makes itself (the tiny calculator model)."""

from __future__ import annotations

import argparse
from typing import Any


def add_commands(subparsers: Any) -> None:
    """Register ``models`` (``build-tiny``)."""
    models = subparsers.add_parser("models", help="build the embedded models")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    build = models_sub.add_parser("build-tiny", help="build the tiny calculator model (≈ 5–11 min on 2 cores)")
    build.add_argument("--output", default=None, help="directory (default: the user cache dir)")
    build.add_argument("--steps", type=int, default=None, help="warm-up SFT steps (default 1100)")
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--threads", type=int, default=None,
                       help="torch threads (default: two, one while other processes keep a core busy)")
    build.add_argument("--if-missing", action="store_true",
                       help="only build the default model when the cache lacks it or holds an older recipe")
    build.set_defaults(func=build_tiny)


def build_tiny(args: argparse.Namespace) -> int:
    """Build the tiny model and print where it went."""
    from agentgrad.demo.tiny import build_tiny_model, ensure_tiny_model

    if args.if_missing:
        if args.output is not None or args.steps is not None or args.seed != 0:
            raise SystemExit("--if-missing applies to the default model only (no --output, --steps or --seed)")
        print(ensure_tiny_model(threads=args.threads))
        return 0
    kwargs: dict[str, Any] = {"seed": args.seed, "threads": args.threads}
    if args.steps is not None:
        kwargs["warmup_steps"] = args.steps
    path = build_tiny_model(args.output, **kwargs)
    print(path)
    return 0

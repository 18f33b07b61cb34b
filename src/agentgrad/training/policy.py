"""Policy training over transformers (+ peft): the whole training loop in one file.

Read top to bottom: config → samples → model loading (the learning-rate rule, the model's
fingerprint, ``check_model``) → micro-batching → forward (per-token logprobs) → losses (PPO-clip,
NLL) and the step's learning rate → a step's samples and updates → one optimizer step →
checkpoints (the SFT loop over any trainer, ``fit_sequences``, is in ``backend.py``). GRPO
(``algorithms/grpo.py``) and SFT (``algorithms/sft.py``) both drive a :class:`PolicyTrainer`, or the Tinker trainer
(:mod:`agentgrad.training.tinker`), which takes its learning rate (:func:`step_lr`), sample
checks (:func:`trainable_samples`) and cut into updates (:func:`update_parts`) from here;
weight publishing lives in :mod:`agentgrad.training.publish`, export to a Hugging Face directory
in :mod:`agentgrad.training.export`.

Choices worth knowing:

* Token-level loss: every response token in an optimizer step weighs the same (the sum over
  tokens divided by the step's token count), however the step is cut into micro-batches, so
  micro-batching never changes the gradient.
* Old logprobs are the engine's sampled ones (recorded by the proxy), not recomputed: the
  importance ratio then also corrects for any drift between the engine and the trainer.
* Shared prefix: agent prompts share a long system + tools prefix; a micro-batch runs it once and
  broadcasts its KV cache (gradients still flow through it), which is most of the forward cost
  on small models.
* With LoRA the KL reference is the same model with its adapter disabled (no second copy).
* Dropout is off while training (``TrainConfig.dropout``): the engine samples without it, so an
  on-policy update must see ratio 1 on every token.
* ``TrainConfig(lr=None)`` picks the rate from the model's size (:func:`default_lr`) and logs it.
* A checkpoint records the model it came from (:meth:`PolicyTrainer.model_record`); loading it
  into a trainer of another model is refused with a message naming both.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agentgrad.inference.hf import no_progress_bars, quiet_peft
from agentgrad.inference.kv_cache import cache_kwargs, prefix_cache
from agentgrad.inference.logits import forward_keeping
from agentgrad.training.checkpoints import commit_checkpoint, latest_checkpoint

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

#: A loss over one laid-out micro-batch: (batch, trained-token count of the update) → (loss, diagnostic sums).
LossFn = Callable[["_Batch", float], tuple[Any, dict[str, Any]]]

MIN_SHARED_PREFIX = 16  # below this, sharing the prefix KV saves less than it costs


# ---------------------------------------------------------------------------------------------
# configuration and samples
# ---------------------------------------------------------------------------------------------


@dataclass
class LoraSettings:
    """A LoRA adapter over frozen base weights (peft)."""

    r: int = 16
    """Rank of the adapter matrices."""
    alpha: int = 32
    """Scaling numerator: the update is ``alpha / r`` × B·A."""
    dropout: float = 0.0
    """Dropout on the adapter's input; only with ``TrainConfig(dropout=True)``."""
    target_modules: str | list[str] = "all-linear"
    """Modules that get an adapter: peft's ``"all-linear"`` or a list of module names."""


@dataclass
class TrainConfig:
    """Optimizer, loss and batching settings shared by RL and SFT."""

    lr: float | None = None
    """Learning rate. None: picked from the model's size (``default_lr``: 2e-4 on the
    0.9M-parameter tiny model, where it was measured, down to 1e-6 from 1B parameters; ×10 with
    LoRA) and logged."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.99)
    """Adam's moment decay rates."""
    adam_eps: float = 1e-8
    """Adam's epsilon. Raising it towards typical gradient magnitudes damps the updates of
    parameters whose gradients are mostly noise (see docs/credit-assignment.md, "tuning")."""
    grad_clip: float = 1.0
    """Gradient norm clipping threshold."""
    micro_batch_tokens: int = 8192
    """Padded tokens (rows × longest row) per micro-batch; bounds activation memory."""
    gradient_checkpointing: bool = False
    """Keep each layer's input only and run the layer again in the backward pass (transformers'
    gradient checkpointing): less activation memory for more compute. Rows then do not share a
    common prefix (a layer under checkpointing drops the prefix's KV cache), so it pays where rows
    share little and costs where they share a long system turn (docs/models.md)."""
    clip_eps_low: float = 0.2
    """PPO clip range below 1: the ratio is clipped at ``1 - clip_eps_low``."""
    clip_eps_high: float = 0.28
    """PPO clip range above 1: the ratio is clipped at ``1 + clip_eps_high``."""
    kl_coef: float = 0.0
    """KL penalty to the reference model (0: off, and no reference forward pass)."""
    log_kl: bool = False
    """Measure the KL to the reference model (the start weights) for the logs even with ``kl_coef``
    0: how far the policy has moved. Costs a reference forward pass per micro-batch (and, with full
    fine-tuning, a frozen copy of the model)."""
    entropy_coef: float = 0.0
    """Entropy bonus (0: off)."""
    tis_cap: float | None = None
    """Truncated importance sampling for samples drawn by an older policy (GRPO's ``overlap``).
    None: the PPO ratio is taken against the engine's sampled logprobs, which is right when the
    samples come from the weights being trained. With a cap C: the ratio is taken against the
    trainer's own logprobs at the start of the step (the proximal policy, one extra forward pass),
    and each token's loss is weighted by ``min(π_prox / π_sample, C)`` — so samples from a stale
    or drifted engine are corrected without the clip zeroing their gradient (docs/algorithms.md)."""
    lr_decay: Literal["none", "linear", "cosine"] = "none"
    """How the learning rate falls over the run's steps (GRPO's ``steps``): ``none`` keeps it
    constant; ``linear`` and ``cosine`` bring it from ``lr`` at the first step to ``lr ×
    lr_final`` at the last. Late in an RL run most groups agree (no signal) and the few that do not
    still get full-size Adam steps; decaying the rate makes those steps smaller (on the demo it did
    not stop the decline, which starts earlier: docs/training.md, "Stability")."""
    lr_final: float = 0.0
    """The learning rate at the last step, as a fraction of ``lr`` (with ``lr_decay``)."""
    lora: LoraSettings | None = None
    """A LoRA adapter; None: full fine-tuning."""
    dropout: bool = False
    """Dropout while training (the model's own and LoRA's). Off by default: the engine samples
    without dropout, so with it on even the first, on-policy update sees ratios ≠ 1 (on GPT-2-style
    models with dropout 0.1, recomputed logprobs off by 0.11–0.19 and up to 4.5 % of tokens clipped)."""
    device: str = "auto"
    """``cpu``, ``cuda``, ``cuda:N``, or ``auto`` (a GPU when there is one)."""
    dtype: str = "auto"
    """``auto``: bf16 on a GPU that supports it, float32 otherwise (always on CPU); or a torch
    dtype name (``float32``, ``bfloat16``)."""
    autocast: Literal["bfloat16"] | None = None
    """Mixed precision: the trainer's forward passes (and so their backward passes) run under
    ``torch.autocast`` in this dtype, the weights and the optimizer state staying in ``dtype``. On a
    CPU with native bf16 instructions (AVX512-BF16, AMX) ``bfloat16`` made SmolLM2-135M's LoRA
    updates 1.5–2.7× faster on rows of 100–260 tokens (on an Intel Xeon, rows of 30–40 tokens
    gained nothing); logprobs then differ from float32's by a few hundredths, so an
    on-policy update's ratios are no longer exactly 1 (docs/training.md, "Mixed precision"). On a CPU
    without those instructions it is slower (a warning says so)."""
    seed: int = 0
    """Seed of the model's initialisation (LoRA) and of the mini-batch shuffles."""

    def __post_init__(self) -> None:
        if self.autocast not in (None, "bfloat16"):  # float16 would need a gradient scaler
            raise ValueError(f"TrainConfig.autocast must be None or 'bfloat16', got {self.autocast!r}")
        decayed_lr(1.0, 0, 1, decay=self.lr_decay, final=self.lr_final)  # refuses a bad setting now, not at step 1
        if self.tis_cap is not None and not self.tis_cap >= 1.0:
            raise ValueError(f"TrainConfig.tis_cap must be None or ≥ 1, got {self.tis_cap!r}")


@dataclass
class Sample:
    """One training sequence: ``prompt_ids`` are context; ``response_ids`` are learned where
    ``mask`` is 1. ``old_logprobs`` (per response token) and ``advantage`` are for PPO;
    ``behavior_logprobs``, the sampling engine's, only when ``old_logprobs`` are the trainer's
    own (``TrainConfig.tis_cap``)."""

    prompt_ids: list[int]
    response_ids: list[int]
    mask: list[int] | None = None
    old_logprobs: list[float] | None = None
    advantage: float = 0.0
    behavior_logprobs: list[float] | None = None

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("Sample.prompt_ids must not be empty")
        if self.mask is None:
            self.mask = [1] * len(self.response_ids)
        if len(self.mask) != len(self.response_ids):
            raise ValueError(f"Sample.mask has {len(self.mask)} entries for {len(self.response_ids)} response tokens")
        for name in ("old_logprobs", "behavior_logprobs"):
            values = getattr(self, name)
            if values is not None and len(values) != len(self.response_ids):
                raise ValueError(
                    f"Sample.{name} has {len(values)} entries for {len(self.response_ids)} response tokens"
                )

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @classmethod
    def from_transition(cls, t: Any) -> Sample:
        """From an :class:`agentgrad.types.Transition` (its advantage and sampled logprobs)."""
        return cls(
            list(t.prompt_ids),
            list(t.response_ids),
            list(t.response_mask or [1] * len(t.response_ids)),
            list(t.response_logprobs) if t.response_logprobs is not None else None,
            float(t.advantage),
        )


def trained_tokens(samples: Sequence[Sample]) -> int:
    """The response tokens ``samples`` train (the ones in their masks): an update's loss normaliser."""
    return sum(sum(s.mask or ()) for s in samples)


# ---------------------------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------------------------


def trainer_device_and_dtype(config: TrainConfig) -> tuple[Any, Any]:
    """The torch device and weights' dtype ``config`` puts the trainer on (``auto`` resolved)."""
    import torch

    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if config.dtype != "auto":
        return torch.device(device), getattr(torch, config.dtype)
    bf16 = device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return torch.device(device), torch.bfloat16 if bf16 else torch.float32


def native_cpu_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX); without, torch emulates it."""
    import torch

    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # private: absent means unknown, not no
    found = [getattr(torch.cpu, name, None) for name in probes]
    return any(probe() for probe in found if probe is not None) or all(probe is None for probe in found)


#: The learning-rate rule's anchors, (parameters, full fine-tuning rate); see :func:`default_lr`.
LR_SMALL = (1e6, 2e-4)
LR_LARGE = (1e9, 1e-6)
#: LoRA's rate over full fine-tuning's at the same model size (its updates are low-rank and
#: start from a zero adapter, so the usual optimum is about ten times higher), capped at the
#: rate where LoRA r=16 on the tiny model learns as fast as full fine-tuning at 5e-4 (held-out
#: tool-call log-probability −0.906 → −0.153 in four steps, vs −0.150; LoRA at 5e-4: −0.650).
LORA_LR_FACTOR = 10.0
LORA_LR_MAX = 2e-3


def default_lr(n_params: int, lora: bool = False) -> float:
    """The learning rate ``TrainConfig(lr=None)`` picks for a model of ``n_params`` parameters.

    Log-linear in the parameter count between two anchors, constant outside them:
    ``LR_SMALL`` = 2e-4 at ≤ 1M parameters, measured on the 0.87M-parameter tiny model: it learns
    as fast as 5e-4, the largest rate that helped (greedy success ≥ 0.95 within four or five GRPO
    steps; 1e-5 moved nothing in four: docs/credit-assignment.md, "tuning on a small model"), but
    stays learned where 5e-4 peaks and falls back (a LangGraph agent, 3 seeds, held-out test
    after 12 steps: 0.992–1.000 against 0.883–0.922: docs/training.md, "Stability"), and ``LR_LARGE`` =
    1e-6 at ≥ 1B, the usual full fine-tuning rate for RL on 0.5B–7B instruct models (verl's
    and TRL's GRPO examples). In between, e.g. 10M → 3.4e-5, 124M (GPT-2 small) → 5e-6, 500M → 1.7e-6.
    With LoRA the rate is ``LORA_LR_FACTOR`` times higher, at most ``LORA_LR_MAX``. The result
    is rounded to two significant digits.
    """
    (n0, lr0), (n1, lr1) = LR_SMALL, LR_LARGE
    x = min(max(math.log10(max(n_params, 1)), math.log10(n0)), math.log10(n1))
    t = (x - math.log10(n0)) / (math.log10(n1) - math.log10(n0))
    lr = 10 ** (math.log10(lr0) + t * (math.log10(lr1) - math.log10(lr0)))
    if lora:
        lr = min(lr * LORA_LR_FACTOR, LORA_LR_MAX)
    return float(f"{lr:.2g}")


#: The config fields a checkpoint records to recognise the model it came from.
_FINGERPRINT_FIELDS = (
    "model_type",
    "architectures",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "max_position_embeddings",
    "tie_word_embeddings",
)


def model_fingerprint(config: Any) -> dict[str, Any]:
    """Architecture, sizes and vocabulary of a transformers config (what a checkpoint's weights
    must fit); GPT-2-style names (``n_embd``…) are read through the config's aliases."""
    out: dict[str, Any] = {}
    for name in _FINGERPRINT_FIELDS:
        value = getattr(config, name, None)
        if value is None and name == "intermediate_size":
            value = getattr(config, "n_inner", None)
        out[name] = list(value) if isinstance(value, (list, tuple)) else value
    return out


def weight_files(model_dir: str | Path) -> list[Path]:
    """A model directory's weight files: its safetensors, else its PyTorch ``.bin`` files."""
    root = Path(model_dir)
    return sorted(root.glob("*.safetensors")) or sorted(root.glob("pytorch_model*.bin"))


def weights_digest(model_dir: str | Path, samples: int = 16, chunk: int = 1 << 16) -> str | None:
    """A cheap content digest of a model directory's weight files: names, sizes and ``samples``
    evenly spaced ``chunk``-byte reads per file (a few MB at most, whatever the model's size).
    Tells apart two models with the same config (another seed, another fine-tune); None when
    the directory has no weight files."""
    import hashlib

    files = weight_files(model_dir)
    if not files:
        return None
    digest = hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        digest.update(f"{f.name}:{size}".encode())
        with f.open("rb") as fh:
            for i in range(samples):
                fh.seek(max(0, (size - chunk) * i // max(1, samples - 1)))
                digest.update(fh.read(chunk))
    return digest.hexdigest()[:16]


def describe_fingerprint(fp: dict[str, Any]) -> str:
    """``qwen2, 4 layers, hidden 128, vocab 640`` — a fingerprint in words, for messages."""
    arch = fp.get("model_type") or "?"
    return f"{arch}, {fp.get('num_hidden_layers')} layers, hidden {fp.get('hidden_size')}, vocab {fp.get('vocab_size')}"


def check_model(model_dir: str | Path, *, tools: bool = False, prompt_tokens: int | None = None) -> dict[str, Any]:
    """Check before a run starts that ``model_dir`` can do what the run needs; raise
    :class:`~agentgrad.errors.InvalidInputError` naming everything that is missing.

    Needed always: a ``config.json`` of a causal LM, weights, a tokenizer, and a chat template
    (agents call the model through chat completions). With ``tools``: a chat template that
    renders the request's tools (a template without a tool section silently drops them, and the
    model never sees a tool). With ``prompt_tokens``: a context longer than that prompt.
    Returns what it found: ``context`` (max positions), ``chat_template``, ``renders_tools``,
    ``tool_call_format`` (the template shows ``<tool_call>`` blocks, the format the local
    engine parses), ``fingerprint``.
    """
    from agentgrad.errors import InvalidInputError
    from agentgrad.inference.engine import template_renders_tools

    root = Path(model_dir)
    if not (root / "config.json").is_file():
        raise InvalidInputError(
            f"model {root} is not a Hugging Face model directory: no config.json"
            + ("" if root.is_dir() else " (the directory does not exist)")
        )
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(str(root))
    problems: list[str] = []
    if weights_digest(root) is None:
        problems.append("no weights (*.safetensors or pytorch_model*.bin)")
    context = getattr(config, "max_position_embeddings", None)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(root))
    except Exception as exc:  # noqa: BLE001 - any failure means "no usable tokenizer"
        tokenizer = None
        problems.append(f"no usable tokenizer ({type(exc).__name__}: {exc})")
    template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    renders_tools = tool_format = False
    if tokenizer is not None and not template:
        problems.append(
            "no chat template (tokenizer_config.json 'chat_template' or chat_template.jinja): "
            "agents call the model through chat completions"
        )
    elif tokenizer is not None:
        renders_tools = template_renders_tools(tokenizer)
        tool_format = "<tool_call>" in str(template)
        if tools and not renders_tools:
            problems.append(
                "its chat template has no tool section: it drops a request's `tools`, so the model "
                "would never see the agent's tools (use a model whose template renders tools)"
            )
    if prompt_tokens is not None and context is not None and prompt_tokens >= context:
        problems.append(
            f"its context is too short: the prompt has {prompt_tokens} tokens, the model's context "
            f"(max_position_embeddings) is {context}"
        )
    if problems:
        raise InvalidInputError(f"model {root} cannot be used for this run: " + "; ".join(problems))
    return {
        "context": context,
        "chat_template": bool(template),
        "renders_tools": renders_tools,
        "tool_call_format": tool_format,
        "fingerprint": model_fingerprint(config),
    }


def load_policy(model_dir: str | Path, config: TrainConfig) -> Any:
    """The trainable model: full weights, or a fresh LoRA adapter over frozen weights."""
    import torch
    from transformers import AutoModelForCausalLM

    device, dtype = trainer_device_and_dtype(config)
    torch.manual_seed(config.seed)
    with no_progress_bars():
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(device)
    if config.lora is not None:
        from peft import LoraConfig, get_peft_model

        lora = config.lora
        with quiet_peft():
            model = get_peft_model(
                model,
                LoraConfig(
                    r=lora.r,
                    lora_alpha=lora.alpha,
                    lora_dropout=lora.dropout,
                    target_modules=lora.target_modules,
                    task_type="CAUSAL_LM",
                ),
            )
    model.config.use_cache = False
    if config.gradient_checkpointing:  # transformers 5 renamed it; 4 has the old name only
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable({"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def train_mode(model: Any, config: TrainConfig) -> None:
    """The mode training steps run in: dropout on only with ``config.dropout`` (without it the
    recomputed logprobs of an on-policy update equal the engine's: ratio 1; gradients flow in eval
    mode too). transformers checkpoints a layer only in train mode, so with
    ``gradient_checkpointing`` the decoder layers alone are marked training — their dropouts and
    attention, the modules below them, stay in eval mode."""
    model.train(config.dropout)
    if config.gradient_checkpointing and not config.dropout:
        from transformers.modeling_layers import GradientCheckpointingLayer

        for module in model.modules():
            if isinstance(module, GradientCheckpointingLayer):
                module.training = True


# ---------------------------------------------------------------------------------------------
# micro-batching and the forward pass
# ---------------------------------------------------------------------------------------------


def micro_batches(samples: Sequence[Sample], token_budget: int) -> list[list[Sample]]:
    """Pack samples (sorted by length, so padding is small) into micro-batches whose padded size
    — rows × longest row — stays within ``token_budget`` (a longer single sample still gets a
    micro-batch of its own)."""
    batches: list[list[Sample]] = []
    current: list[Sample] = []
    for sample in sorted(samples, key=lambda s: s.length):
        if current and (len(current) + 1) * sample.length > token_budget:
            batches.append(current)
            current = []
        current.append(sample)
    if current:
        batches.append(current)
    return batches


def _shared_prefix(rows: list[list[int]], cap: int) -> int:
    first = rows[0]
    n = min(cap, *(len(r) for r in rows))
    for i in range(n):
        t = first[i]
        if any(r[i] != t for r in rows):
            return i
    return n


@dataclass
class _Batch:
    """A micro-batch laid out for the forward pass (targets aligned with the logits)."""

    prefix_ids: Any  # (1, P) or None
    input_ids: Any  # (B, W) suffix after the shared prefix, right-padded
    attention: Any  # (B, P + W)
    targets: Any  # (B, W) token predicted at each position (0 where unused)
    mask: Any  # (B, W) 1 where a trained response token is predicted
    old_logprobs: Any  # (B, W) NaN where unknown
    advantages: Any  # (B, W)
    behavior_logprobs: Any  # (B, W) NaN where unknown (no TIS)
    starts: list[int]  # per row, the position whose logits predict its response token 0
    columns: Any  # (C,) the positions that predict a response token of some row: the only logits made


def _layout(batch: Sequence[Sample], device: Any, share_prefix: bool = True) -> _Batch:
    import torch

    rows = [s.prompt_ids + s.response_ids for s in batch]
    cap = min(len(s.prompt_ids) for s in batch) - 1  # logits predicting responses must be in the suffix
    prefix = _shared_prefix(rows, cap) if share_prefix and len(batch) > 1 else 0
    if prefix < MIN_SHARED_PREFIX:
        prefix = 0
    width = max(len(r) for r in rows) - prefix
    size = (len(batch), width)
    input_ids = torch.zeros(size, dtype=torch.long)
    attention = torch.zeros((len(batch), prefix + width), dtype=torch.long)
    targets = torch.zeros(size, dtype=torch.long)
    mask = torch.zeros(size)
    old = torch.full(size, float("nan"))
    behavior = torch.full(size, float("nan"))
    adv = torch.zeros(size)
    responding = torch.zeros(width, dtype=torch.bool)  # columns that predict some row's response token
    starts = []
    for b, (sample, row) in enumerate(zip(batch, rows, strict=True)):
        suffix = row[prefix:]
        input_ids[b, : len(suffix)] = torch.tensor(suffix)
        attention[b, : prefix + len(suffix)] = 1
        start = len(sample.prompt_ids) - 1 - prefix  # position whose logits predict response token 0
        starts.append(start)
        n = len(sample.response_ids)
        targets[b, start : start + n] = torch.tensor(sample.response_ids)
        mask[b, start : start + n] = torch.tensor(sample.mask, dtype=torch.float)
        if sample.old_logprobs is not None:
            old[b, start : start + n] = torch.tensor(sample.old_logprobs, dtype=torch.float)
        if sample.behavior_logprobs is not None:
            behavior[b, start : start + n] = torch.tensor(sample.behavior_logprobs, dtype=torch.float)
        adv[b, start : start + n] = sample.advantage
        responding[start : start + n] = True
    prefix_ids = torch.tensor([rows[0][:prefix]]) if prefix else None
    columns = responding.nonzero().squeeze(-1)
    to = lambda x: None if x is None else x.to(device)  # noqa: E731
    return _Batch(
        to(prefix_ids),
        to(input_ids),
        to(attention),
        to(targets),
        to(mask),
        to(old),
        to(adv),
        to(behavior),
        starts,
        to(columns),
    )


def response_values(batch: Sequence[Sample], laid_out: _Batch, values: torch.Tensor) -> list[list[float]]:
    """Per sample of ``batch`` (as laid out by :func:`_layout`), the entries of a (B, W) tensor at
    its response tokens."""
    rows = values.detach().cpu().tolist()
    return [
        row[start : start + len(sample.response_ids)]
        for sample, row, start in zip(batch, rows, laid_out.starts, strict=True)
    ]


def _logits(model: Any, batch: _Batch) -> torch.Tensor:
    """Logits at ``batch.columns`` of the suffix, running the shared prefix once for the whole
    batch. Only the positions that predict a response token get logits (``logits_to_keep``): the
    prompt's would be computed and thrown away, and over a large vocabulary they are most of a
    micro-batch's memory and much of its time (SmolLM2: 1.6 GB of fp32 logits per 8,192
    positions)."""
    inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention}
    if batch.prefix_ids is None:
        out = forward_keeping(model, batch.columns, **inputs, use_cache=False)
    else:
        kv_cache = prefix_cache(model, batch.prefix_ids, batch.input_ids.shape[0])
        out = forward_keeping(model, batch.columns, **inputs, use_cache=True, **cache_kwargs(kv_cache))
    return out.logits.float()


def token_logprobs(model: Any, batch: _Batch, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-position logprob of ``batch.targets`` (and the policy's entropy) under ``model``, as
    (B, W) tensors: 0 at the positions that predict no response token (every use masks them)."""
    import torch

    logp = torch.log_softmax(_logits(model, batch), dim=-1)
    columns = batch.columns
    chosen = _widened(logp.gather(-1, batch.targets[:, columns].unsqueeze(-1)).squeeze(-1), batch)
    entropy = _widened(-(logp.exp() * logp).sum(-1), batch) if with_entropy else None
    return chosen, entropy


def _widened(values: torch.Tensor, batch: _Batch) -> torch.Tensor:
    """(B, C) values at ``batch.columns`` placed in a (B, W) tensor of zeros (gradients flow)."""
    wide = values.new_zeros(batch.targets.shape)
    wide[:, batch.columns] = values
    return wide


# ---------------------------------------------------------------------------------------------
# losses
# ---------------------------------------------------------------------------------------------


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.28,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    normalizer: float | None = None,
    behavior_logprobs: torch.Tensor | None = None,
    tis_cap: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-level PPO-clip: ``max(-A·r, -A·clip(r, 1-eps_low, 1+eps_high))`` per token, with
    ``r = exp(logprob - old_logprob)``, plus ``kl_coef`` × the k3 estimate of KL(π‖π_ref),
    summed over masked tokens and divided by ``normalizer`` (default: the masked token count).
    With ``tis_cap`` (and ``behavior_logprobs``, the sampler's), the clipped term of each token is
    weighted by ``min(exp(old_logprob - behavior_logprob), tis_cap)``: truncated importance
    sampling from the policy that sampled to the proximal one ``old_logprobs`` stands for.

    Returns the loss and sums (not means) of per-token diagnostics, so callers can add them up
    over micro-batches: ``clipped`` (tokens where the clipped branch was taken), ``kl``,
    ``ratio`` and ``tokens``; with TIS also ``tis_weight``, ``tis_capped`` (tokens at the cap) and
    ``logprob_gap`` (|old - behavior|, the train/infer gap).
    """
    import torch

    old = torch.where(torch.isnan(old_logprobs), logprobs.detach(), old_logprobs)
    log_ratio = (logprobs - old).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    per_token = torch.maximum(unclipped, clipped)
    tis: dict[str, torch.Tensor] = {}
    if tis_cap is not None and behavior_logprobs is not None:
        known = ~torch.isnan(behavior_logprobs)
        gap = torch.where(known, old - behavior_logprobs, torch.zeros_like(old)).clamp(-20.0, 20.0)
        weight = torch.exp(gap).clamp(max=tis_cap).detach()
        per_token = per_token * weight
        with torch.no_grad():
            tis = {
                "tis_weight": (weight * mask).sum(),
                "tis_capped": ((weight >= tis_cap).float() * mask).sum(),
                "logprob_gap": (gap.abs() * mask).sum(),
            }
    kl = torch.zeros_like(per_token)
    if ref_logprobs is not None:
        delta = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
        kl = torch.exp(delta) - delta - 1.0
        per_token = per_token + kl_coef * kl
    tokens = mask.sum()
    denominator = normalizer if normalizer is not None else tokens.clamp(min=1.0)
    loss = (per_token * mask).sum() / denominator
    with torch.no_grad():
        diagnostics = {
            "clipped": ((clipped > unclipped).float() * mask).sum(),
            "kl": (kl * mask).sum(),
            "ratio": (ratio * mask).sum(),
            "ratio_max": (ratio * mask).max() if mask.numel() else ratio.new_zeros(()),
            "tokens": tokens,
            **tis,
        }
    return loss, diagnostics


def nll_loss(logprobs: torch.Tensor, mask: torch.Tensor, normalizer: float) -> torch.Tensor:
    """Plain negative log-likelihood of the masked tokens, summed and divided by ``normalizer``."""
    return -(logprobs * mask).sum() / normalizer


def decayed_lr(lr: float, step: int, total: int, *, decay: str, final: float) -> float:
    """The learning rate of the step after ``step`` steps done, of ``total``: ``lr`` at the first,
    ``lr × final`` at the last, in between a straight line (``linear``) or half a cosine
    (``cosine``); ``none`` keeps ``lr``. Steps past ``total`` (a resumed, extended run) keep the
    final rate."""
    if decay not in ("none", "linear", "cosine"):
        raise ValueError(f"TrainConfig.lr_decay must be 'none', 'linear' or 'cosine', got {decay!r}")
    if not 0.0 <= final <= 1.0:
        raise ValueError(f"TrainConfig.lr_final must be within [0, 1], got {final!r}")
    if decay == "none":
        return lr
    t = min(step, total - 1) / max(total - 1, 1)  # 0 at the first step, 1 at the last
    shape = 1.0 - t if decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * t))
    return lr * (final + (1.0 - final) * shape)


def step_lr(config: TrainConfig, step: int, total_steps: int | None) -> float:
    """The learning rate of the step after ``step`` steps done: ``config.lr``, decayed over
    ``total_steps`` as ``config.lr_decay`` says (:func:`decayed_lr`). Every trainer (local, Tinker)
    asks here, so a schedule means the same thing on each backend."""
    if config.lr_decay == "none":
        return float(config.lr)  # type: ignore[arg-type]
    if not total_steps:
        raise ValueError(
            f"TrainConfig.lr_decay={config.lr_decay!r} needs the run's length: set the trainer's "
            "total_steps (GRPO sets it to its steps)"
        )
    return decayed_lr(float(config.lr), step, total_steps, decay=config.lr_decay, final=config.lr_final)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# a step's samples and updates (shared by every trainer: the local one and the Tinker one)
# ---------------------------------------------------------------------------------------------


def trainable_samples(samples: Sequence[Sample], *, context: int | None, model: str) -> list[Sample]:
    """The samples with at least one trained token, checked against the model's ``context``
    (``max_position_embeddings``; None: unchecked) before any compute is spent on them; raise
    when none is left or one is too long (``model`` names the model in the message)."""
    from agentgrad.errors import InvalidInputError

    kept = [s for s in samples if any(s.mask)]  # type: ignore[arg-type]
    if not kept:
        raise ValueError("no trainable tokens: every sample's mask is all zeros")
    longest = max(s.length for s in kept)
    if context is not None and longest > context:
        raise InvalidInputError(
            f"a training sequence has {longest} tokens, longer than the context of model {model} "
            f"({context} tokens, max_position_embeddings): use a model with a longer context, or shorter "
            "prompts and completions (max_tokens)"
        )
    return kept


def update_parts(
    samples: Sequence[Sample], *, mini_batches: int, epochs: int, seed: int, step: int
) -> list[list[Sample]]:
    """A training step's optimizer updates, in order: ``epochs`` passes over ``samples``, each cut
    into ``mini_batches`` parts (at most one per sample) after a shuffle seeded by ``seed`` and the
    ``step`` number, so a resumed run — and a run on another backend — makes the same updates."""
    if mini_batches < 1 or epochs < 1:
        raise ValueError(f"mini_batches and epochs must be >= 1, got {mini_batches} and {epochs}")
    rng = random.Random(f"{seed}:{step}")
    parts = min(mini_batches, len(samples))
    updates: list[list[Sample]] = []
    for _epoch in range(epochs):
        order = list(samples)
        if parts > 1:
            rng.shuffle(order)
        updates.extend(order[part::parts] for part in range(parts))
    return updates


# ---------------------------------------------------------------------------------------------
# the trainer
# ---------------------------------------------------------------------------------------------


@dataclass
class StepMetrics:
    """What one training step did. ``loss`` and ``grad_norm`` are means over its updates;
    ``tokens`` counts every trained token each time an update processed it, so
    ``tokens_per_second`` is processing throughput; the per-token diagnostics average over the
    same tokens."""

    loss: float
    tokens: int
    seconds: float
    grad_norm: float
    entropy: float = float("nan")
    kl: float = float("nan")
    clip_fraction: float = float("nan")
    ratio_mean: float = float("nan")
    #: the largest importance ratio of a trained token (1 on an on-policy update)
    ratio_max: float = float("nan")
    #: the learning rate of this step's updates (``TrainConfig.lr_decay``)
    lr: float = float("nan")
    micro_batches: int = 0
    #: optimizer updates in this step (``epochs`` × ``mini_batches``)
    updates: int = 1
    #: with ``TrainConfig.tis_cap``: the mean importance weight π_prox / π_sample (capped), the
    #: share of tokens at the cap, and the mean |log π_prox − log π_sample| (train/infer gap)
    tis_weight: float = float("nan")
    tis_capped: float = float("nan")
    logprob_gap: float = float("nan")

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "tokens_per_second": self.tokens_per_second}


class PolicyTrainer:
    """A policy, its optimizer and a step counter: ``ppo_step`` and ``nll_step`` each make one
    training step over all the samples given (micro-batched; one optimizer update, or several
    with ``ppo_step(mini_batches=, epochs=)``); checkpoints save all three plus a caller-defined
    data ``cursor``."""

    def __init__(self, model_dir: str | Path, config: TrainConfig | None = None) -> None:
        import torch

        self.model_dir = Path(model_dir)
        config = config or TrainConfig()
        self.model = load_policy(self.model_dir, config)
        self.device = next(self.model.parameters()).device
        base = self.model.get_base_model() if config.lora is not None else self.model
        #: Parameters of the model itself (LoRA adapters not counted).
        self.n_params = sum(p.numel() for n, p in base.named_parameters() if "lora_" not in n)
        if config.lr is None:  # the caller's config object stays as it was; ours holds the choice
            config = replace(config, lr=default_lr(self.n_params, lora=config.lora is not None))
            log.info(
                "learning rate %g, picked for %s parameters%s (set TrainConfig(lr=...) to choose)",
                config.lr,
                f"{self.n_params:,}",
                " with LoRA" if config.lora is not None else "",
            )
        self.config = config
        if config.autocast == "bfloat16" and self.device.type == "cpu" and not native_cpu_bf16():
            log.warning(
                "TrainConfig(autocast='bfloat16') on a CPU without native bf16 instructions "
                "(AVX512-BF16 or AMX): each update will be slower than in float32, not faster"
            )
        if config.lora is not None and config.lora.dropout and not config.dropout:
            log.warning(
                "LoraSettings(dropout=%g) has no effect: dropout is off while training "
                "(TrainConfig(dropout=True) turns it on)",
                config.lora.dropout,
            )
        params = [p for p in self.model.parameters() if p.requires_grad]
        assert config.lr is not None  # chosen above
        self.optimizer = torch.optim.AdamW(
            params, lr=config.lr, weight_decay=config.weight_decay, betas=config.betas, eps=config.adam_eps
        )
        self.step = 0
        #: The run's length in steps, the horizon of ``TrainConfig.lr_decay`` (GRPO sets it).
        self.total_steps: int | None = None
        self._reference: Any = None
        self._weights_digest: str | None = None

    @property
    def context_length(self) -> int | None:
        """The model's context (``max_position_embeddings``), None when its config has none."""
        return getattr(self.model.config, "max_position_embeddings", None)

    def model_record(self) -> dict[str, Any]:
        """What a checkpoint records about the model it came from: the base model directory's
        resolved ``path``, its config ``fingerprint`` (architecture, sizes, vocab), a ``weights``
        digest (:func:`weights_digest`), the LoRA settings (None: full fine-tuning) and the
        training ``dtype``."""
        import torch

        if self._weights_digest is None:
            self._weights_digest = weights_digest(self.model_dir) or ""
        dtype = next(self.model.parameters()).dtype
        return {
            "path": str(self.model_dir.resolve()),
            "fingerprint": model_fingerprint(self.model.config),
            "weights": self._weights_digest or None,
            "lora": asdict(self.config.lora) if self.config.lora is not None else None,
            "dtype": str(dtype).removeprefix("torch.") if isinstance(dtype, torch.dtype) else str(dtype),
        }

    def skip_step(self) -> None:
        """Count a step that made no update (the algorithm found nothing to learn from its data),
        so step numbers, checkpoints and the data cursor stay aligned with the algorithm's steps."""
        self.step += 1

    @property
    def is_lora(self) -> bool:
        return self.config.lora is not None

    def _forward_precision(self) -> contextlib.AbstractContextManager[Any]:
        """Where the trainer's forward passes run: under ``torch.autocast`` with
        ``TrainConfig.autocast``, else as they are."""
        import torch

        if self.config.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=getattr(torch, self.config.autocast))

    def _reference_logprobs(self, batch: _Batch) -> torch.Tensor | None:
        """Logprobs under the reference policy (the initial weights), or None with KL off and unlogged."""
        return self.reference_logprobs(batch) if self.config.kl_coef > 0 or self.config.log_kl else None

    def reference_logprobs(self, batch: _Batch) -> torch.Tensor:
        """Per-position logprobs of ``batch.targets`` under the reference policy, the start
        weights: with LoRA the same model with its adapter disabled, else a frozen copy loaded
        once (the KL penalty's reference, and DPO's)."""
        import torch

        with torch.no_grad():
            if self.is_lora:
                with self.model.disable_adapter():
                    return token_logprobs(self.model, batch)[0]
            if self._reference is None:  # full fine-tuning needs a frozen copy
                self._reference = load_policy(self.model_dir, TrainConfig(**{**asdict(self.config), "lora": None}))
                self._reference.eval().requires_grad_(False)
            return token_logprobs(self._reference, batch)[0]

    def _update(
        self,
        samples: Sequence[Sample],
        loss_fn: LossFn,
        sums: dict[str, float],
        *,
        batches: list[list[Sample]] | None = None,
        tokens_per_sample: float | None = None,
    ) -> tuple[float, float, int]:
        """One optimizer update over ``samples`` (micro-batched, or cut into ``batches`` by the
        caller); adds the loss function's diagnostics into ``sums`` and returns (loss, grad norm,
        micro-batches). The loss normaliser is the update's trained-token count, or with
        ``tokens_per_sample`` the constant ``len(samples) × tokens_per_sample`` (Dr. GRPO)."""
        import torch

        total = float(len(samples)) * tokens_per_sample if tokens_per_sample else float(trained_tokens(samples))
        loss_total = 0.0
        batches = batches or micro_batches(samples, self.config.micro_batch_tokens)
        for chunk in batches:
            batch = _layout(chunk, self.device, share_prefix=not self.config.gradient_checkpointing)
            with self._forward_precision():
                loss, extra = loss_fn(batch, total)
            loss.backward()
            loss_total += float(loss.detach())
            for key, value in extra.items():
                # ``*_max`` diagnostics are maxima over the micro-batches; the others, sums
                merge = max if key.endswith("_max") else (lambda a, b: a + b)
                sums[key] = merge(sums[key], float(value)) if key in sums else float(value)
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.config.grad_clip))
        if math.isfinite(grad_norm):
            self.optimizer.step()
        else:
            log.warning("non-finite gradient norm at step %d: update skipped", self.step + 1)
        self.optimizer.zero_grad(set_to_none=True)
        return loss_total, grad_norm, len(batches)

    def _step(
        self,
        samples: Sequence[Sample],
        loss_fn: LossFn,
        *,
        mini_batches: int = 1,
        epochs: int = 1,
        tokens_per_sample: float | None = None,
        batching: Callable[[Sequence[Sample]], list[list[Sample]]] | None = None,
    ) -> StepMetrics:
        """One training step: ``epochs`` passes over ``samples``, each cut into ``mini_batches``
        shuffled parts with one optimizer update per part. ``step`` advances by one.
        ``batching`` cuts an update's samples into micro-batches instead of :func:`micro_batches`
        (a loss over several rows, like DPO's pairs, needs them in one micro-batch)."""
        samples = trainable_samples(samples, context=self.context_length, model=str(self.model_dir))
        updates = update_parts(samples, mini_batches=mini_batches, epochs=epochs, seed=self.config.seed, step=self.step)
        started = time.perf_counter()
        train_mode(self.model, self.config)
        lr = self._schedule_lr()
        sums: dict[str, float] = {}
        losses, norms, chunks = [], [], 0
        for update in updates:
            loss, norm, n = self._update(
                update,
                loss_fn,
                sums,
                tokens_per_sample=tokens_per_sample,
                batches=batching(update) if batching else None,
            )
            losses.append(loss)
            norms.append(norm)
            chunks += n
        self.step += 1
        tokens = sums.get("tokens", float(trained_tokens(samples)))
        per_token = lambda k: sums[k] / max(tokens, 1.0) if k in sums else float("nan")  # noqa: E731
        return StepMetrics(
            loss=statistics.fmean(losses),
            tokens=int(tokens),
            seconds=time.perf_counter() - started,
            grad_norm=statistics.fmean(norms),
            entropy=per_token("entropy"),
            kl=per_token("kl"),
            clip_fraction=per_token("clipped"),
            ratio_mean=per_token("ratio"),
            micro_batches=chunks,
            ratio_max=sums.get("ratio_max", float("nan")),
            lr=lr,
            updates=len(losses),
            tis_weight=per_token("tis_weight"),
            tis_capped=per_token("tis_capped"),
            logprob_gap=per_token("logprob_gap"),
        )

    def _schedule_lr(self) -> float:
        """Set this step's learning rate (:func:`step_lr`) on the optimizer; return it."""
        lr = step_lr(self.config, self.step, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def ppo_step(
        self,
        samples: Sequence[Sample],
        *,
        mini_batches: int = 1,
        epochs: int = 1,
        tokens_per_sample: float | None = None,
    ) -> StepMetrics:
        """One PPO-clip training step over ``samples`` (advantages and old logprobs set): one
        optimizer update by default, or ``epochs`` × ``mini_batches`` updates — the later ones
        are off-policy, which the importance ratio and its clipping account for.
        ``tokens_per_sample`` (Dr. GRPO) divides each update's token sum by that constant ×
        its samples instead of by its token count, so a step's scale no longer depends on how
        long its responses happened to be."""
        config = self.config

        def loss_fn(batch: _Batch, total: float) -> tuple[Any, dict[str, Any]]:
            ref = self._reference_logprobs(batch)
            logprobs, entropy = token_logprobs(self.model, batch, with_entropy=True)
            assert entropy is not None  # with_entropy=True
            loss, diag = ppo_clip_loss(
                logprobs,
                batch.old_logprobs,
                batch.advantages,
                batch.mask,
                clip_eps_low=config.clip_eps_low,
                clip_eps_high=config.clip_eps_high,
                ref_logprobs=ref,
                kl_coef=config.kl_coef,
                normalizer=total,
                behavior_logprobs=batch.behavior_logprobs,
                tis_cap=config.tis_cap,
            )
            if config.entropy_coef:
                loss = loss - config.entropy_coef * (entropy * batch.mask).sum() / total
            diag["entropy"] = (entropy.detach() * batch.mask).sum()
            return loss, diag

        if config.tis_cap is not None:
            samples = self.with_proximal_logprobs(samples)
        return self._step(
            samples, loss_fn, mini_batches=mini_batches, epochs=epochs, tokens_per_sample=tokens_per_sample
        )

    def with_proximal_logprobs(self, samples: Sequence[Sample]) -> list[Sample]:
        """``samples`` with the trainer's current logprobs as ``old_logprobs`` and the sampled ones
        moved to ``behavior_logprobs`` (TIS): one forward pass without gradients, in the mode the
        updates run in, so that an update from these weights starts at ratio 1."""
        import torch

        samples = trainable_samples(samples, context=self.context_length, model=str(self.model_dir))
        train_mode(self.model, self.config)
        proximal: dict[int, list[float]] = {}
        with torch.no_grad(), self._forward_precision():
            for chunk in micro_batches(samples, self.config.micro_batch_tokens):
                laid_out = _layout(chunk, self.device, share_prefix=not self.config.gradient_checkpointing)
                logprobs, _ = token_logprobs(self.model, laid_out)
                for sample, values in zip(chunk, response_values(chunk, laid_out, logprobs), strict=True):
                    proximal[id(sample)] = values
        return [replace(s, old_logprobs=proximal[id(s)], behavior_logprobs=s.old_logprobs) for s in samples]

    def nll_step(self, samples: Sequence[Sample]) -> StepMetrics:
        """One supervised (NLL) optimizer step over ``samples``' masked response tokens."""

        def loss_fn(batch: _Batch, total: float) -> tuple[Any, dict[str, Any]]:
            logprobs, _ = token_logprobs(self.model, batch)
            return nll_loss(logprobs, batch.mask, total), {"tokens": batch.mask.sum()}

        return self._step(samples, loss_fn)

    def sequence_logprob(self, samples: Sequence[Sample]) -> list[float]:
        """Sum of masked response-token logprobs of each sample under the current policy."""
        import torch

        self.model.eval()
        out = []
        with torch.no_grad(), self._forward_precision():
            for sample in samples:
                batch = _layout([sample], self.device)
                logprobs, _ = token_logprobs(self.model, batch)
                out.append(float((logprobs * batch.mask).sum()))
        return out

    # ---- weights ------------------------------------------------------------------------------
    def merged_state_dict(self) -> dict[str, torch.Tensor]:
        """The base model's weights with the LoRA adapter added in, named as the base model names
        them, without touching the model: each adapted weight is a new tensor ``W + ΔW``, every
        other entry is the live (detached) parameter. (peft's ``merge_adapter`` then
        ``unmerge_adapter`` would add and subtract ΔW in place, and in bfloat16 the rounding of
        each round trip drifts the frozen base weights a little more at every publish.)"""
        import torch
        from peft.tuners.lora import LoraLayer

        with torch.no_grad():
            base = self.model.get_base_model()
            state = {
                k.replace(".base_layer.", "."): v.detach() for k, v in base.state_dict().items() if "lora_" not in k
            }
            for name, module in base.named_modules():
                if not isinstance(module, LoraLayer) or module.merged or module.disable_adapters:
                    continue
                key = f"{name}.weight"
                weight = state[key]
                merged = weight.to(torch.float32, copy=True)  # W + ΔW in float32, rounded once (as peft)
                for adapter in module.active_adapters:
                    if adapter in module.scaling:
                        merged += module.get_delta_weight(adapter).float()  # type: ignore[attr-defined]  # on each layer type
                state[key] = merged.to(weight.dtype)
        return state

    def engine_state_dict(self) -> dict[str, torch.Tensor]:
        """Full base-model weights as the inference engine names them (LoRA merged in), copied."""
        import torch

        with torch.no_grad():
            if not self.is_lora:
                return {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            live = {t.data_ptr() for t in (*self.model.parameters(), *self.model.buffers())}
            return {k: v.clone() if v.data_ptr() in live else v for k, v in self.merged_state_dict().items()}

    # ---- checkpoints --------------------------------------------------------------------------
    def save_checkpoint(
        self, directory: str | Path, cursor: Any = None, extra: dict[str, Any] | None = None, keep: int = 2
    ) -> Path:
        """Write ``step-NNNNNN/`` (model, optimizer, step, cursor, and the record of the model it
        came from: :meth:`model_record`) and point ``latest`` at it.

        The ``latest`` pointer is replaced atomically after everything else is written, so a kill
        at any moment leaves the previous checkpoint intact and loadable.
        """
        import torch

        def fill(tmp: Path) -> None:
            trainable = (
                {k: v for k, v in self.model.state_dict().items()}
                if not self.is_lora
                else {k: v for k, v in self.model.named_parameters() if v.requires_grad}
            )
            torch.save(trainable, tmp / "model.pt")
            torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
            (tmp / "state.json").write_text(
                json.dumps(
                    {
                        "step": self.step,
                        "cursor": cursor,
                        "extra": extra or {},
                        "lora": self.is_lora,
                        "model": self.model_record(),
                        "time": time.time(),
                    }
                )
            )

        return commit_checkpoint(directory, self.step, fill, keep=keep)

    def load_checkpoint(self, directory: str | Path, *, optimizer: bool = True) -> dict[str, Any] | None:
        """Restore the latest checkpoint under ``directory``; returns its state (``step``,
        ``cursor``, ``extra``, ``model``) or None when there is none.

        A checkpoint written from another model (another architecture, other weights, other
        LoRA settings) is refused with :class:`~agentgrad.errors.InvalidInputError` naming both;
        one written before checkpoints recorded their model loads unchecked, with a log line.
        ``optimizer=False`` restores the weights and step only (for export).
        """
        target = latest_checkpoint(directory)
        return None if target is None else self.restore(target, optimizer=optimizer)

    def restore(self, target: str | Path, *, optimizer: bool = True) -> dict[str, Any]:
        """Load the one checkpoint ``target`` (a ``step-NNNNNN`` directory); see
        :meth:`load_checkpoint`."""
        import torch

        target = Path(target)
        state = json.loads((target / "state.json").read_text())
        self._check_record(target, state)
        weights = torch.load(target / "model.pt", map_location=self.device, weights_only=True)
        try:
            _missing, unexpected = self.model.load_state_dict(weights, strict=not self.is_lora)
        except RuntimeError as exc:  # shapes or names: another model
            from agentgrad.errors import InvalidInputError

            raise InvalidInputError(
                f"checkpoint {target} does not fit model {self.model_dir}: {str(exc).splitlines()[0]}"
            ) from exc
        if unexpected:
            raise ValueError(f"checkpoint {target} does not fit this model (unexpected keys {unexpected[:5]})")
        if optimizer:
            self.optimizer.load_state_dict(
                torch.load(target / "optimizer.pt", map_location=self.device, weights_only=True)
            )
        self.step = int(state["step"])
        log.info("resumed from %s (step %d)", target, self.step)
        return state

    def _check_record(self, target: Path, state: dict[str, Any]) -> None:
        """Refuse a checkpoint of another model; see :meth:`load_checkpoint`."""
        from agentgrad.errors import InvalidInputError

        record = state.get("model")
        if record is None:
            log.info(
                "checkpoint %s does not record the model it came from (written by an older agentgrad): "
                "loading it into %s unchecked",
                target,
                self.model_dir,
            )
            if bool(state.get("lora")) != self.is_lora:
                raise InvalidInputError(
                    f"checkpoint {target} holds {'a LoRA adapter' if state.get('lora') else 'full weights'}, but "
                    f"this trainer {'uses LoRA' if self.is_lora else 'fine-tunes all weights'} "
                    f"(TrainConfig.lora={self.config.lora})"
                )
            return
        mine = self.model_record()
        theirs_fp, mine_fp = record.get("fingerprint") or {}, mine["fingerprint"]
        problems = []
        if theirs_fp != mine_fp:
            fields = [
                f"{k} {theirs_fp.get(k)!r} vs {mine_fp.get(k)!r}" for k in mine_fp if theirs_fp.get(k) != mine_fp.get(k)
            ]
            problems.append("another architecture (" + ", ".join(fields) + ")")
        elif record.get("weights") and mine["weights"] and record["weights"] != mine["weights"]:
            problems.append(
                "other weights with the same architecture (a different model, or the model directory changed since)"
            )
        if _lora_key(record.get("lora")) != _lora_key(mine["lora"]):
            problems.append(
                f"other LoRA settings ({_describe_lora(record.get('lora'))} vs {_describe_lora(mine['lora'])})"
            )
        if problems:
            raise InvalidInputError(
                f"checkpoint {target} was written by a trainer of model {record.get('path')} "
                f"({describe_fingerprint(theirs_fp)}, {_describe_lora(record.get('lora'))}); this trainer has model "
                f"{mine['path']} ({describe_fingerprint(mine_fp)}, {_describe_lora(mine['lora'])}): "
                + "; ".join(problems)
                + f". Resume with the model it came from, or start over in another "
                f"output directory (or delete {target.parent})."
            )
        if record.get("path") != mine["path"]:
            log.info(
                "checkpoint %s came from %s; %s holds the same model (moved or copied)",
                target,
                record.get("path"),
                mine["path"],
            )


def _lora_key(lora: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """The LoRA settings that change the model (dropout only changes training)."""
    if lora is None:
        return None
    targets = lora.get("target_modules")
    return lora.get("r"), lora.get("alpha"), sorted(targets) if isinstance(targets, list) else targets


def _describe_lora(lora: dict[str, Any] | None) -> str:
    if lora is None:
        return "full fine-tuning"
    return f"LoRA r={lora.get('r')} alpha={lora.get('alpha')} targets={lora.get('target_modules')}"


# ---------------------------------------------------------------------------------------------
# the SFT loop
# ---------------------------------------------------------------------------------------------


def epoch_order(n: int, epoch: int, seed: int) -> list[int]:
    """The sample order of one epoch: a fixed shuffle per (seed, epoch), so a resumed run sees
    exactly the samples it would have seen."""
    order = list(range(n))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


def cursor_batches(n: int, batch_size: int, cursor: int, seed: int) -> Iterator[tuple[list[int], int]]:
    """Indices of successive full batches starting at ``cursor`` (samples consumed so far; a
    batch may run across an epoch boundary), each with the cursor after it."""
    orders: dict[int, list[int]] = {}
    while True:
        take = []
        for position in range(cursor, cursor + batch_size):
            epoch, offset = divmod(position, n)
            if epoch not in orders:
                orders = {epoch: epoch_order(n, epoch, seed)}
            take.append(orders[epoch][offset])
        cursor += batch_size
        yield take, cursor


__all__ = [
    "LoraSettings",
    "PolicyTrainer",
    "Sample",
    "StepMetrics",
    "TrainConfig",
    "check_model",
    "cursor_batches",
    "decayed_lr",
    "default_lr",
    "load_policy",
    "micro_batches",
    "model_fingerprint",
    "nll_loss",
    "ppo_clip_loss",
    "step_lr",
    "token_logprobs",
    "train_mode",
    "trainable_samples",
    "trained_tokens",
    "update_parts",
    "weights_digest",
]

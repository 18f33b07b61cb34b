"""Policy training over transformers (+ peft): the whole training loop in one file.

Read top to bottom: config → samples → model loading → micro-batching → forward (per-token
logprobs) → losses (PPO-clip, NLL) → one optimizer step → checkpoints → ``fit_sequences`` (the
SFT loop). GRPO (``algorithms/grpo.py``) and SFT (``algorithms/sft.py``) both drive a
:class:`PolicyTrainer`; weight publishing lives in :mod:`agentgrad.training.publish`.

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
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: str | list[str] = "all-linear"


@dataclass
class TrainConfig:
    """Optimizer, loss and batching settings shared by RL and SFT."""

    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    #: Adam's epsilon. Raising it towards typical gradient magnitudes damps the updates of
    #: parameters whose gradients are mostly noise (see docs/credit-assignment.md, "tuning").
    adam_eps: float = 1e-8
    grad_clip: float = 1.0
    #: Padded tokens (rows × longest row) per micro-batch; bounds activation memory.
    micro_batch_tokens: int = 8192
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    #: KL penalty to the reference model (0: off, and no reference forward pass).
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    #: None: full fine-tuning.
    lora: LoraSettings | None = None
    device: str = "auto"
    #: "auto": bf16 on a GPU that supports it, float32 otherwise (always on CPU).
    dtype: str = "auto"
    seed: int = 0


@dataclass
class Sample:
    """One training sequence: ``prompt_ids`` are context; ``response_ids`` are learned where
    ``mask`` is 1. ``old_logprobs`` (per response token) and ``advantage`` are for PPO."""

    prompt_ids: list[int]
    response_ids: list[int]
    mask: list[int] | None = None
    old_logprobs: list[float] | None = None
    advantage: float = 0.0

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("Sample.prompt_ids must not be empty")
        if self.mask is None:
            self.mask = [1] * len(self.response_ids)
        if len(self.mask) != len(self.response_ids):
            raise ValueError(f"Sample.mask has {len(self.mask)} entries for {len(self.response_ids)} response tokens")
        if self.old_logprobs is not None and len(self.old_logprobs) != len(self.response_ids):
            raise ValueError(f"Sample.old_logprobs has {len(self.old_logprobs)} entries for "
                             f"{len(self.response_ids)} response tokens")

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @classmethod
    def from_transition(cls, t: Any) -> Sample:
        """From an :class:`agentgrad.types.Transition` (its advantage and sampled logprobs)."""
        return cls(list(t.prompt_ids), list(t.response_ids), list(t.response_mask or [1] * len(t.response_ids)),
                   list(t.response_logprobs) if t.response_logprobs is not None else None, float(t.advantage))


# ---------------------------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------------------------

def _device_and_dtype(config: TrainConfig) -> tuple[Any, Any]:
    import torch

    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if config.dtype != "auto":
        return torch.device(device), getattr(torch, config.dtype)
    bf16 = device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return torch.device(device), torch.bfloat16 if bf16 else torch.float32


def load_policy(model_dir: str | Path, config: TrainConfig) -> Any:
    """The trainable model: full weights, or a fresh LoRA adapter over frozen weights."""
    import torch
    from transformers import AutoModelForCausalLM

    device, dtype = _device_and_dtype(config)
    torch.manual_seed(config.seed)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(device)
    if config.lora is not None:
        from peft import LoraConfig, get_peft_model

        lora = config.lora
        model = get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                 target_modules=lora.target_modules, task_type="CAUSAL_LM"))
    model.config.use_cache = False
    return model


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
    adv = torch.zeros(size)
    for b, (sample, row) in enumerate(zip(batch, rows)):
        suffix = row[prefix:]
        input_ids[b, :len(suffix)] = torch.tensor(suffix)
        attention[b, :prefix + len(suffix)] = 1
        start = len(sample.prompt_ids) - 1 - prefix  # position whose logits predict response token 0
        n = len(sample.response_ids)
        targets[b, start:start + n] = torch.tensor(sample.response_ids)
        mask[b, start:start + n] = torch.tensor(sample.mask, dtype=torch.float)
        if sample.old_logprobs is not None:
            old[b, start:start + n] = torch.tensor(sample.old_logprobs, dtype=torch.float)
        adv[b, start:start + n] = sample.advantage
    prefix_ids = torch.tensor([rows[0][:prefix]]) if prefix else None
    to = lambda x: None if x is None else x.to(device)  # noqa: E731
    return _Batch(to(prefix_ids), to(input_ids), to(attention), to(targets), to(mask), to(old), to(adv))


def _logits(model: Any, batch: _Batch) -> torch.Tensor:
    """Logits over the suffix positions, running the shared prefix once for the whole batch."""
    cache = None
    if batch.prefix_ids is not None:
        cache = model(input_ids=batch.prefix_ids, use_cache=True).past_key_values
        cache.batch_repeat_interleave(batch.input_ids.shape[0])
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention, past_key_values=cache,
                use_cache=cache is not None)
    return out.logits.float()


def token_logprobs(model: Any, batch: _Batch, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-position logprob of ``batch.targets`` (and the policy's entropy) under ``model``."""
    import torch

    logp = torch.log_softmax(_logits(model, batch), dim=-1)
    chosen = logp.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1) if with_entropy else None
    return chosen, entropy


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
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-level PPO-clip: ``max(-A·r, -A·clip(r, 1-eps_low, 1+eps_high))`` per token, with
    ``r = exp(logprob - old_logprob)``, plus ``kl_coef`` × the k3 estimate of KL(π‖π_ref),
    summed over masked tokens and divided by ``normalizer`` (default: the masked token count).

    Returns the loss and sums (not means) of per-token diagnostics, so callers can add them up
    over micro-batches: ``clipped`` (tokens where the clipped branch was taken), ``kl``,
    ``ratio`` and ``tokens``.
    """
    import torch

    old = torch.where(torch.isnan(old_logprobs), logprobs.detach(), old_logprobs)
    log_ratio = (logprobs - old).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    per_token = torch.maximum(unclipped, clipped)
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
            "tokens": tokens,
        }
    return loss, diagnostics


def nll_loss(logprobs: torch.Tensor, mask: torch.Tensor, normalizer: float) -> torch.Tensor:
    """Plain negative log-likelihood of the masked tokens, summed and divided by ``normalizer``."""
    return -(logprobs * mask).sum() / normalizer


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
    micro_batches: int = 0
    #: optimizer updates in this step (``epochs`` × ``mini_batches``)
    updates: int = 1

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
        self.config = config or TrainConfig()
        self.model = load_policy(self.model_dir, self.config)
        self.device = next(self.model.parameters()).device
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=self.config.lr, weight_decay=self.config.weight_decay,
                                           betas=self.config.betas, eps=self.config.adam_eps)
        self.step = 0
        self._reference: Any = None

    @property
    def is_lora(self) -> bool:
        return self.config.lora is not None

    def _reference_logprobs(self, batch: _Batch) -> torch.Tensor | None:
        """Logprobs under the reference policy (the initial weights), or None with KL off."""
        import torch

        if self.config.kl_coef <= 0:
            return None
        with torch.no_grad():
            if self.is_lora:
                with self.model.disable_adapter():
                    return token_logprobs(self.model, batch)[0]
            if self._reference is None:  # full fine-tuning needs a frozen copy
                self._reference = load_policy(self.model_dir, TrainConfig(**{**asdict(self.config), "lora": None}))
                self._reference.eval().requires_grad_(False)
            return token_logprobs(self._reference, batch)[0]

    def _update(self, samples: Sequence[Sample], loss_fn: LossFn, sums: dict[str, float]) -> tuple[float, float, int]:
        """One optimizer update over ``samples`` (micro-batched); adds the loss function's
        diagnostics into ``sums`` and returns (loss, grad norm, micro-batches)."""
        import torch

        total = float(sum(sum(s.mask) for s in samples))  # type: ignore[arg-type]
        loss_total = 0.0
        batches = micro_batches(samples, self.config.micro_batch_tokens)
        for chunk in batches:
            batch = _layout(chunk, self.device)
            loss, extra = loss_fn(batch, total)
            loss.backward()
            loss_total += float(loss.detach())
            for key, value in extra.items():
                sums[key] = sums.get(key, 0.0) + float(value)
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.config.grad_clip))
        if math.isfinite(grad_norm):
            self.optimizer.step()
        else:
            log.warning("non-finite gradient norm at step %d: update skipped", self.step + 1)
        self.optimizer.zero_grad(set_to_none=True)
        return loss_total, grad_norm, len(batches)

    def _step(self, samples: Sequence[Sample], loss_fn: LossFn, *, mini_batches: int = 1, epochs: int = 1) -> StepMetrics:
        """One training step: ``epochs`` passes over ``samples``, each cut into ``mini_batches``
        shuffled parts with one optimizer update per part. ``step`` advances by one."""
        samples = [s for s in samples if any(s.mask)]  # type: ignore[arg-type]
        if not samples:
            raise ValueError("no trainable tokens: every sample's mask is all zeros")
        if mini_batches < 1 or epochs < 1:
            raise ValueError(f"mini_batches and epochs must be >= 1, got {mini_batches} and {epochs}")
        started = time.perf_counter()
        self.model.train()
        rng = random.Random(f"{self.config.seed}:{self.step}")
        parts = min(mini_batches, len(samples))
        sums: dict[str, float] = {}
        losses, norms, chunks = [], [], 0
        for _epoch in range(epochs):
            order = list(samples)
            if parts > 1:
                rng.shuffle(order)
            for part in range(parts):
                loss, norm, n = self._update(order[part::parts], loss_fn, sums)
                losses.append(loss)
                norms.append(norm)
                chunks += n
        self.step += 1
        tokens = sums.get("tokens", float(sum(sum(s.mask) for s in samples)))  # type: ignore[arg-type]
        per_token = lambda k: sums[k] / max(tokens, 1.0) if k in sums else float("nan")  # noqa: E731
        return StepMetrics(
            loss=statistics.fmean(losses), tokens=int(tokens), seconds=time.perf_counter() - started,
            grad_norm=statistics.fmean(norms), entropy=per_token("entropy"), kl=per_token("kl"),
            clip_fraction=per_token("clipped"), ratio_mean=per_token("ratio"), micro_batches=chunks,
            updates=len(losses),
        )

    def ppo_step(self, samples: Sequence[Sample], *, mini_batches: int = 1, epochs: int = 1) -> StepMetrics:
        """One PPO-clip training step over ``samples`` (advantages and old logprobs set): one
        optimizer update by default, or ``epochs`` × ``mini_batches`` updates — the later ones
        are off-policy, which the importance ratio and its clipping account for."""
        config = self.config

        def loss_fn(batch: _Batch, total: float) -> tuple[Any, dict[str, Any]]:
            ref = self._reference_logprobs(batch)
            logprobs, entropy = token_logprobs(self.model, batch, with_entropy=True)
            loss, diag = ppo_clip_loss(logprobs, batch.old_logprobs, batch.advantages, batch.mask,
                                       clip_eps_low=config.clip_eps_low, clip_eps_high=config.clip_eps_high,
                                       ref_logprobs=ref, kl_coef=config.kl_coef, normalizer=total)
            if config.entropy_coef:
                loss = loss - config.entropy_coef * (entropy * batch.mask).sum() / total
            diag["entropy"] = (entropy.detach() * batch.mask).sum()
            return loss, diag

        return self._step(samples, loss_fn, mini_batches=mini_batches, epochs=epochs)

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
        with torch.no_grad():
            for sample in samples:
                batch = _layout([sample], self.device)
                logprobs, _ = token_logprobs(self.model, batch)
                out.append(float((logprobs * batch.mask).sum()))
        return out

    # ---- weights ------------------------------------------------------------------------------
    def engine_state_dict(self) -> dict[str, torch.Tensor]:
        """Full base-model weights as the inference engine names them (LoRA merged in)."""
        import torch

        with torch.no_grad():
            if not self.is_lora:
                return {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            self.model.merge_adapter()
            try:
                base = self.model.get_base_model()
                return {k.replace(".base_layer.", "."): v.detach().clone()
                        for k, v in base.state_dict().items() if "lora_" not in k}
            finally:
                self.model.unmerge_adapter()

    # ---- checkpoints --------------------------------------------------------------------------
    def save_checkpoint(self, directory: str | Path, cursor: Any = None, extra: dict[str, Any] | None = None,
                        keep: int = 2) -> Path:
        """Write ``step-NNNNNN/`` (model, optimizer, step, cursor) and point ``latest`` at it.

        The ``latest`` pointer is replaced atomically after everything else is written, so a kill
        at any moment leaves the previous checkpoint intact and loadable.
        """
        import torch

        root = Path(directory)
        target = root / f"step-{self.step:06d}"
        tmp = root / f".tmp-step-{self.step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        trainable = {k: v for k, v in self.model.state_dict().items()} if not self.is_lora else {
            k: v for k, v in self.model.named_parameters() if v.requires_grad}
        torch.save(trainable, tmp / "model.pt")
        torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
        (tmp / "state.json").write_text(json.dumps({"step": self.step, "cursor": cursor, "extra": extra or {},
                                                    "lora": self.is_lora, "time": time.time()}))
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
        pointer = root / ".latest.tmp"
        pointer.write_text(target.name)
        os.replace(pointer, root / "latest")
        for old in sorted(root.glob("step-*"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        return target

    def load_checkpoint(self, directory: str | Path) -> dict[str, Any] | None:
        """Restore the latest checkpoint under ``directory``; returns its state (``step``,
        ``cursor``, ``extra``) or None when there is none."""
        import torch

        root = Path(directory)
        pointer = root / "latest"
        if not pointer.exists():
            return None
        target = root / pointer.read_text().strip()
        state = json.loads((target / "state.json").read_text())
        weights = torch.load(target / "model.pt", map_location=self.device, weights_only=True)
        missing, unexpected = self.model.load_state_dict(weights, strict=not self.is_lora)
        if unexpected:
            raise ValueError(f"checkpoint {target} does not fit this model (unexpected keys {unexpected[:5]})")
        self.optimizer.load_state_dict(torch.load(target / "optimizer.pt", map_location=self.device, weights_only=True))
        self.step = int(state["step"])
        log.info("resumed from %s (step %d)", target, self.step)
        return state


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


def fit_sequences(
    trainer: PolicyTrainer,
    samples: Sequence[Sample],
    *,
    steps: int,
    batch_size: int = 16,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every: int = 1,
    on_step: Callable[[int, StepMetrics], None] | None = None,
) -> list[StepMetrics]:
    """Supervised fine-tuning on ``samples`` for ``steps`` optimizer steps (NLL on masked tokens).

    With ``checkpoint_dir``, the run resumes from its latest checkpoint (model, optimizer, step
    and the data cursor) and checkpoints every ``checkpoint_every`` steps, so a killed run
    continues where it stopped and sees the same data order.
    """
    if not samples:
        raise ValueError("fit_sequences needs at least one sample")
    cursor = 0
    if checkpoint_dir is not None:
        state = trainer.load_checkpoint(checkpoint_dir)
        cursor = int(state["cursor"]) if state else 0
    history: list[StepMetrics] = []
    batches = cursor_batches(len(samples), batch_size, cursor, trainer.config.seed)
    while trainer.step < steps:
        indices, cursor = next(batches)
        metrics = trainer.nll_step([samples[i] for i in indices])
        history.append(metrics)
        if checkpoint_dir is not None and (trainer.step % checkpoint_every == 0 or trainer.step == steps):
            trainer.save_checkpoint(checkpoint_dir, cursor=cursor)
        if on_step is not None:
            on_step(trainer.step, metrics)
    return history


__all__ = [
    "LoraSettings", "PolicyTrainer", "Sample", "StepMetrics", "TrainConfig", "cursor_batches", "fit_sequences",
    "load_policy", "micro_batches", "nll_loss", "ppo_clip_loss", "token_logprobs",
]

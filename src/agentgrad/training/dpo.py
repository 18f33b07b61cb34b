"""DPO (Rafailov et al. 2023, arXiv:2305.18290) on preference pairs drawn from GRPO's groups.

A group's rollouts answer the same task; its best and worst completions make a (chosen,
rejected) pair (:func:`agentgrad.adapters.advantages.preference_pairs`). The loss of a pair is

    −log σ(β · [(log π(y_w) − log π_ref(y_w)) − (log π(y_l) − log π_ref(y_l))])

with sequence log-probabilities summed over the trained (mask 1) tokens. The reference is the
start policy, as for the KL penalty (:meth:`PolicyTrainer.reference_logprobs`: with LoRA the
same model with its adapter disabled, no second copy). Unlike PPO it needs no advantages and no
sampled logprobs: the pair and the reference are the whole signal. A step is one optimizer
update over every pair, through the trainer's own step (learning-rate schedule, gradient
clipping, the non-finite guard, micro-batching — cut so that a pair's two rows always share a
micro-batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentgrad.training.policy import PolicyTrainer, Sample, StepMetrics, micro_batches, token_logprobs

if TYPE_CHECKING:
    import torch

    from agentgrad.training.policy import _Batch


def dpo_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, ref_chosen: torch.Tensor, ref_rejected: torch.Tensor, beta: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The DPO loss **summed** over pairs (callers divide by their pair count, so micro-batches
    add up), from per-pair sequence logprobs under the policy and the reference.

    Diagnostics, also sums: ``margin`` (β × the log-ratio difference, the implicit reward
    margin), ``accuracy`` (pairs whose margin is > 0), ``pairs``.
    """
    import torch.nn.functional as F

    margin = beta * ((chosen - ref_chosen) - (rejected - ref_rejected))
    loss = -F.logsigmoid(margin).sum()
    diagnostics = {
        "margin": margin.detach().sum(),
        "accuracy": (margin.detach() > 0).float().sum(),
        "pairs": margin.new_tensor(float(margin.numel())),
    }
    return loss, diagnostics


@dataclass
class DPOMetrics:
    """What one DPO step did: the trainer's step metrics (``loss`` is the mean over pairs,
    ``entropy`` and ``kl`` — the k3 estimate of KL(π‖π_ref) — per trained token, as PPO reports
    them) and the pairs' mean implicit reward ``margin`` and ``accuracy`` (share with margin > 0),
    measured in the forward pass that made the update."""

    step: StepMetrics
    pairs: int
    margin: float
    accuracy: float


@dataclass
class _Pair:
    """A pair as :func:`micro_batches` sees it: two rows as long as the longer one."""

    chosen: Sample
    rejected: Sample

    @property
    def length(self) -> int:
        return max(self.chosen.length, self.rejected.length)


def dpo_step(trainer: PolicyTrainer, pairs: Sequence[tuple[Sample, Sample]], beta: float = 0.1) -> DPOMetrics:
    """One DPO optimizer step of ``trainer`` over ``(chosen, rejected)`` pairs, through the
    trainer's own step (learning-rate schedule, gradient clipping, ``step`` + 1). ``beta`` is
    DPO's temperature: how far (in log-ratio to the reference) the policy may move to separate
    the pair — smaller lets it move further."""
    if beta <= 0:
        raise ValueError(f"DPO beta must be > 0, got {beta!r}")
    if not pairs:
        raise ValueError("dpo_step needs at least one (chosen, rejected) pair")
    for number, pair in enumerate(pairs):
        if not all(any(s.mask or ()) for s in pair):
            raise ValueError(f"pair {number} has a sequence without trained tokens (its mask is all zeros)")
    n_pairs = float(len(pairs))
    seen: dict[str, float] = {"margin": 0.0, "accuracy": 0.0}

    def rows_by_pair(samples: Sequence[Sample]) -> list[list[Sample]]:
        """Micro-batches of whole pairs (consecutive samples), half the token budget per pair:
        a pair is two rows as long as its longer member."""
        rows: list[Any] = [_Pair(c, r) for c, r in zip(samples[0::2], samples[1::2], strict=True)]
        chunks: list[list[Any]] = micro_batches(rows, max(1, trainer.config.micro_batch_tokens // 2))
        return [[s for p in chunk for s in (p.chosen, p.rejected)] for chunk in chunks]

    def loss_fn(batch: _Batch, _tokens: float) -> tuple[Any, dict[str, Any]]:
        ref = trainer.reference_logprobs(batch)
        logprobs, entropy = token_logprobs(trainer.model, batch, with_entropy=True)
        assert entropy is not None
        sequence = (logprobs * batch.mask).sum(-1)
        ref_sequence = (ref * batch.mask).sum(-1)
        loss, diag = dpo_loss(sequence[0::2], sequence[1::2], ref_sequence[0::2], ref_sequence[1::2], beta)
        seen["margin"] += float(diag["margin"])
        seen["accuracy"] += float(diag["accuracy"])
        delta = (ref - logprobs.detach()).clamp(-20.0, 20.0)
        return loss / n_pairs, {
            "kl": ((delta.exp() - delta - 1.0) * batch.mask).sum(),
            "entropy": (entropy.detach() * batch.mask).sum(),
            "tokens": batch.mask.sum(),
        }

    step = trainer._step([s for pair in pairs for s in pair], loss_fn, batching=rows_by_pair)
    return DPOMetrics(step=step, pairs=len(pairs), margin=seen["margin"] / n_pairs, accuracy=seen["accuracy"] / n_pairs)


__all__ = ["DPOMetrics", "dpo_loss", "dpo_step"]

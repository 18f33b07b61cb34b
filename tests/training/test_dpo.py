"""The DPO loss by hand, and real DPO steps on the tiny model (full weights and LoRA)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from agentgrad.training import LoraSettings, PolicyTrainer, Sample, TrainConfig  # noqa: E402
from agentgrad.training.dpo import dpo_loss, dpo_step  # noqa: E402


def test_dpo_loss_matches_hand_computation():
    # pair 0: β = 0.5, policy − reference: chosen −1 − (−2) = +1, rejected −3 − (−2) = −1
    #         margin = 0.5 · (1 − (−1)) = 1 → loss = −log σ(1) = log(1 + e^−1) = 0.313262
    # pair 1: policy == reference → margin 0 → loss = log 2 = 0.693147
    # pair 2: chosen −4 − (−3) = −1, rejected −1 − (−2) = +1 → margin −1 → loss = log(1 + e) = 1.313262
    chosen, rejected = torch.tensor([-1.0, -5.0, -4.0]), torch.tensor([-3.0, -6.0, -1.0])
    ref_chosen, ref_rejected = torch.tensor([-2.0, -5.0, -3.0]), torch.tensor([-2.0, -6.0, -2.0])
    loss, diag = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=0.5)
    assert loss.item() == pytest.approx(math.log1p(math.exp(-1)) + math.log(2) + math.log1p(math.e), abs=1e-5)
    assert loss.item() == pytest.approx(0.313262 + 0.693147 + 1.313262, abs=1e-5)
    assert diag["margin"].item() == pytest.approx(1.0 + 0.0 - 1.0, abs=1e-6)
    assert diag["accuracy"].item() == 1.0 and diag["pairs"].item() == 3.0  # only pair 0 has margin > 0


def _pairs() -> list[tuple[Sample, Sample]]:
    prefix = list(range(3, 40))  # a shared "system prompt"; each pair answers one prompt
    return [(Sample(prefix + [50 + i], [100, 101, 102]), Sample(prefix + [50 + i], [200, 201])) for i in range(3)]


def _margins(trainer: PolicyTrainer, pairs) -> list[float]:
    chosen = trainer.sequence_logprob([c for c, _ in pairs])
    rejected = trainer.sequence_logprob([r for _, r in pairs])
    return [c - r for c, r in zip(chosen, rejected, strict=True)]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_dpo_steps_separate_the_pair_against_the_start_policy(tiny_model_dir, lora):
    config = TrainConfig(lr=3e-3, lora=LoraSettings(r=4) if lora else None)
    trainer = PolicyTrainer(tiny_model_dir, config)
    pairs = _pairs()
    before = _margins(trainer, pairs)
    first = dpo_step(trainer, pairs, beta=0.1)
    # Policy == reference at the start: every margin is 0, the loss log 2, the accuracy 0 (no margin > 0).
    assert first.step.loss == pytest.approx(math.log(2), abs=1e-5)
    assert first.margin == pytest.approx(0.0, abs=1e-5) and first.step.kl == pytest.approx(0.0, abs=1e-6)
    assert first.pairs == 3 and first.step.tokens == 3 * (3 + 2) and first.step.entropy > 0
    for _ in range(3):
        last = dpo_step(trainer, pairs, beta=0.1)
    after = _margins(trainer, pairs)
    assert all(a > b + 0.5 for a, b in zip(after, before, strict=True))
    assert last.step.loss < first.step.loss and last.accuracy == 1.0 and last.margin > 0 and last.step.kl > 0
    assert trainer.step == 4
    # The reference stayed the start policy (the disabled adapter, or the frozen copy).
    from agentgrad.training.policy import _layout

    batch = _layout([pairs[0][0]], trainer.device)
    start = PolicyTrainer(tiny_model_dir, TrainConfig(lora=None))
    with torch.no_grad():
        from agentgrad.training.policy import token_logprobs

        expected = token_logprobs(start.model, batch)[0]
    assert torch.allclose(trainer.reference_logprobs(batch), expected, atol=1e-5)


def test_micro_batches_keep_pairs_together_and_do_not_change_the_update(tiny_model_dir):
    results = []
    for budget in (10_000, 1):  # all pairs in one micro-batch vs one pair per micro-batch
        trainer = PolicyTrainer(tiny_model_dir, TrainConfig(lr=1e-3, micro_batch_tokens=budget))
        dpo_step(trainer, _pairs(), beta=0.5)
        results.append({k: v.detach().clone() for k, v in trainer.model.named_parameters()})
    for name, value in results[0].items():
        assert torch.allclose(value, results[1][name], atol=1e-4), name  # Adam step 1 moves ~lr=1e-3


def test_dpo_step_refuses_bad_input(tiny_model_dir):
    trainer = PolicyTrainer(tiny_model_dir, TrainConfig(lr=1e-3))
    with pytest.raises(ValueError, match="beta must be > 0"):
        dpo_step(trainer, _pairs(), beta=0.0)
    with pytest.raises(ValueError, match="at least one"):
        dpo_step(trainer, [], beta=0.1)
    chosen, _ = _pairs()[0]
    with pytest.raises(ValueError, match="without trained tokens"):
        dpo_step(trainer, [(chosen, Sample([1, 2], [3], mask=[0]))], beta=0.1)
    assert trainer.step == 0

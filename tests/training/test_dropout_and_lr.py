"""Dropout is off while training unless asked (on-policy ratios are 1); the default learning rate
follows the model's size and is logged; an explicit one is kept."""

from __future__ import annotations

import dataclasses
import logging
import random
from itertools import pairwise

import pytest

torch = pytest.importorskip("torch")

import agentgrad.training.policy as policy  # noqa: E402
from agentgrad.training import (  # noqa: E402
    LoraSettings,
    PolicyTrainer,
    Sample,
    TrainConfig,
    default_lr,
)


def _samples() -> list[Sample]:
    rng = random.Random(0)
    prefix = [rng.randrange(5, 500) for _ in range(40)]  # shared: the step runs it once, batched
    return [
        Sample(
            prefix + [rng.randrange(5, 500) for _ in range(5)],
            [rng.randrange(5, 500) for _ in range(30)],
            advantage=rng.choice([-1.0, 1.0]),
        )
        for _ in range(16)
    ]


def _first_step(trainer: PolicyTrainer, monkeypatch) -> tuple[policy.StepMetrics, list, list]:
    """One PPO step whose old logprobs are the no-grad forward's; returns the metrics and, per
    micro-batch, the logprobs the loss saw and the old ones."""
    samples = _samples()
    trainer.model.eval()
    with torch.no_grad():
        for s in samples:
            batch = policy._layout([s], trainer.device)
            logprobs, _ = policy.token_logprobs(trainer.model, batch)
            s.old_logprobs = logprobs[batch.mask.bool()].tolist()
    seen, old = [], []
    real = policy.ppo_clip_loss

    def spy(logprobs, old_logprobs, advantages, mask, **kwargs):
        seen.append(logprobs.detach()[mask.bool()])
        old.append(old_logprobs[mask.bool()])
        return real(logprobs, old_logprobs, advantages, mask, **kwargs)

    monkeypatch.setattr(policy, "ppo_clip_loss", spy)
    return trainer.ppo_step(samples), seen, old


def test_first_ppo_step_is_on_policy_with_dropout_in_the_config(model_zoo, monkeypatch):
    model_dir = model_zoo["gpt2"]  # resid/embd/attn dropout 0.1
    metrics, seen, old = _first_step(PolicyTrainer(model_dir, TrainConfig(lr=1e-3)), monkeypatch)
    assert metrics.clip_fraction == 0.0 and metrics.ratio_mean == pytest.approx(1.0, abs=1e-6)
    for a, b in zip(seen, old, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)  # every token's ratio is 1
    # asked for, dropout is back: the same step's logprobs then differ from the no-grad forward's
    monkeypatch.undo()
    metrics, seen, old = _first_step(PolicyTrainer(model_dir, TrainConfig(lr=1e-3, dropout=True)), monkeypatch)
    assert max(float((a - b).abs().max()) for a, b in zip(seen, old, strict=True)) > 0.05


def test_gradients_flow_with_dropout_off(model_zoo):
    trainer = PolicyTrainer(model_zoo["gpt2"], TrainConfig(lr=1e-2))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.nll_step(_samples())
    assert not trainer.model.training
    assert sum(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters()) > 10


def test_lora_dropout_without_training_dropout_is_reported(tiny_model_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="agentgrad.training.policy"):
        PolicyTrainer(tiny_model_dir, TrainConfig(lr=1e-3, lora=LoraSettings(r=4, dropout=0.05)))
    assert "LoraSettings(dropout=0.05) has no effect" in caplog.text


def test_default_lr_rule():
    assert default_lr(870_000) == 2e-4  # the tiny model: the measured rate
    assert default_lr(10) == 2e-4 and default_lr(7_000_000_000) == 1e-6  # constant outside the anchors
    assert default_lr(124_000_000) == 5e-6 and default_lr(500_000_000) == 1.7e-6
    assert default_lr(500_000_000, lora=True) == 1.7e-5
    assert default_lr(870_000, lora=True) == policy.LORA_LR_MAX
    sizes = [10**k for k in range(5, 11)]
    assert all(default_lr(a) >= default_lr(b) for a, b in pairwise(sizes))


def test_lr_none_is_picked_from_the_model_and_logged(tiny_model_dir, caplog):
    config = TrainConfig()
    assert config.lr is None
    with caplog.at_level(logging.INFO, logger="agentgrad.training.policy"):
        trainer = PolicyTrainer(tiny_model_dir, config)
    assert trainer.config.lr == 2e-4 and trainer.optimizer.param_groups[0]["lr"] == 2e-4
    assert config.lr is None  # the caller's config is not changed
    assert f"learning rate 0.0002, picked for {trainer.n_params:,} parameters" in caplog.text
    assert 800_000 < trainer.n_params < 900_000
    lora = PolicyTrainer(tiny_model_dir, TrainConfig(lora=LoraSettings(r=4)))
    assert lora.n_params == trainer.n_params and lora.config.lr == policy.LORA_LR_MAX


def test_an_explicit_lr_is_kept(tiny_model_dir, caplog):
    with caplog.at_level(logging.INFO, logger="agentgrad.training.policy"):
        trainer = PolicyTrainer(tiny_model_dir, TrainConfig(lr=1e-5))
    assert trainer.config.lr == 1e-5 and trainer.optimizer.param_groups[0]["lr"] == 1e-5
    assert "picked for" not in caplog.text
    assert dataclasses.replace(trainer.config, lr=None).lr is None

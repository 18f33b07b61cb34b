"""Truncated importance sampling (``TrainConfig.tis_cap``): the loss by hand, and the trainer's
proximal logprobs on the tiny model."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from agentgrad.training import PolicyTrainer, Sample, TrainConfig, ppo_clip_loss  # noqa: E402


def test_tis_weights_each_token_by_the_capped_ratio_to_the_sampler():
    logprobs = torch.tensor([[-1.0, -2.0, -0.5]])
    old = torch.tensor([[-1.0, -2.0, -0.5]])  # proximal = current: r = 1, no clipping
    behavior = torch.tensor([[-1.5, -1.0, float("nan")]])
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    mask = torch.ones(1, 3)
    loss, diag = ppo_clip_loss(logprobs, old, adv, mask, behavior_logprobs=behavior, tis_cap=1.5)
    # token 0: w = min(e^0.5, 1.5) = 1.5 (capped); token 1: w = e^-1; token 2: sampler unknown → w = 1
    weights = [1.5, math.exp(-1.0), 1.0]
    expected = (-1.0 * weights[0] - 1.0 * weights[1] + 1.0 * weights[2]) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-5)
    assert diag["tis_weight"].item() == pytest.approx(sum(weights), abs=1e-5)
    assert diag["tis_capped"].item() == 1
    assert diag["logprob_gap"].item() == pytest.approx(0.5 + 1.0, abs=1e-5)
    # Without a cap the sampler's logprobs are ignored: plain PPO-clip.
    plain, plain_diag = ppo_clip_loss(logprobs, old, adv, mask, behavior_logprobs=behavior)
    assert plain.item() == pytest.approx((-1.0 - 1.0 + 1.0) / 3, abs=1e-6) and "tis_weight" not in plain_diag


def test_a_tis_cap_below_one_is_refused():
    with pytest.raises(ValueError, match="tis_cap"):
        TrainConfig(tis_cap=0.5)


def test_proximal_logprobs_are_the_trainers_and_the_first_update_is_at_ratio_one(tiny_model_dir):
    trainer = PolicyTrainer(tiny_model_dir, TrainConfig(lr=1e-3, tis_cap=2.0))
    prompt, response = list(range(3, 30)), [100, 101, 102]
    sampled = [-3.0, -4.0, -5.0]  # what a stale engine reported
    samples = [
        Sample(prompt, response, old_logprobs=sampled, advantage=1.0),
        Sample(prompt[:-1], [7, 8], advantage=-1.0),
    ]
    proximal = trainer.with_proximal_logprobs(samples)
    assert [s.behavior_logprobs for s in proximal] == [sampled, None]
    own = [trainer.sequence_logprob([s])[0] for s in samples]
    assert [sum(s.old_logprobs) for s in proximal] == pytest.approx(own, abs=1e-4)
    metrics = trainer.ppo_step(samples)
    assert metrics.ratio_mean == pytest.approx(1.0, abs=1e-5) and metrics.clip_fraction == 0.0
    # The gap is |proximal - sampled| over the tokens whose sampler is known (the second sample's are not).
    gap = sum(abs(a - b) for a, b in zip(proximal[0].old_logprobs, sampled, strict=True)) / 5
    assert metrics.logprob_gap == pytest.approx(gap, rel=1e-4)
    assert 0 < metrics.tis_weight <= 2.0

"""The Tinker backend's mapping of AgentGrad samples onto Tinker data, checked by hand.

The end-to-end run against a real SkyRL Tinker server is ``make test-scale`` (tests/scale/);
these are the fast checks of the arithmetic it relies on.
"""

from __future__ import annotations

import math

import pytest

from agentgrad.training.policy import LoraSettings, Sample, TrainConfig
from agentgrad.training.tinker import (
    TinkerError,
    TinkerSettings,
    _refuse_unsupported,
    advantage_scales,
    datum_fields,
    ppo_stats,
)

# Two samples of one update. Sample 1: three trained tokens, advantage +1, importance ratios
# 1, 1.5, 1 (current minus sampled logprob: 0, ln 1.5, 0). Sample 2: three response tokens of
# which two are trained, advantage -0.5, ratios 0.5 and 1 on the trained ones.
OLD_1, OLD_2 = [-1.0, -2.0, -0.5], [-1.0, -3.0, -2.0]
NEW_1 = [-1.0, -2.0 + math.log(1.5), -0.5]
NEW_2 = [-1.0 + math.log(0.5), -7.0, -2.0]
S1 = Sample([10, 11], [20, 21, 22], [1, 1, 1], OLD_1, advantage=1.0)
S2 = Sample([10], [30, 31, 32], [1, 0, 1], OLD_2, advantage=-0.5)
CLIP_LOW, CLIP_HIGH = 0.8, 1.28

# By hand, AgentGrad's loss (per token max(-A·r, -A·clip(r)), summed, divided by N = 5 tokens):
#   sample 1: -1, -min(1.5, 1.28) = -1.28, -1          → -3.28
#   sample 2: max(0.25, 0.4) = 0.4, max(0.5, 0.5) = 0.5 →  0.9
#   loss = (-3.28 + 0.9) / 5 = -0.476
HAND_LOSS = -0.476


def _current(sample: Sample, response_logprobs: list[float]) -> list[float]:
    """What the server returns: logprobs per target position (prompt targets first)."""
    return [0.0] * (len(sample.prompt_ids) - 1) + response_logprobs


def _server_loss(samples: list[Sample], current: list[list[float]], reduction: str) -> float:
    """The server's reduction, written from SkyRL 0.3's source: ``loss_fns.ppo_loss`` gives
    ``-w·min(r·A, clip(r)·A)`` per token; ``backends/jax.py`` divides each sequence's sum by its
    weights' sum, sums the sequences and divides the gradient by their count. The hosted
    service sums."""
    scales = advantage_scales(samples, 5.0, reduction)  # type: ignore[arg-type]
    total = 0.0
    for sample, row, scale in zip(samples, current, scales, strict=True):
        _, fields = datum_fields(sample, scale=scale)
        per_token = []
        for w, lp, old, adv in zip(fields["weights"], row, fields["logprobs"], fields["advantages"], strict=True):
            r = math.exp(lp - old)
            per_token.append(-w * min(r * adv, min(max(r, CLIP_LOW), CLIP_HIGH) * adv))
        total += sum(per_token) / sum(fields["weights"]) if reduction == "sequence_mean" else sum(per_token)
    return total / len(samples) if reduction == "sequence_mean" else total


def test_a_datum_shifts_tokens_masks_the_prompt_and_scales_advantages():
    model_input, fields = datum_fields(Sample([1, 2, 3], [4, 5], [1, 1], [-0.5, -1.0], advantage=2.0), scale=0.5)
    assert model_input == [1, 2, 3, 4]
    assert fields == {
        "target_tokens": [2, 3, 4, 5],
        "weights": [0.0, 0.0, 1.0, 1.0],
        "logprobs": [0.0, 0.0, -0.5, -1.0],
        "advantages": [0.0, 0.0, 1.0, 1.0],
    }


def test_untrained_response_tokens_carry_no_weight_and_no_advantage():
    _, fields = datum_fields(S2, scale=2.0)
    assert fields["weights"] == [1.0, 0.0, 1.0]
    assert fields["advantages"] == [-1.0, 0.0, -1.0]
    assert fields["logprobs"] == [-1.0, 0.0, -2.0]


def test_scales_by_hand():
    # sequence_mean: B·nᵢ/N = 2·3/5 and 2·2/5; sum: 1/N
    assert advantage_scales([S1, S2], 5.0, "sequence_mean") == pytest.approx([1.2, 0.8])
    assert advantage_scales([S1, S2], 5.0, "sum") == pytest.approx([0.2, 0.2])


@pytest.mark.parametrize("reduction", ["sequence_mean", "sum"])
def test_the_servers_reduction_of_the_scaled_data_is_agentgrads_loss(reduction):
    current = [_current(S1, NEW_1), _current(S2, NEW_2)]
    assert _server_loss([S1, S2], current, reduction) == pytest.approx(HAND_LOSS)


def test_agentgrads_own_loss_function_agrees_with_the_hand_value():
    torch = pytest.importorskip("torch")
    from agentgrad.training.policy import ppo_clip_loss

    logprobs = torch.tensor([NEW_1, NEW_2])
    old = torch.tensor([OLD_1, OLD_2])
    advantages = torch.tensor([[1.0] * 3, [-0.5] * 3])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
    loss, diag = ppo_clip_loss(logprobs, old, advantages, mask, clip_eps_low=0.2, clip_eps_high=0.28)
    assert float(loss) == pytest.approx(HAND_LOSS, abs=1e-6)
    assert float(diag["clipped"]) == 2


def test_step_diagnostics_from_the_returned_logprobs():
    stats = ppo_stats([S1, S2], [_current(S1, NEW_1), _current(S2, NEW_2)], 5.0, clip_low=CLIP_LOW, clip_high=CLIP_HIGH)
    assert stats.loss == pytest.approx(HAND_LOSS)
    assert stats.tokens == 5
    assert stats.clipped == 2  # ratio 1.5 with A > 0, ratio 0.5 with A < 0
    assert stats.ratio == pytest.approx(1 + 1.5 + 1 + 0.5 + 1)
    assert stats.ratio_max == pytest.approx(1.5)


def test_a_sample_without_sampled_logprobs_is_refused():
    with pytest.raises(TinkerError, match="no sampled logprobs"):
        datum_fields(Sample([1], [2, 3], [1, 1], None, advantage=1.0))
    with pytest.raises(TinkerError, match="no sampled logprobs"):
        datum_fields(Sample([1], [2, 3], [1, 1], [-1.0, float("nan")], advantage=1.0))


@pytest.mark.parametrize(
    ("config", "named"),
    [
        (TrainConfig(kl_coef=0.1), "kl_coef"),
        (TrainConfig(entropy_coef=0.01), "entropy_coef"),
        (TrainConfig(dropout=True), "dropout"),
        (TrainConfig(lora=LoraSettings(r=8, alpha=64)), "lora alpha"),
        (TrainConfig(autocast="bfloat16"), "autocast"),
    ],
)
def test_settings_the_server_cannot_honour_are_refused(config, named):
    with pytest.raises(TinkerError, match=named):
        _refuse_unsupported(config)


def test_honoured_settings_pass():
    _refuse_unsupported(TrainConfig(lr=1e-4, lora=LoraSettings(r=8), lr_decay="cosine", grad_clip=0.5))


def test_settings_are_checked():
    with pytest.raises(ValueError, match="base_url"):
        TinkerSettings("127.0.0.1:8000")
    with pytest.raises(ValueError, match="reduction"):
        TinkerSettings("http://127.0.0.1:8000", reduction="mean")  # type: ignore[arg-type]


def test_datums_are_tinker_objects():
    pytest.importorskip("tinker")
    from agentgrad.training.tinker import to_datums

    data = to_datums([S1, S2], normalizer=5.0, reduction="sequence_mean")
    assert [d.model_input.to_ints() for d in data] == [[10, 11, 20, 21], [10, 30, 31]]
    assert data[0].loss_fn_inputs["advantages"].tolist() == pytest.approx([0.0, 1.2, 1.2, 1.2])
    assert data[1].loss_fn_inputs["target_tokens"].tolist() == [30, 31, 32]


def test_a_steps_updates_are_cut_once_for_every_trainer():
    """Both trainers take a step's updates and rate from ``update_parts`` and ``step_lr``: every
    epoch covers each sample once, the cut depends only on (seed, step), one part keeps the order."""
    from agentgrad.training.policy import step_lr, update_parts

    samples = [Sample([1], [i], [1], [-1.0], advantage=float(i)) for i in range(7)]
    updates = update_parts(samples, mini_batches=3, epochs=2, seed=5, step=4)
    assert [len(u) for u in updates] == [3, 2, 2, 3, 2, 2]
    for epoch in (updates[:3], updates[3:]):
        assert sorted(s.response_ids[0] for u in epoch for s in u) == list(range(7))
    assert update_parts(samples, mini_batches=3, epochs=2, seed=5, step=4) == updates
    assert update_parts(samples, mini_batches=3, epochs=2, seed=5, step=5) != updates
    assert update_parts(samples, mini_batches=1, epochs=1, seed=5, step=4) == [samples]
    assert len(update_parts(samples[:2], mini_batches=4, epochs=1, seed=0, step=0)) == 2  # at most one part per sample
    with pytest.raises(ValueError, match="mini_batches and epochs"):
        update_parts(samples, mini_batches=0, epochs=1, seed=0, step=0)

    assert step_lr(TrainConfig(lr=1e-3), 3, None) == 1e-3
    assert step_lr(TrainConfig(lr=1e-3, lr_decay="linear", lr_final=0.5), 4, 5) == pytest.approx(5e-4)
    with pytest.raises(ValueError, match="run's length"):
        step_lr(TrainConfig(lr=1e-3, lr_decay="cosine"), 0, None)


def test_samples_without_trained_tokens_or_longer_than_the_context_are_refused():
    from agentgrad.errors import InvalidInputError
    from agentgrad.training.policy import trainable_samples

    untrained = Sample([1], [2], [0], [-1.0])
    assert trainable_samples([S1, untrained], context=8, model="m") == [S1]
    with pytest.raises(ValueError, match="no trainable tokens"):
        trainable_samples([untrained], context=None, model="m")
    with pytest.raises(InvalidInputError, match=r"5 tokens, longer than the context of model m \(4 tokens"):
        trainable_samples([S1], context=4, model="m")

"""Every advantage estimator and the DPO pairing against examples computed by hand."""

from __future__ import annotations

import warnings

import pytest

from agentgrad.adapters import ESTIMATORS, group_advantages, preference_pairs
from agentgrad.algorithms.grpo import GRPOConfig
from agentgrad.types import Transition


def _t(group: str | None, reward: float, rollout: str | None = None, index: int = 0) -> Transition:
    return Transition(
        rollout_id=rollout or f"{group}-{reward}-{index}",
        attempt_id="a",
        group_id=group,
        index=index,
        prompt_ids=[1],
        response_ids=[2],
        reward=reward,
    )


def _batch() -> list[Transition]:
    """Group a: rewards 1, 0, 0, 1; group b: 2, 0, 1; group c: 1, 1 (all agree)."""
    return [
        _t("a", 1.0, "a0"),
        _t("a", 0.0, "a1"),
        _t("a", 0.0, "a2"),
        _t("a", 1.0, "a3"),
        _t("b", 2.0, "b0"),
        _t("b", 0.0, "b1"),
        _t("b", 1.0, "b2"),
        _t("c", 1.0, "c0"),
        _t("c", 1.0, "c1"),
    ]


def _advantages(estimator: str) -> list[float]:
    kept, stats = group_advantages(_batch(), estimator)  # type: ignore[arg-type]
    assert stats.groups == 3 and stats.zero_variance_groups == 1 and stats.dropped_transitions == 2
    assert [t.rollout_id for t in kept] == ["a0", "a1", "a2", "a3", "b0", "b1", "b2"]
    return [t.advantage for t in kept]


def test_grpo_divides_by_the_group_std():
    # a: μ = 0.5, σ = 0.5 → ±1. b: μ = 1, σ = sqrt(2/3) = 0.816497 → ±1.224745, 0.
    expected = [1.0, -1.0, -1.0, 1.0, 1.224745, -1.224745, 0.0]
    assert _advantages("grpo") == pytest.approx(expected, abs=1e-5)


def test_rloo_subtracts_the_mean_of_the_other_members():
    # a0: 1 − (0+0+1)/3 = 2/3; a1: 0 − (1+0+1)/3 = −2/3. b0: 2 − (0+1)/2 = 1.5; b1: 0 − 1.5 = −1.5; b2: 1 − 1 = 0.
    expected = [2 / 3, -2 / 3, -2 / 3, 2 / 3, 1.5, -1.5, 0.0]
    assert _advantages("rloo") == pytest.approx(expected, abs=1e-9)


def test_reinforce_pp_centres_by_group_and_scales_by_the_whole_batch():
    # Ã (every transition, group c included): a: .5 −.5 −.5 .5, b: 1 −1 0, c: 0 0.
    # mean(Ã) = 0; var = (4·0.25 + 1 + 1) / 9 = 1/3 → std = 0.577350. Â = Ã / std.
    s = (1 / 3) ** 0.5
    expected = [0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 1 / s, -1 / s, 0.0]
    assert _advantages("reinforce++") == pytest.approx(expected, abs=1e-5)


def test_dr_grpo_only_subtracts_the_group_mean():
    expected = [0.5, -0.5, -0.5, 0.5, 1.0, -1.0, 0.0]
    assert _advantages("dr_grpo") == pytest.approx(expected, abs=1e-9)


def test_a_lone_transition_and_an_unknown_estimator():
    for estimator in ESTIMATORS:  # a group of one has nothing to compare with: dropped, never a division by 0
        kept, stats = group_advantages([_t(None, 1.0)], estimator)  # type: ignore[arg-type]
        assert kept == [] and stats.zero_variance_groups == 1
    with pytest.raises(ValueError, match="estimator must be one of"):
        group_advantages(_batch(), "ppo")  # type: ignore[arg-type]


def test_dpo_pairs_best_against_worst_and_skips_ties():
    batch = _batch() + [_t("b", 5.0, "b0", index=1)]  # a second sequence of rollout b0: never paired
    pairs, stats = preference_pairs(batch)
    # a: best = a0 (first of the 1s), worst = a1 (first of the 0s); b: b0 (2) vs b1 (0); c: tie → skipped.
    assert [(c.rollout_id, r.rollout_id) for c, r in pairs] == [("a0", "a1"), ("b0", "b1")]
    assert stats.groups == 3 and stats.zero_variance_groups == 1
    assert stats.dropped_transitions == 10 - 4


def test_the_estimator_setting_and_the_deprecated_normalize():
    assert GRPOConfig().estimator == "grpo"  # the default is today's GRPO
    with pytest.warns(DeprecationWarning, match="estimator='dr_grpo'"):
        config = GRPOConfig(normalize="mean")
    assert config.estimator == "dr_grpo" and config.normalize is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GRPOConfig(estimator="reinforce++")
    with pytest.raises(ValueError, match="contradicts"):
        GRPOConfig(estimator="rloo", normalize="mean")
    with pytest.raises(ValueError, match="estimator must be one of"):
        GRPOConfig(estimator="ppo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dpo_beta"):
        GRPOConfig(estimator="dpo", dpo_beta=0)


def test_dr_grpo_divides_the_loss_by_a_constant_per_sequence(tiny_model_dir):
    """On-policy (ratio 1), the PPO loss is −Σ A over trained tokens divided by the normaliser.
    Two sequences of 3 and 2 tokens, A = +1: token mean −5/5 = −1; Dr. GRPO with 10 tokens per
    sequence −5/(2·10) = −0.25, whatever the responses' lengths."""
    pytest.importorskip("torch")
    from agentgrad.training import PolicyTrainer, Sample, TrainConfig

    def samples() -> list[Sample]:
        return [Sample([5, 6, 7], [10, 11, 12], advantage=1.0), Sample([5, 6, 8], [13, 14], advantage=1.0)]

    assert PolicyTrainer(tiny_model_dir, TrainConfig(lr=1e-4)).ppo_step(samples()).loss == pytest.approx(-1.0, abs=1e-5)
    trainer = PolicyTrainer(tiny_model_dir, TrainConfig(lr=1e-4))
    assert trainer.ppo_step(samples(), tokens_per_sample=10).loss == pytest.approx(-0.25, abs=1e-5)


def test_grpo_advantages_stage_follows_the_estimator(tmp_path):
    from agentgrad.algorithms.grpo import GRPO

    kept, metrics = GRPO(tmp_path, estimator="rloo").advantages(_batch())
    assert [t.advantage for t in kept][:2] == pytest.approx([2 / 3, -2 / 3])
    assert metrics["grpo/zero_variance_groups"] == 1
    kept, metrics = GRPO(tmp_path, estimator="dpo").advantages(_batch())
    # DPO: chosen, rejected of each group, flattened; the tied group c is counted as zero-variance.
    assert [t.rollout_id for t in kept] == ["a0", "a1", "b0", "b1"]
    assert (metrics["dpo/pairs"], metrics["grpo/zero_variance_groups"], metrics["grpo/groups"]) == (2, 1, 3)
    grpo = GRPO(tmp_path, estimator="dr_grpo", sampling={"max_tokens": 64})
    assert grpo._tokens_per_sample() == 64.0 and GRPO(tmp_path)._tokens_per_sample() is None


def test_grpo_update_stage_makes_a_dpo_step_on_the_pairs(tmp_path, tiny_model_dir):
    pytest.importorskip("torch")
    from agentgrad.algorithms.grpo import GRPO
    from agentgrad.training import PolicyTrainer, TrainConfig

    grpo = GRPO(tiny_model_dir, estimator="dpo", output_dir=tmp_path)
    grpo.trainer = PolicyTrainer(tiny_model_dir, TrainConfig(lr=1e-3))
    batch = _batch()
    for t in batch:
        t.prompt_ids, t.response_ids, t.response_mask = [5, 6, 7], [8 + int(t.reward), 9], [1, 1]
    kept, _ = grpo.advantages(batch)
    values = grpo.update(kept)
    assert values["loss"] == pytest.approx(0.693147, abs=1e-5)  # policy == reference: −log σ(0) = log 2
    assert (values["dpo/margin"], values["updates"], values["tokens"]) == (0.0, 1, 8)  # 2 pairs × 2 rows × 2 tokens
    assert grpo.trainer.step == 1

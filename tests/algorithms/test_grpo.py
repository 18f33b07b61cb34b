"""GRPO end to end through a real store and runner, with agents that record their own LLM spans
(no model server needed), plus the failure paths: non-numeric rewards and empty batches."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from grpo_agents import (  # noqa: E402
    GOOD,
    PROMPT,
    RecordingPublisher,
    always_good_agent,
    coin_agent,
    settling_agent,
)

from agentgrad.agents import rollout  # noqa: E402
from agentgrad.algorithms.grpo import GRPO  # noqa: E402
from agentgrad.dashboard.runs import run_of  # noqa: E402
from agentgrad.store.memory import MemoryStore  # noqa: E402
from agentgrad.store.protocol import RolloutFilter  # noqa: E402
from agentgrad.trainer import Trainer  # noqa: E402
from agentgrad.training import PolicyTrainer, Sample, TrainConfig  # noqa: E402
from agentgrad.types import LLM  # noqa: E402


@rollout
def bad_reward_agent(task, llm):
    return "great"  # not a number: the runner fails the rollout


def test_grpo_trains_logs_checkpoints_and_resumes(tiny_model_dir, tmp_path, monkeypatch):
    saved_at: list[int] = []
    save_checkpoint = PolicyTrainer.save_checkpoint

    def recorded(self, *args, **kwargs):
        saved_at.append(self.step)
        return save_checkpoint(self, *args, **kwargs)

    monkeypatch.setattr(PolicyTrainer, "save_checkpoint", recorded)
    store = MemoryStore()
    publisher = RecordingPublisher()
    grpo = GRPO(
        tiny_model_dir,
        steps=3,
        batch_size=2,
        group_size=4,
        train=TrainConfig(lr=3e-3),
        val_every=0,
        output_dir=tmp_path,
        checkpoint_every=2,
        publisher=publisher,
        run_id="t",
        rollout_timeout_seconds=60,
    )
    tasks = [{"k": 40 + i} for i in range(5)]
    result = Trainer(store, concurrency=4, algorithm=grpo).fit(
        coin_agent, tasks, tasks[:2], resources={"llm": LLM(endpoint="http://unused/v1", model="m")}
    )
    # A step whose groups all drew the same coin is skipped without publishing (1 in 64 steps).
    trained_steps = [h["step"] for h in result.history if "loss" in h]
    assert result.steps == 3 and trained_steps and publisher.versions == [f"v{s}" for s in trained_steps]
    assert [s for s, _ in result.validation] == [0, 3]
    assert saved_at == [2, 3]  # every 2 steps, and the last step once
    # Each validation rollout names its run and step, so the dashboard lists it with the run's own.
    validation = store.query_rollouts(RolloutFilter(mode="val"))
    assert (
        sorted((r.metadata["validation_of"], r.metadata["step"]) for r in validation) == [("t", 0)] * 2 + [("t", 3)] * 2
    )
    assert {run_of(r) for r in validation} == {"t"}
    # The best-validation model and the final one are exported as Hugging Face directories.
    best = max(result.validation, key=lambda v: v[1])
    assert (result.best_step, result.best_score) == (best[0], best[1])
    assert json.loads((tmp_path / "best.json").read_text()) == {"step": best[0], "score": best[1]}
    assert (tmp_path / "best" / "config.json").is_file() and (tmp_path / "model" / "config.json").is_file()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in lines if "loss" in m]
    assert trained and all(m["stale_transitions"] == 0 and m["unknown_version_transitions"] == 0 for m in trained)
    assert {
        "reward/mean",
        "entropy",
        "kl",
        "clip_fraction",
        "tokens_per_second",
        "rollouts_per_second",
        "trainer_idle_fraction",
        "runner_idle_fraction",
    } <= set(trained[0])
    assert any(r.run_id == "t" for r in store.query_metrics())
    # The policy moved toward the rewarded completion.
    fresh = PolicyTrainer(tiny_model_dir, TrainConfig())
    before = fresh.sequence_logprob([Sample(PROMPT + [40], GOOD)])[0]
    state = fresh.load_checkpoint(tmp_path / "checkpoints")
    assert state["step"] == 3 and state["cursor"] == 6
    assert state["extra"]["trained"] is True  # a resumed run knows its weights moved (identical-rewards hint)
    assert fresh.sequence_logprob([Sample(PROMPT + [40], GOOD)])[0] > before
    # Resuming continues from the checkpoint's step (and republishes its weights first).
    grpo2 = GRPO(
        tiny_model_dir,
        steps=4,
        batch_size=2,
        group_size=4,
        val_every=0,
        output_dir=tmp_path,
        publisher=publisher,
        rollout_timeout_seconds=60,
    )
    result2 = Trainer(store, concurrency=4, algorithm=grpo2).fit(
        coin_agent, tasks, resources={"llm": LLM(endpoint="http://unused/v1", model="m")}
    )
    # the result covers the whole run: its first three steps read back from metrics.jsonl
    assert [h["step"] for h in result2.history] == [1, 2, 3, 4] and [s for s, _ in result2.validation] == [0, 3]
    resumed_steps = [h["step"] for h in result2.history if "loss" in h and h["step"] > 3]
    assert result2.steps == 4
    assert publisher.versions[len(trained_steps) :] == ["v3"] + [f"v{s}" for s in resumed_steps]
    store.close()


def test_non_numeric_rewards_fail_rollouts_and_empty_batches_are_retried_not_trained(tiny_model_dir, tmp_path):
    store = MemoryStore()
    grpo = GRPO(
        tiny_model_dir,
        steps=2,
        batch_size=1,
        group_size=2,
        val_every=0,
        output_dir=tmp_path,
        publisher=RecordingPublisher(),
        max_empty_retries=1,
        rollout_timeout_seconds=30,
    )
    with pytest.raises(RuntimeError, match="empty batches in a row"):
        Trainer(store, concurrency=2, algorithm=grpo).fit(
            bad_reward_agent, [{"k": 1}], resources={"llm": LLM(endpoint="http://unused/v1", model="m")}
        )
    failed = store.query_rollouts()
    assert len(failed) == 4 and all(r.status.value == "failed" for r in failed)
    attempt = store.get_latest_attempt(failed[0].rollout_id)
    assert "non-numeric reward" in attempt.error.message
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["empty_batch"] for m in lines] == [1.0, 1.0] and not any("loss" in m for m in lines)
    assert not (tmp_path / "checkpoints" / "latest").exists()
    store.close()


def _two_small_steps(agent, tasks, model_dir, tmp_path, publisher):
    """Two GRPO steps of 2 tasks × 3 rollouts by ``agent`` (which records its own LLM calls)."""
    store = MemoryStore()
    grpo = GRPO(
        model_dir,
        steps=2,
        batch_size=2,
        group_size=3,
        val_every=0,
        output_dir=tmp_path,
        publisher=publisher,
        rollout_timeout_seconds=60,
    )
    try:
        return Trainer(store, concurrency=3, algorithm=grpo).fit(
            agent, tasks, resources={"llm": LLM(endpoint="http://unused/v1", model="m")}
        )
    finally:
        store.close()


def test_a_step_whose_groups_all_agree_is_skipped_without_an_update(tiny_model_dir, tmp_path, capsys):
    publisher = RecordingPublisher()
    result = _two_small_steps(always_good_agent, [{"k": 40 + i} for i in range(4)], tiny_model_dir, tmp_path, publisher)
    assert result.steps == 2
    assert publisher.versions == [], "nothing to learn: no weights published"
    assert all("loss" not in step and step["grpo/zero_variance_groups"] == 2 for step in result.history)
    out = capsys.readouterr().out
    assert out.count("zero reward variance (reward mean 1.00)") == 2
    assert out.count("every rollout of the step scored the same") == 1  # the hint once a run
    # Output to a file, not a terminal: a whole line per step instead of a bar cut to 80 columns.
    for step in (1, 2):
        assert f"GRPO step {step}/2  reward 1.00  success 1.00  no update (no reward variance)" in out


def test_identical_rewards_after_trained_steps_say_the_policy_has_settled(tiny_model_dir, tmp_path, capsys):
    """The hint for a step of identical rewards depends on whether the run has trained: after a
    trained step it says the policy has settled (learned, or stuck), not that the model never or
    always succeeds (the demo reached 1.00 and was told to check its agent)."""
    tasks = [{"k": 50 + i, "first_step": 6} for i in range(4)]
    result = _two_small_steps(settling_agent, tasks, tiny_model_dir, tmp_path, RecordingPublisher())
    assert ["loss" in step for step in result.history] == [True, False]
    out = capsys.readouterr().out
    assert out.count("after steps that trained") == 1 and "never (or always)" not in out

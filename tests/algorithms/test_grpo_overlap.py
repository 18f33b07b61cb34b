"""GRPO's overlapped loop (``overlap``): the next batch samples while the trainer updates, TIS
corrects for the older sampler, validation does not overlap, and a run that stops leaves no batch
behind. Through a real store and runner, with the recording agent of ``test_grpo``."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("torch")

from grpo_agents import coin_agent  # noqa: E402

from agentgrad.algorithms.grpo import GRPO, GRPOConfig  # noqa: E402
from agentgrad.store.memory import MemoryStore  # noqa: E402
from agentgrad.trainer import Trainer  # noqa: E402
from agentgrad.training import PolicyTrainer, Published, TrainConfig  # noqa: E402
from agentgrad.types import LLM, RolloutStatus  # noqa: E402

RESOURCES = {"llm": LLM(endpoint="http://unused/v1", model="m")}
TASKS = [{"k": 40 + i} for i in range(6)]


class TimedPublisher:
    """Records when each version was published."""

    def __init__(self) -> None:
        self.published: dict[int, float] = {}

    def publish(self, trainer: PolicyTrainer) -> Published:
        self.published[trainer.step] = time.time()
        return Published(version=f"v{trainer.step}")


def _grpo(tmp_path, publisher, **overrides):
    settings = dict(
        steps=4,
        batch_size=2,
        group_size=4,
        train=TrainConfig(lr=3e-3, tis_cap=2.0),
        val_every=0,
        output_dir=tmp_path,
        publisher=publisher,
        run_id="o",
        rollout_timeout_seconds=60,
        overlap=True,
        max_staleness=1,
    )
    model = overrides.pop("model")
    return GRPO(model, **{**settings, **overrides})


def _enqueued_by_step(store):
    starts: dict[int, float] = {}
    for r in store.query_rollouts():
        if r.mode == "train":
            step = r.metadata["step"]
            starts[step] = min(starts.get(step, r.start_time), r.start_time)
    return starts


def test_the_next_batch_is_sampled_while_the_trainer_updates(tiny_model_dir, tmp_path):
    store, publisher = MemoryStore(), TimedPublisher()
    grpo = _grpo(tmp_path, publisher, model=tiny_model_dir)
    result = Trainer(store, concurrency=4, algorithm=grpo).fit(coin_agent, TASKS, resources=RESOURCES)
    assert result.steps == 4
    enqueued = _enqueued_by_step(store)
    # Each batch after the first was enqueued before the step before it was published.
    trained = [s for s in range(1, 4) if s in publisher.published]
    assert trained and all(enqueued[s + 1] < publisher.published[s] for s in trained)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    updates = [m for m in lines if "loss" in m]
    assert updates and all(m["stale_transitions"] == 0 for m in lines if "stale_transitions" in m)
    assert all({"tis/weight", "tis/capped", "tis/logprob_gap"} <= set(m) for m in updates)
    assert all(
        0 <= m["runner_idle_fraction"] <= 1 and 0 <= m["trainer_idle_fraction"] <= 1
        for m in lines
        if "step_seconds" in m
    )
    # Every rollout of the run was trained on or validated: none left queued or cancelled.
    assert all(r.status == RolloutStatus.SUCCEEDED for r in store.query_rollouts())


def test_a_validation_runs_beside_the_next_batch_on_its_own_steps_weights(tiny_model_dir, tmp_path):
    store, publisher = MemoryStore(), TimedPublisher()
    grpo = _grpo(tmp_path, publisher, model=tiny_model_dir, steps=3, val_every=2)
    result = Trainer(store, concurrency=4, algorithm=grpo).fit(coin_agent, TASKS, TASKS[:2], resources=RESOURCES)
    assert [step for step, _ in result.validation] == [0, 2, 3]
    enqueued = _enqueued_by_step(store)

    def version(rollout):
        return store.get_resources(rollout.resources_id).items["agentgrad_policy"].value["model_version"]

    of_step_2 = [r for r in store.query_rollouts() if r.mode == "val" and version(r) == "v2"]
    # Step 3's batch was under way before step 2's validation was enqueued (the runners never wait),
    # and no newer weights were published until that validation was done.
    assert of_step_2 and enqueued[3] < min(r.start_time for r in of_step_2)
    assert 3 not in publisher.published or publisher.published[3] > max(r.end_time for r in of_step_2)


SLOW_TASKS = [{**task, "sleep": 0.5} for task in TASKS]  # a batch takes ≥ 1 s: still running at the stop


def _step_2_rollouts(store):
    return [r for r in store.query_rollouts() if r.metadata.get("step") == 2]


def test_an_interrupted_run_cancels_the_batch_under_way(tiny_model_dir, tmp_path):
    store = MemoryStore()

    def stop(values):
        raise KeyboardInterrupt  # the user pressed Ctrl-C after the first step

    grpo = _grpo(tmp_path, TimedPublisher(), model=tiny_model_dir, on_step=stop)
    with pytest.raises(KeyboardInterrupt):
        Trainer(store, concurrency=4, algorithm=grpo).fit(coin_agent, SLOW_TASKS, resources=RESOURCES)
    second = _step_2_rollouts(store)
    assert len(second) == 8 and all(r.status == RolloutStatus.CANCELLED for r in second)


def test_a_run_out_of_time_cancels_the_batch_under_way_before_its_last_validation(tiny_model_dir, tmp_path):
    store = MemoryStore()
    grpo = _grpo(tmp_path, TimedPublisher(), model=tiny_model_dir)
    grpo._out_of_time = lambda started, last: grpo.trainer.step >= 1  # the budget runs out after step 1
    result = Trainer(store, concurrency=4, algorithm=grpo).fit(coin_agent, SLOW_TASKS, TASKS[:1], resources=RESOURCES)
    assert result.steps == 1 and [step for step, _ in result.validation] == [0, 1]
    second = _step_2_rollouts(store)
    assert len(second) == 8 and all(r.status == RolloutStatus.CANCELLED for r in second)
    last_validation = max(r.start_time for r in store.query_rollouts() if r.mode == "val")
    assert last_validation > max(r.end_time for r in second)  # it did not wait behind them


def test_overlap_needs_a_staleness_of_one():
    with pytest.raises(ValueError, match="max_staleness"):
        GRPOConfig(overlap=True)

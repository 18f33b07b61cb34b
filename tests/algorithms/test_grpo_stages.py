"""GRPO's configuration and each stage of its step, called alone (no model, no runner)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
import types

import pytest

from agentgrad import semconv
from agentgrad.algorithms.baseline import EvaluationReport
from agentgrad.algorithms.grpo import GRPO, GRPOConfig
from agentgrad.algorithms.runlog import read_back
from agentgrad.config import field_docs
from agentgrad.store.memory import MemoryStore
from agentgrad.training.backend import Published
from agentgrad.training.policy import TrainConfig
from agentgrad.types import LLM, AttemptStatus, RolloutStatus, Span, Transition

# ---- configuration ------------------------------------------------------------------------------


def test_every_config_field_has_help():
    docs = field_docs(GRPOConfig)
    assert list(docs) == [f.name for f in dataclasses.fields(GRPOConfig)]
    assert [name for name, doc in docs.items() if not doc.strip()] == []


def test_keywords_override_the_config_and_unknown_ones_name_the_valid_fields(tmp_path):
    base = GRPOConfig(steps=7, batch_size=3, train=TrainConfig(lr=1e-3))
    grpo = GRPO(tmp_path / "model", base, group_size=4, output_dir=tmp_path / "out")
    assert (grpo.config.steps, grpo.config.batch_size, grpo.config.group_size) == (7, 3, 4)
    assert grpo.config.train.lr == 1e-3 and base.group_size == 8, "the given config is not changed"
    assert grpo.output_dir == tmp_path / "out" and grpo.checkpoint_dir == tmp_path / "out" / "checkpoints"
    assert GRPO(tmp_path, steps=30).config.steps == 30 and GRPO(tmp_path).config == GRPOConfig()
    with pytest.raises(TypeError, match=r"unknown setting\(s\) 'stpes'.*Valid GRPOConfig fields: steps, max_seconds"):
        GRPO(tmp_path, stpes=3)
    with pytest.raises(TypeError, match="'train_config' is now 'train'"):
        GRPO(tmp_path, train_config=TrainConfig())


def test_rollout_settings_and_sampling_defaults(tmp_path):
    grpo = GRPO(tmp_path, rollout_timeout_seconds=42, max_attempts=2, sampling={"top_p": 0.9})
    assert (grpo.rollout_config.timeout_seconds, grpo.rollout_config.max_attempts) == (42, 2)
    assert grpo.sampling == {"temperature": 1.0, "top_p": 0.9}


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"group_size": 1}, "group_size must be ≥ 2"),
        ({"batch_size": 0}, "batch_size must be ≥ 1"),
        ({"epochs": 0}, "epochs must be ≥ 1"),
        ({"checkpoint_every": 0}, "checkpoint_every must be ≥ 1"),
        ({"normalize": "max"}, "normalize must be 'std' or 'mean'"),
        ({"val_every": -1}, "val_every must be ≥ 0"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(tmp_path, setting, message):
    with pytest.raises(ValueError, match=message):
        GRPO(tmp_path, **setting)


def test_importing_grpo_loads_no_torch():
    code = "import sys, agentgrad.algorithms.grpo; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# ---- 1. sample ----------------------------------------------------------------------------------


def _sampling_grpo(tmp_path, **settings):
    """A GRPO with what ``submit`` reads set up by hand (a run's start does it)."""
    grpo = GRPO(tmp_path, run_id="r", **settings)
    grpo.store = MemoryStore()
    grpo.tasks = [{"q": str(i)} for i in range(10)]
    grpo.train_resources = grpo.store.add_resources({"llm": LLM(endpoint="http://unused/v1", model="m")})
    return grpo


def test_submit_enqueues_a_group_per_task_and_collect_cancels_stragglers(tmp_path):
    grpo = _sampling_grpo(tmp_path, group_size=3, batch_timeout=0.05)
    pending = grpo.submit([4, 9], step=2, attempt=1)
    rollouts = grpo.collect(pending)
    assert len(rollouts) == 6 and all(r.status == RolloutStatus.CANCELLED for r in rollouts)  # no runner
    groups = [r.metadata["group_id"] for r in rollouts]
    assert groups == ["r-s2-t4-r1"] * 3 + ["r-s2-t9-r1"] * 3
    assert [r.input for r in rollouts] == [{"q": "4"}] * 3 + [{"q": "9"}] * 3
    assert all(r.metadata["step"] == 2 and r.mode == "train" for r in rollouts)
    assert all(r.resources_id == grpo.train_resources.resources_id for r in rollouts)


def test_cancel_gives_up_a_batch_under_way(tmp_path):
    grpo = _sampling_grpo(tmp_path, group_size=2)
    grpo.console = types.SimpleNamespace(print=lambda *a, **k: None)
    pending = grpo.submit([1], step=5)
    grpo.cancel(pending)
    assert [grpo.store.get_rollout(i).status for i in pending.rollout_ids] == [RolloutStatus.CANCELLED] * 2


def test_the_runners_idle_from_a_batchs_last_rollout_to_the_next_submission(tmp_path):
    grpo = _sampling_grpo(tmp_path, group_size=2, batch_timeout=0.01)
    grpo.collect(grpo.submit([1], step=1))  # cancelled at once: its end time is now
    assert grpo._take_runner_idle() == 0.0  # nothing has waited yet
    time.sleep(0.05)  # the trainer at work: no batch queued
    grpo.submit([2], step=2)
    assert 0.05 <= grpo._take_runner_idle() < 5.0
    assert grpo._take_runner_idle() == 0.0  # taken: the next step starts from zero


# ---- 2. transitions -----------------------------------------------------------------------------


def _finished_rollout(store, group, version, reward):
    """A rollout that made one LLM call served by ``version`` and earned ``reward``."""
    store.enqueue_rollout({"q": group}, metadata={"group_id": group})
    claimed = store.dequeue_rollout("w")
    rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
    store.add_span(
        Span(
            rollout_id=rid,
            attempt_id=aid,
            name=semconv.SPAN_LLM_CALL,
            attributes={
                semconv.LLM_PROMPT_TOKEN_IDS: [1, 2, 3],
                semconv.LLM_COMPLETION_TOKEN_IDS: [7, 8],
                semconv.LLM_LOGPROBS: [-0.5, -0.5],
                semconv.MODEL_VERSION: version,
            },
        )
    )
    store.add_span(
        Span(rollout_id=rid, attempt_id=aid, name=semconv.SPAN_REWARD, attributes={semconv.REWARD_VALUE: reward})
    )
    store.update_attempt(rid, aid, AttemptStatus.SUCCEEDED)
    return store.get_rollout(rid)


def test_transitions_drop_stale_versions_and_count_unknown_ones(tmp_path):
    store = MemoryStore()
    grpo = GRPO(tmp_path, max_staleness=1)
    grpo.versions = ["v0", "v1", "v2"]
    rollouts = [_finished_rollout(store, "g", version, 1.0) for version in ("v0", "v1", "v2", "elsewhere")]
    transitions, metrics = grpo.transitions(store, rollouts)
    assert [t.model_version for t in transitions] == ["v1", "v2", "elsewhere"]
    assert all(t.group_id == "g" and t.response_ids == [7, 8] and t.reward == 1.0 for t in transitions)
    assert metrics["stale_transitions"] == 1 and metrics["unknown_version_transitions"] == 1
    assert metrics["adapter/rollouts"] == 4 and metrics["adapter/transitions"] == 4


# ---- 3. advantages ------------------------------------------------------------------------------


def _transition(group, reward):
    return Transition(
        rollout_id=f"{group}-{reward}",
        attempt_id="a",
        group_id=group,
        index=0,
        prompt_ids=[1],
        response_ids=[2],
        reward=reward,
    )


@pytest.mark.parametrize(("normalize", "expected"), [("std", [1.0, -1.0]), ("mean", [0.5, -0.5])])
def test_advantages_normalize_within_groups_and_drop_groups_that_agree(tmp_path, normalize, expected):
    grpo = GRPO(tmp_path, normalize=normalize)
    batch = [_transition("g1", 1.0), _transition("g1", 0.0), _transition("g2", 1.0), _transition("g2", 1.0)]
    kept, metrics = grpo.advantages(batch)
    assert [t.group_id for t in kept] == ["g1", "g1"]
    assert [t.advantage for t in kept] == pytest.approx(expected, abs=1e-5)
    assert metrics == {
        "grpo/groups": 2,
        "grpo/zero_variance_groups": 1,
        "grpo/dropped_transitions": 2,
        "grpo/zero_advantage_token_share": 0.5,
        "grpo/advantage_abs_max": pytest.approx(expected[0], abs=1e-5),
    }


def test_agreeing_groups_regularize_keeps_them_with_zero_advantage(tmp_path):
    grpo = GRPO(tmp_path, agreeing_groups="regularize", train=TrainConfig(kl_coef=0.1))
    batch = [_transition("g1", 1.0), _transition("g1", 0.0), _transition("g2", 0.0), _transition("g2", 0.0)]
    batch[2].advantage = 5.0  # whatever it held before is overwritten
    kept, metrics = grpo.advantages(batch)
    assert [(t.group_id, t.advantage) for t in kept] == [
        ("g1", pytest.approx(1.0, abs=1e-5)),
        ("g1", pytest.approx(-1.0, abs=1e-5)),
        ("g2", 0.0),
        ("g2", 0.0),
    ]
    assert metrics["grpo/zero_variance_groups"] == 1 and metrics["grpo/zero_advantage_token_share"] == 0.5


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"agreeing_groups": "keep"}, "agreeing_groups must be 'drop' or 'regularize'"),
        ({"agreeing_groups": "regularize"}, "needs a regulariser"),  # with neither KL nor entropy it would do nothing
    ],
)
def test_bad_agreeing_groups_settings_are_refused(tmp_path, setting, message):
    with pytest.raises(ValueError, match=message):
        GRPO(tmp_path, **setting)


def test_signal_share_counts_the_tokens_of_groups_that_agree():
    from agentgrad.algorithms.grpo import signal_share

    g1 = [_transition("g1", 1.0), _transition("g1", 0.0)]  # one response token each
    g2 = [_transition("g2", 1.0), _transition("g2", 1.0)]
    for t in g2:
        t.response_ids, t.response_mask = [2, 3, 4], [1, 1, 0]  # two trained tokens each
    g1[0].advantage, g1[1].advantage = 1.0, -1.5
    # 2 of 6 trained tokens are in the group that disagrees: 4 / 6 carry no signal
    assert signal_share(g1 + g2, g1) == {
        "grpo/zero_advantage_token_share": pytest.approx(4 / 6),
        "grpo/advantage_abs_max": 1.5,
    }
    assert signal_share([], []) == {"grpo/zero_advantage_token_share": 0.0, "grpo/advantage_abs_max": 0.0}


# ---- 5. publish ---------------------------------------------------------------------------------


class CountingPublisher:
    def __init__(self) -> None:
        self.calls = 0

    def publish(self, trainer):
        self.calls += 1
        return Published(version=f"v{trainer.step}", model="adapter-x")


def test_publish_serves_the_weights_then_names_them_in_resources(tmp_path):
    store = MemoryStore()
    grpo = GRPO(tmp_path, sampling={"temperature": 0.7})
    grpo.store, grpo.trainer, grpo.weights_publisher = store, types.SimpleNamespace(step=3), CountingPublisher()
    grpo.base_items = {"llm": LLM(endpoint="http://x/v1", model="m", sampling={"max_tokens": 9}), "k": 1}
    grpo.versions = ["v0"]
    grpo.publish()
    assert grpo.versions == ["v0", "v3"] and grpo.weights_publisher.calls == 1
    train = store.get_resources(grpo.train_resources.resources_id).items
    val = store.get_resources(grpo.val_resources.resources_id).items
    assert train["llm"].sampling == {"max_tokens": 9, "temperature": 0.7} and train["llm"].model == "adapter-x"
    assert val["llm"].sampling == {"max_tokens": 9, "temperature": 0.0}
    assert train["agentgrad_policy"].value == {"model_version": "v3", "purpose": "train"}
    assert val["agentgrad_policy"].value["purpose"] == "val" and train["k"].value == 1


# ---- 6. evaluate: the best model is kept ----------------------------------------------------------


@pytest.fixture
def exports(monkeypatch):
    """A stand-in for ``agentgrad.training.export``: records what was exported where."""
    calls: list[tuple[object, str]] = []

    def export_model(source, out_dir):
        calls.append((source, out_dir.name))
        out_dir.mkdir(parents=True, exist_ok=True)
        return out_dir

    monkeypatch.setitem(sys.modules, "agentgrad.training.export", types.SimpleNamespace(export_model=export_model))
    return calls


def test_a_new_best_validation_score_exports_the_model_and_survives_a_resume(tmp_path, monkeypatch, exports):
    scores = iter([0.25, 0.5, 0.375, 0.5])
    grpo = GRPO(tmp_path, output_dir=tmp_path)

    def fake_validation(self, context):
        return EvaluationReport([types.SimpleNamespace(reward=next(scores))], [1], [1])

    monkeypatch.setattr("agentgrad.algorithms.baseline.Evaluate.run", fake_validation)
    grpo.store, grpo.console, grpo.trainer = MemoryStore(), types.SimpleNamespace(print=lambda *a: None), "trainer"
    grpo.val_tasks, grpo.val_resources = [{"q": 1}], types.SimpleNamespace(resources_id=None)
    metrics = [grpo.evaluate(step) for step in (0, 5, 10, 15)]
    assert [m["val/reward_mean"] for m in metrics] == [0.25, 0.5, 0.375, 0.5]
    assert exports == [("trainer", "best"), ("trainer", "best")], "only strictly better scores"
    assert (grpo.result.best_step, grpo.result.best_score) == (5, 0.5)
    assert json.loads((tmp_path / "best.json").read_text()) == {"step": 5, "score": 0.5}
    assert grpo.result.validation == [(0, 0.25), (5, 0.5), (10, 0.375), (15, 0.5)]
    # The run's metrics.jsonl as RunLog writes it: validated at 0 and 5, steps trained to 7, a
    # crash after step 10's validation, cutting a line; the checkpoint it resumes from is step 5's.
    lines = [{"step": 0, "val/reward_mean": 0.25}, {"step": 5, "loss": 0.1, "val/reward_mean": 0.5}]
    lines += [{"step": 7, "loss": 0.2}, {"step": 10, "val/reward_mean": 0.375}]
    text = "".join(json.dumps(line) + "\n" for line in lines) + '{"step": 11, "lo'
    (tmp_path / "metrics.jsonl").write_text(text)
    resumed = GRPO(tmp_path, output_dir=tmp_path)
    logged = read_back(tmp_path, up_to_step=5)
    assert logged == lines[:2]  # step 7's and 10's records are not read: the resumed run logs them again
    resumed.best.load(logged)
    assert (resumed.best.step, resumed.best.score) == (5, 0.5)
    assert resumed.best.curve == [(0, 0.25), (5, 0.5)]


def test_no_val_tasks_no_validation(tmp_path):
    grpo = GRPO(tmp_path)
    grpo.val_tasks = []
    assert grpo.evaluate(3) == {} and grpo.result.validation == []


def test_an_empty_batch_names_what_agent_match_left_out() -> None:
    from agentgrad.adapters import AdaptStats

    grpo = GRPO("unused-model-dir", agent_match="write|rewrite")
    assert grpo._filtered_out() == ""
    grpo.adapt_stats = AdaptStats(calls_other_agents=3, other_agents={"check_query", "(no name)"})
    assert grpo._filtered_out() == (
        "; agent_match 'write|rewrite' left out 3 call(s) of agents ['(no name)', 'check_query']"
    )

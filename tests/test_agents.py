"""Agents: the Agent base class and the @rollout decorator, run through a real Runner + MemoryStore."""

from __future__ import annotations

import asyncio
import pickle
import sys
from typing import Any

import agents_for_tests
import pytest

from agentgrad import emit_reward
from agentgrad.agents import EXPECTED_AGENT, Agent, FunctionAgent, NotAnAgentError, as_agent, load_agent, rollout
from agentgrad.errors import InvalidInputError
from agentgrad.runner import Runner
from agentgrad.store.memory import MemoryStore
from agentgrad.types import LLM, AttemptStatus, PromptTemplate, Resources, Rollout, RolloutStatus


def run_tasks(
    store: MemoryStore, agent: Any, tasks: list[Any], *, mode: str = "train", resources: dict[str, Any] | None = None
) -> list[Rollout]:
    """Enqueue ``tasks``, run them with a real Runner to completion, return the final rollouts."""
    res = store.add_resources(resources) if resources is not None else None
    ids = [
        store.enqueue_rollout(t, mode=mode, resources_id=res.resources_id if res else None).rollout_id for t in tasks
    ]
    Runner(agent, store, max_rollouts=len(ids), poll_timeout=0.05).run()
    return [store.get_rollout(i) for i in ids]


def error_of(store: MemoryStore, rollout_id: str):
    return store.get_latest_attempt(rollout_id).error


# ---- Agent base class ------------------------------------------------------------------------------


class SyncAgent(Agent):
    def rollout(self, task, resources, rollout):
        return task * 2


class AsyncAgent(Agent):
    async def rollout_async(self, task, resources, rollout):
        await asyncio.sleep(0)
        return task + 0.5


class ModeAgent(Agent):
    def rollout(self, task, resources, rollout):
        return 1.0

    def validation_rollout(self, task, resources, rollout):
        return -1.0


def test_agent_subclass_sync_and_async(memory_store):
    assert [r.reward for r in run_tasks(memory_store, SyncAgent(), [1, 2])] == [2.0, 4.0]
    assert [r.reward for r in run_tasks(memory_store, AsyncAgent(), [1])] == [1.5]


class TwoArgAgent(Agent):
    def rollout(self, task, resources):
        return task * 3


class TwoArgAsyncAgent(Agent):
    async def rollout_async(self, task, resources):
        return task - 1


def test_agent_subclass_may_leave_out_the_rollout_argument(memory_store):
    assert [r.reward for r in run_tasks(memory_store, TwoArgAgent(), [1, 2])] == [3.0, 6.0]
    assert [r.reward for r in run_tasks(memory_store, TwoArgAsyncAgent(), [5])] == [4.0]
    rollout_obj = Rollout(rollout_id="ro-1", input=2)
    assert asyncio.run(TwoArgAgent().rollout_async(2, Resources(resources_id="r", version=1), rollout_obj)) == 6


def test_agent_subclass_with_another_rollout_shape_is_refused_when_defined():
    with pytest.raises(TypeError, match=r"must take \(self, task, resources\) or \(self, task, resources, rollout\)"):

        class OneArg(Agent):
            def rollout(self, task):
                return 0.0


def test_rollout_async_default_calls_rollout():
    rollout_obj = Rollout(rollout_id="ro-1", input=3)
    result = asyncio.run(SyncAgent().rollout_async(3, Resources(resources_id="r", version=1), rollout_obj))
    assert result == 6


def test_training_and_validation_default_to_rollout(memory_store):
    train = run_tasks(memory_store, SyncAgent(), [5], mode="train")
    val = run_tasks(memory_store, SyncAgent(), [5], mode="val")
    assert train[0].reward == val[0].reward == 10.0


def test_val_mode_calls_validation_rollout(memory_store):
    assert run_tasks(memory_store, ModeAgent(), [0], mode="train")[0].reward == 1.0
    assert run_tasks(memory_store, ModeAgent(), [0], mode="val")[0].reward == -1.0
    assert run_tasks(memory_store, ModeAgent(), [0], mode="test")[0].reward == -1.0


def test_agent_without_rollout_fails_the_attempt_clearly(memory_store):
    (r,) = run_tasks(memory_store, Agent(), [0])
    assert r.status == RolloutStatus.FAILED
    error = error_of(memory_store, r.rollout_id)
    assert error.type == "NotImplementedError" and "must implement rollout()" in error.message


# ---- @rollout shapes -------------------------------------------------------------------------------

LLM_ITEM = LLM(endpoint="http://llm.invalid/v1", model="m")
PROMPT_ITEM = PromptTemplate(template="Solve {x}")


@rollout
def llm_agent(task, llm):
    assert isinstance(llm, LLM)
    return 1.0 if llm.model == "m" else 0.0


@rollout
def prompt_agent(task, prompt_template):
    return {"reward": 1.0 if prompt_template.format(x=task) == "Solve 7" else 0.0, "extra": "ignored"}


@rollout
def resources_agent(task, resources):
    assert isinstance(resources, Resources)
    return float(resources.get("temperature").value)


@rollout
def with_rollout_agent(task, llm, rollout):
    assert isinstance(rollout, Rollout) and rollout.input == task
    return 1.0


@rollout
async def async_prompt_agent(task, prompt_template, rollout):
    await asyncio.sleep(0)
    return 0.75


@rollout
def emitting_agent(task, resources):
    emit_reward(0.3)
    emit_reward(task)  # the last reward emitted is the rollout's reward
    return None


@rollout
def task_only_agent(task):
    return 0.1


RESOURCES = {"llm": LLM_ITEM, "tpl": PROMPT_ITEM, "temperature": 0.5}


@pytest.mark.parametrize(
    ("agent", "task", "reward"),
    [
        (llm_agent, 1, 1.0),
        (prompt_agent, 7, 1.0),
        (resources_agent, 0, 0.5),
        (with_rollout_agent, 3, 1.0),
        (async_prompt_agent, 3, 0.75),
        (emitting_agent, 0.9, 0.9),
        (task_only_agent, 0, 0.1),
    ],
    ids=["llm", "prompt_template", "resources", "llm+rollout", "async+rollout", "emits", "task-only"],
)
def test_rollout_shapes(memory_store, agent, task, reward):
    assert isinstance(agent, FunctionAgent)
    (r,) = run_tasks(memory_store, agent, [task], resources=RESOURCES)
    assert r.status == RolloutStatus.SUCCEEDED, error_of(memory_store, r.rollout_id)
    assert r.reward == pytest.approx(reward)


def test_returning_none_without_rewards_leaves_reward_unset(memory_store):
    @rollout
    def silent(task, resources):
        return None

    (r,) = run_tasks(memory_store, silent, [0])
    assert r.status == RolloutStatus.SUCCEEDED and r.reward is None


def test_resource_by_type_when_not_named_after_the_parameter(memory_store):
    (r,) = run_tasks(memory_store, llm_agent, [0], resources={"policy": LLM_ITEM})
    assert r.status == RolloutStatus.SUCCEEDED and r.reward == 1.0


def test_function_agent_still_callable_and_named():
    assert task_only_agent(0) == 0.1
    assert task_only_agent.name == "task_only_agent"
    assert task_only_agent.__name__ == "task_only_agent"


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("def f(): return 0", "must take the task"),
        ("def f(task, llm, temperature): return 0", "temperature"),
        ("def f(task, model): return 0", "model"),
        ("def f(task, llm, prompt_template): return 0", "only one"),
    ],
)
def test_unsupported_signatures_raise_type_error(source, needle):
    namespace: dict[str, Any] = {}
    exec(source, namespace)
    with pytest.raises(TypeError, match=needle) as info:
        rollout(namespace["f"])
    assert "@rollout" in str(info.value)


def test_missing_resource_raises_lookup_error_naming_items(memory_store):
    res = memory_store.add_resources({"tpl": PROMPT_ITEM, "temperature": 0.5})
    rollout_obj = Rollout(rollout_id="ro-x", input=1)
    with pytest.raises(LookupError) as info:
        llm_agent.run_for(rollout_obj, res)
    message = str(info.value)
    assert "'llm'" in message and "tpl" in message and "temperature" in message
    # Through a runner the same error fails the attempt with that message.
    (r,) = run_tasks(memory_store, llm_agent, [1], resources={"tpl": PROMPT_ITEM})
    error = error_of(memory_store, r.rollout_id)
    assert r.status == RolloutStatus.FAILED and error.type == "LookupError" and "tpl" in error.message


def test_ambiguous_resource_raises_lookup_error():
    res = Resources(
        resources_id="r", version=1, items={"a": LLM_ITEM, "b": LLM(endpoint="http://x.invalid", model="n")}
    )
    with pytest.raises(LookupError, match="several"):
        llm_agent.run_for(Rollout(rollout_id="ro-x"), res)


def test_function_agent_pickles_by_reference():
    data = pickle.dumps(agents_for_tests.reward_agent)
    assert b"agents_for_tests" in data and len(data) < 300
    assert pickle.loads(data) is agents_for_tests.reward_agent
    # a plain function wrapped at run time (as Runner does) pickles by reference too
    wrapped = FunctionAgent(agents_for_tests.plain_agent)
    loaded = pickle.loads(pickle.dumps(wrapped))
    assert isinstance(loaded, FunctionAgent) and loaded.func is agents_for_tests.plain_agent


def test_pickled_agent_runs(memory_store):
    agent = pickle.loads(pickle.dumps(agents_for_tests.reward_agent))
    (r,) = run_tasks(memory_store, agent, [{"x": 4}])
    assert r.status == RolloutStatus.SUCCEEDED and r.reward == pytest.approx(0.4)


@pytest.mark.parametrize("bad", ["high", float("nan"), True, {"score": 1.0}])
def test_bad_return_values_fail_with_a_message(memory_store, bad):
    @rollout
    def agent(task, resources):
        return bad

    (r,) = run_tasks(memory_store, agent, [0])
    attempt = memory_store.get_latest_attempt(r.rollout_id)
    assert r.status == RolloutStatus.FAILED and attempt.status == AttemptStatus.FAILED
    assert attempt.error.type == "RewardError"
    assert "reward" in attempt.error.message


# ---- as_agent and load_agent("module:attribute") -----------------------------------------------------


def test_load_agent_instantiates_an_agent_subclass(memory_store):
    agent = load_agent("agents_for_tests:EchoAgent")
    assert type(agent) is agents_for_tests.EchoAgent and agent.name == "echo"
    assert [r.reward for r in run_tasks(memory_store, agent, [0])] == [1.0]


def test_load_agent_uses_an_instance_and_a_function_as_they_are():
    assert load_agent("agents_for_tests:echo_agent") is agents_for_tests.echo_agent
    assert load_agent("agents_for_tests:reward_agent") is agents_for_tests.reward_agent
    plain = load_agent("agents_for_tests:plain_agent")
    assert isinstance(plain, FunctionAgent) and plain.func is agents_for_tests.plain_agent
    assert load_agent("agents_for_tests:Holder.agent") is agents_for_tests.Holder.agent


def test_load_agent_from_a_file_path(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "my_file_agent", raising=False)
    (tmp_path / "my_file_agent.py").write_text(
        "from agentgrad import Agent\n\n"
        "class MyAgent(Agent):\n"
        "    def rollout(self, task, resources, rollout):\n"
        "        return 1.0\n"
    )
    agent = load_agent(f"{tmp_path / 'my_file_agent.py'}:MyAgent")
    assert type(agent).__name__ == "MyAgent" and isinstance(agent, Agent)


@pytest.mark.parametrize(
    ("attribute", "needles"),
    [
        ("NeedsArgsAgent", ["needs constructor argument(s) model", "no arguments", "NeedsArgsAgent(...)"]),
        ("NotAnAgentClass", ["NotAnAgentClass is a class that does not subclass agentgrad.Agent", EXPECTED_AGENT]),
        ("not_an_agent", ["got a str", EXPECTED_AGENT]),
        ("bad_signature", ["temperature"]),
    ],
    ids=["subclass-needing-arguments", "class-not-an-agent", "not-callable", "function-of-a-bad-shape"],
)
def test_load_agent_names_what_was_expected(attribute, needles):
    with pytest.raises(InvalidInputError) as info:
        load_agent(f"agents_for_tests:{attribute}")
    message = str(info.value)
    assert message.startswith(f"agents_for_tests:{attribute} is not an agent: "), message
    for needle in needles:
        assert needle in message
    assert "parameter" not in message or attribute == "bad_signature"  # the old, misleading message


def test_the_agents_own_constructor_error_comes_through():
    with pytest.raises(RuntimeError, match="cannot reach the tool server"):
        load_agent("agents_for_tests:BrokenConstructorAgent")


def test_load_agent_spec_errors():
    with pytest.raises(InvalidInputError, match="module:attribute"):
        load_agent("agents_for_tests")
    with pytest.raises(InvalidInputError, match="cannot import 'no_such_module_xyz'"):
        load_agent("no_such_module_xyz:agent")
    with pytest.raises(InvalidInputError, match="has no attribute 'Holder.missing'"):
        load_agent("agents_for_tests:Holder.missing")


def test_as_agent_accepts_a_class_and_refuses_other_shapes():
    assert isinstance(as_agent(SyncAgent), SyncAgent)
    with pytest.raises(NotAnAgentError, match="needs constructor argument"):
        as_agent(agents_for_tests.NeedsArgsAgent)
    with pytest.raises(TypeError, match="got an int"):  # NotAnAgentError is a TypeError, as before
        as_agent(3)  # type: ignore[arg-type]
    with pytest.raises(NotAnAgentError, match="does not subclass agentgrad.Agent"):
        as_agent(dict)  # type: ignore[arg-type]

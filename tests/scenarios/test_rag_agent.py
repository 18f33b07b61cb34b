"""examples/rag end to end: the Agents SDK searcher through the capture proxy, on the tiny model.

The tiny model was not warmed up on this scenario, so what it answers does not matter here: the
program must run unchanged under a runner, every call it makes must be stored with the agent's
name (`searcher`) and token ids that decode to what the SDK received, and each rollout must carry
its reward (exact match) with token F1 beside it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from capture_check import Capture, run_and_check

from agentgrad import semconv
from agentgrad.agents import load_agent
from agentgrad.scenarios.rag.files import task_of, write_split
from agentgrad.scenarios.rag.world import generate_split

pytest.importorskip("agents", reason="the OpenAI Agents SDK is not installed (make frameworks)")

pytestmark = pytest.mark.tiny_model  # runs last: see tests/conftest.py

AGENT = Path(__file__).parents[2] / "examples" / "rag" / "rag_agent.py"


def test_rag_agent_through_the_proxy(capture: Capture, tmp_path: Path) -> None:
    files = write_split(tmp_path, "val", seed=0, questions=2)  # one 1-hop, one 2-hop question
    questions = generate_split("val", 0).questions
    tasks = [task_of(q, files.corpus) for q in questions if q.hops == 1][:1] + [
        task_of(q, files.corpus) for q in questions if q.hops == 2
    ][:1]
    spans = run_and_check(capture, load_agent(f"{AGENT}:rag_agent"), tasks=tasks)
    assert {s.attributes[semconv.AGENT_NAME] for s in spans} == {"searcher"}  # Agent.name, not the function's
    rollouts = {s.rollout_id for s in spans}
    assert len(rollouts) == 2
    for rollout_id in rollouts:
        rewards = capture.store.query_spans(rollout_id, name=semconv.SPAN_REWARD)
        assert len(rewards) == 1, rewards
        attributes = rewards[0].attributes
        assert attributes[semconv.REWARD_PRIMARY] == "em"
        assert attributes[semconv.REWARD_VALUE] in (0.0, 1.0)
        assert 0.0 <= attributes[semconv.REWARD_PREFIX + "f1"] <= 1.0


def test_rag_agent_searches_twice_and_scores_with_a_scripted_model(tmp_path: Path) -> None:
    """The agent's whole path with a model that behaves as a good searcher would: a refused empty
    query, the question's entity, then the entity its entry names, then the answer. The model is
    the scripted stand-in (``agentgrad.testing.stub``), not a model: the tiny one does not search."""
    from agentgrad.proxy import LLMProxy
    from agentgrad.store import open_store
    from agentgrad.testing.stub import STUB_MODEL, StubUpstream, tool_reply
    from agentgrad.trainer import Trainer
    from agentgrad.types import LLM

    files = write_split(tmp_path, "val", seed=0, questions=2)
    world = generate_split("val", 0)
    question = next(q for q in world.questions if q.hops == 2)
    first, bridge = (world.by_id[i] for i in question.support)
    script = [
        tool_reply("search", {"query": ""}, "call_1"),
        tool_reply("search", {"query": first.title}, "call_2"),
        tool_reply("search", {"query": bridge.title}, "call_3"),
        f"<answer>{question.answer}</answer>",
    ]
    with (
        StubUpstream(script) as stub,
        open_store("memory", watchdog=False) as store,
        LLMProxy(store, f"http://127.0.0.1:{stub.port}/v1") as proxy,
    ):
        Trainer(store, proxy=proxy).dev(
            load_agent(f"{AGENT}:rag_agent"),
            [task_of(question, files.corpus)],
            {"llm": LLM(endpoint=f"http://127.0.0.1:{stub.port}/v1", model=STUB_MODEL)},
            timeout=120,
            print_summary=False,
        )
        (rollout,) = store.query_rollouts()
        calls = store.query_spans(rollout.rollout_id, name=semconv.SPAN_LLM_CALL)
        (reward,) = store.query_spans(rollout.rollout_id, name=semconv.SPAN_REWARD)
    assert rollout.status.value == "succeeded" and rollout.reward == 1.0
    assert reward.attributes[semconv.REWARD_PREFIX + "f1"] == 1.0
    assert [c.attributes[semconv.AGENT_NAME] for c in calls] == ["searcher"] * 4
    tool_replies = [[m["content"] for m in request["messages"] if m["role"] == "tool"] for request in stub.requests]
    assert tool_replies[1][0].startswith("Error: empty query")  # told why, and the run went on
    assert first.text in tool_replies[2][1]
    assert bridge.text in tool_replies[3][2] and question.answer in tool_replies[3][2]

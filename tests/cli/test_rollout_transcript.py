"""What a person reads about a rollout: ``dev``'s lowest-reward example and the cut-reply warning,
and ``rollouts show``'s transcript — from real LLM calls through the capture proxy to a stand-in
upstream (``StubUpstream``: a scripted OpenAI server, whose tokens are characters)."""

from __future__ import annotations

import io

import openai
from rich.console import Console

import agentgrad
from agentgrad.cli.transcript import transcript
from agentgrad.proxy import LLMProxy
from agentgrad.store.memory import MemoryStore
from agentgrad.testing.stub import StubUpstream, tool_reply
from agentgrad.trainer import Trainer
from agentgrad.types import LLM

FAST = {"poll_timeout": 0.05, "heartbeat_interval": 0.2}
TOOL = {
    "type": "function",
    "function": {"name": "calc", "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}},
}


def calculator_agent(task, llm):
    """Asks, runs the tool the model calls, asks again with a small token limit."""
    client = openai.OpenAI(base_url=llm.endpoint, api_key="none", max_retries=0)
    messages = [{"role": "system", "content": "Use calc."}, {"role": "user", "content": "What is 2 + 3?"}]
    first = client.chat.completions.create(model=llm.model, messages=messages, tools=[TOOL])
    call = first.choices[0].message.tool_calls[0]
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": "calc", "arguments": call.function.arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    client.chat.completions.create(model=llm.model, messages=messages, tools=[TOOL], max_tokens=5)
    return task["reward"]


def test_dev_shows_the_lowest_reward_and_counts_replies_cut_at_the_token_limit():
    store = MemoryStore(watchdog_interval=None)
    out = Console(file=io.StringIO(), width=200, force_terminal=False)
    replies = [tool_reply("calc", {"expression": "2+3"}), "The answer is 5."]
    with StubUpstream(replies) as upstream, LLMProxy(store, f"http://127.0.0.1:{upstream.port}/v1") as proxy:
        trainer = Trainer(store, proxy=proxy.url, runner_options=FAST, console=out)
        llm = LLM(endpoint=f"http://127.0.0.1:{upstream.port}/v1", model="m")
        report = trainer.dev(calculator_agent, [{"reward": 1.0}, {"reward": 0.0}], {"llm": llm}, timeout=30)

    assert report.llm_calls_per_rollout == [2, 2]
    assert report.calls_cut_at_token_limit == 2 and report.as_dict()["llm_calls_cut_at_token_limit"] == 2
    lowest = report.lowest
    worst = next(r for r in report.rollouts if r.reward == 0.0)
    assert lowest is not None and lowest.rollout_id == worst.rollout_id and lowest.reward == 0.0
    assert (lowest.llm_calls, lowest.asked, lowest.reply, lowest.finish_reason) == (2, ("tool", "5"), "The a", "length")
    printed = out.file.getvalue()
    assert "2 of 4 LLM call(s) were cut at their token limit" in printed
    assert f"lowest reward (0): {worst.rollout_id}, 2 LLM call(s)" in printed
    assert "    tool: 5\n    reply: The a\n    (cut at the token limit: max_tokens)" in printed

    lines = list(transcript(worst, store.get_attempts(worst.rollout_id), store.query_spans(worst.rollout_id, "latest")))
    text = "\n".join(lines)
    assert lines[0].startswith(f"rollout {worst.rollout_id} · succeeded · train · reward 0 · 1 attempt(s) · 2 LLM")
    assert lines[1] == 'input: {"reward": 0.0}'
    first, second = (i for i, line in enumerate(lines) if line.startswith("LLM call "))
    assert "tools: calc" in lines[first] and "finish: tool_calls" in lines[first]
    assert lines[first + 1 : first + 5] == [
        "  system: Use calc.",
        "  user: What is 2 + 3?",
        "  ── reply ──",
        '  assistant: → calc({"expression": "2+3"})',
    ]
    # The second call goes on from the first: only its new message is shown, then its cut reply.
    assert "finish: length (cut at the token limit)" in lines[second]
    assert lines[second + 1 : second + 5] == [
        "  … 3 message(s) as in the call above",
        "  tool: [call_1] 5",
        "  ── reply ──",
        "  assistant: The a",
    ]
    assert lines[-1] == "reward 0" and "not trainable" not in text
    store.close()


def writer_and_checker(task, llm):
    """Two agents of one program, named by scopes, the checker called twice."""
    client = openai.OpenAI(base_url=llm.endpoint, api_key="none", max_retries=0)
    ask = [{"role": "user", "content": "?"}]
    with agentgrad.agent("writer"):
        client.chat.completions.create(model=llm.model, messages=ask)
    with agentgrad.agent("checker"):
        for _ in range(2):
            client.chat.completions.create(model=llm.model, messages=ask)
    return 1.0


def test_dev_counts_the_calls_of_each_agent_name_that_agent_match_selects_from():
    store = MemoryStore(watchdog_interval=None)
    out = Console(file=io.StringIO(), width=200, force_terminal=False)
    with StubUpstream() as upstream, LLMProxy(store, f"http://127.0.0.1:{upstream.port}/v1") as proxy:
        trainer = Trainer(store, proxy=proxy.url, runner_options=FAST, console=out)
        llm = LLM(endpoint=f"http://127.0.0.1:{upstream.port}/v1", model="m")
        report = trainer.dev(writer_and_checker, [{}, {}], {"llm": llm}, timeout=30)

    assert report.calls_by_agent == {"checker": 4, "writer": 2}
    assert report.as_dict()["llm_calls_by_agent"] == {"checker": 4, "writer": 2}
    assert "LLM calls by agent: checker 4 · writer 2 (the names --agent-match" in out.file.getvalue()


def test_a_rollout_without_spans_still_reads():
    store = MemoryStore(watchdog_interval=None)
    (rollout,) = store.enqueue_rollouts([store_request()])
    lines = list(transcript(rollout, [], []))
    assert lines[0].startswith(f"rollout {rollout.rollout_id} · queuing · train · reward — · 0 attempt(s)")
    assert lines[1].startswith('input: {"q": "xxx') and lines[1].endswith("…") and len(lines[1]) == 7 + 500
    assert lines[-1] == "no spans"
    store.close()


def store_request():
    from agentgrad.store.protocol import RolloutRequest

    return RolloutRequest(input={"q": "x" * 1000})

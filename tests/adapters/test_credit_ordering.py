"""Exact per-call credit: rewards follow the call that happened before them, not the one stored before.

The capture proxy stores LLM call spans *behind* its answers (write-behind), while a reward is
stored the moment it is emitted, so the store's ``sequence_id`` can put a reward before the very
call it follows. These tests make that race certain — the proxy's span writes land late through a
slow store — and check that credit, call order and the runner's reward of a returned value all
follow when things happened.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from agentgrad import semconv
from agentgrad.adapters import Emitted, RolloutTrace, TransitionAdapter, extract_calls
from agentgrad.algorithms.apo import render_trace
from agentgrad.emit import emit_message, emit_reward
from agentgrad.proxy import LLMProxy
from agentgrad.runner import Runner
from agentgrad.store.protocol import Store
from agentgrad.testing.stub import StubUpstream
from agentgrad.types import LLM, Span

ROLLOUTS = 50
#: How late each of the proxy's span writes lands: far longer than an agent takes to emit a reward.
WRITE_DELAY = 0.03


class SlowSpanWrites:
    """The store as the proxy sees it: every span write is delayed (a slow or remote store)."""

    def __init__(self, store: Store, delay: float) -> None:
        self._store, self._delay = store, delay

    def add_spans(self, spans: list[Span]) -> list[Span]:
        time.sleep(self._delay)
        return self._store.add_spans(spans)

    def add_span(self, span: Span) -> Span:
        time.sleep(self._delay)
        return self._store.add_span(span)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@pytest.fixture
def slow_proxy(memory_store: Store) -> Iterator[LLMProxy]:
    """A write-behind proxy (the default ``record_mode``) whose span writes are slow."""
    with (
        StubUpstream(["first answer", "second answer"]) as stub,
        LLMProxy(SlowSpanWrites(memory_store, WRITE_DELAY), f"http://127.0.0.1:{stub.port}/v1") as proxy,
    ):
        yield proxy


def _ask(llm: LLM, question: str) -> None:
    client = openai.OpenAI(base_url=llm.endpoint, api_key="k", max_retries=0)
    client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": question}])


def emits_two_rewards(task: dict, llm: LLM) -> None:
    _ask(llm, f"{task['i']}: first")
    emit_reward(0.25)
    _ask(llm, f"{task['i']}: second")
    emit_reward(1.0)


def emits_then_returns(task: dict, llm: LLM) -> float:
    _ask(llm, f"{task['i']}: first")
    emit_reward(0.25)
    _ask(llm, f"{task['i']}: second")
    return 1.0  # the runner stores it as the last reward span


async def emits_then_returns_async(task: dict, llm: LLM) -> float:
    """:func:`emits_then_returns` as an async agent: the runner flushes the proxy on its loop."""
    client = openai.AsyncOpenAI(base_url=llm.endpoint, api_key="k", max_retries=0)
    for question, reward in ((f"{task['i']}: first", 0.25), (f"{task['i']}: second", None)):
        await client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": question}])
        if reward is not None:
            emit_reward(reward)
    await client.close()
    return 1.0


def _run(store: Store, proxy: LLMProxy, agent: Any, *, over_http: bool) -> None:
    for i in range(ROLLOUTS):
        store.enqueue_rollout({"i": i})
    runner = Runner(
        agent,
        store,
        concurrency=4,
        max_rollouts=ROLLOUTS,
        poll_timeout=0.1,
        llm_proxy_url=proxy.url,
        llm_proxy=None if over_http else proxy,
    )
    stats = runner.run()
    assert stats.succeeded == ROLLOUTS, stats.errors


def _credits(store: Store) -> tuple[list[list[float]], int]:
    """Each rollout's rewards per call under ``credit="emitted"``, and how many rollouts the store
    received out of order (a reward with a smaller ``sequence_id`` than the call it follows)."""
    rollouts = store.query_rollouts()
    assert len(rollouts) == ROLLOUTS
    adapter = TransitionAdapter("emitted", merge=False)
    credits, misordered = [], 0
    for rollout in rollouts:
        transitions, _ = adapter.adapt(store, [rollout])
        credits.append([t.reward for t in transitions])
        spans = store.query_spans(rollout.rollout_id, "latest")
        first_call = min(s.sequence_id for s in spans if s.name == semconv.SPAN_LLM_CALL)
        first_reward = min(s.sequence_id for s in spans if s.name == semconv.SPAN_REWARD)
        misordered += first_reward < first_call
    return credits, misordered


@pytest.mark.parametrize("over_http", [False, True], ids=["in-process flush", "flush over HTTP"])
def test_emitted_rewards_credit_the_call_they_follow_with_slow_write_behind(
    memory_store, slow_proxy, over_http
) -> None:
    _run(memory_store, slow_proxy, emits_two_rewards, over_http=over_http)
    credits, misordered = _credits(memory_store)
    assert misordered > 0, "the slow writer never stored a call after its reward: this test tests nothing"
    assert credits == [[0.25, 1.0]] * ROLLOUTS


@pytest.mark.parametrize("agent", [emits_then_returns, emits_then_returns_async], ids=["sync agent", "async agent"])
@pytest.mark.parametrize("over_http", [False, True], ids=["in-process flush", "flush over HTTP"])
def test_returned_reward_is_stored_after_every_call(memory_store, slow_proxy, over_http, agent) -> None:
    _run(memory_store, slow_proxy, agent, over_http=over_http)
    credits, misordered = _credits(memory_store)
    assert misordered > 0, "the slow writer never stored a call after its reward: this test tests nothing"
    assert credits == [[0.25, 1.0]] * ROLLOUTS
    for rollout in memory_store.query_rollouts():
        spans = memory_store.query_spans(rollout.rollout_id, "latest")
        last = max(s.sequence_id for s in spans if s.name == semconv.SPAN_LLM_CALL)
        final = max((s for s in spans if s.name == semconv.SPAN_REWARD), key=lambda s: s.sequence_id)
        # The runner flushed the proxy first: even in the store's own order, it follows every call.
        assert final.attributes[semconv.REWARD_VALUE] == 1.0 and final.sequence_id > last
        assert rollout.reward == 1.0


# ---- hand-made spans: sequence ids that disagree with the clocks -------------------------------


def _call(seq: int, start: float, end: float, span_id: str) -> Span:
    return Span(
        rollout_id="r",
        attempt_id="a",
        span_id=span_id,
        name=semconv.SPAN_LLM_CALL,
        sequence_id=seq,
        start_time=start,
        end_time=end,
        attributes={semconv.LLM_PROMPT_TOKEN_IDS: [seq], semconv.LLM_COMPLETION_TOKEN_IDS: [seq]},
    )


def _reward(seq: int, at: float, value: float) -> Span:
    return Span(
        rollout_id="r",
        attempt_id="a",
        name=semconv.SPAN_REWARD,
        sequence_id=seq,
        start_time=at,
        end_time=at,
        attributes={semconv.REWARD_VALUE: value},
    )


def test_calls_are_ordered_by_when_they_started_not_when_they_were_stored() -> None:
    spans = [_call(1, 20.0, 21.0, "late"), _call(2, 10.0, 11.0, "early"), _call(3, 10.0, 12.0, "tie")]
    calls = extract_calls(spans)
    # By start time; the store's order breaks the tie between the two that started together.
    assert [c.span_id for c in calls] == ["early", "tie", "late"] and [c.index for c in calls] == [0, 1, 2]
    assert (calls[0].start_time, calls[0].end_time) == (10.0, 11.0)


def test_emitted_links_each_reward_to_the_last_call_that_finished_before_it() -> None:
    # What the store holds after a slow write-behind: every reward has a smaller sequence id than
    # the call it follows. By the clocks: call A 0–1 s, reward 0.25 at 1.5 s, call B 2–3 s, reward
    # 1.0 at 3.5 s, call C 4–5 s (nothing follows it), reward -1 at 0.5 s (before any call ended).
    spans = [
        _reward(1, 0.5, -1.0),
        _reward(2, 1.5, 0.25),
        _reward(3, 3.5, 1.0),
        _call(4, 0.0, 1.0, "A"),
        _call(5, 4.0, 5.0, "C"),
        _call(6, 2.0, 3.0, "B"),
    ]
    calls = extract_calls(spans)
    assert [c.span_id for c in calls] == ["A", "B", "C"]
    rewards = [s for s in spans if s.name == semconv.SPAN_REWARD]
    assert Emitted().assign(RolloutTrace("r", calls, rewards, final_reward=1.0)) == [-0.75, 1.0, 0.0]


def test_emitted_with_overlapping_calls_credits_the_one_that_finished_last() -> None:
    # Two calls in flight at once (parallel tools): A 0–4 s, B 1–2 s. A reward at 3 s follows B
    # (A is still running); one at 5 s follows A, the last to finish before it.
    spans = [_call(1, 0.0, 4.0, "A"), _call(2, 1.0, 2.0, "B"), _reward(3, 3.0, 0.5), _reward(4, 5.0, 2.0)]
    calls = extract_calls(spans)
    rewards = [s for s in spans if s.name == semconv.SPAN_REWARD]
    assert Emitted().assign(RolloutTrace("r", calls, rewards, final_reward=2.0)) == [2.0, 0.5]


def test_apo_trace_lists_what_happened_in_the_order_it_happened(memory_store, slow_proxy) -> None:
    """The critic's trace of an agent that logs between its calls, recorded write-behind."""

    def narrates(task: dict, llm: LLM) -> float:
        _ask(llm, "first")
        emit_message("between the calls")
        _ask(llm, "second")
        emit_message("after the calls")
        return 1.0

    memory_store.enqueue_rollout({"i": 0})
    Runner(
        narrates, memory_store, max_rollouts=1, poll_timeout=0.1, llm_proxy_url=slow_proxy.url, llm_proxy=slow_proxy
    ).run()
    (rollout,) = memory_store.query_rollouts()
    lines = render_trace(memory_store, rollout, max_chars=10_000).splitlines()
    assert lines == [
        "[llm] user: first",
        "[llm] assistant: first answer",
        "[message] between the calls",
        "[llm] user: second",
        "[llm] assistant: second answer",
        "[message] after the calls",
    ]

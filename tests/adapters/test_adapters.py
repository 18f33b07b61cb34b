"""Credit assignment, agent_match and prefix merging on span trees written to a real store."""

from __future__ import annotations

import math

import pytest

from agentgrad import semconv
from agentgrad.adapters import (
    AIR,
    Discounted,
    Emitted,
    RolloutTrace,
    TransitionAdapter,
    credit_rule,
    extract_calls,
    group_advantages,
)
from agentgrad.types import AttemptStatus, Span, Transition


def llm_span(
    rid,
    aid,
    prompt,
    completion,
    *,
    text="",
    tool_calls=None,
    messages=None,
    agent=None,
    parent=None,
    version="v0",
    ids=True,
    span_id=None,
):
    attrs = {
        semconv.LLM_REQUEST: {"messages": messages or []},
        semconv.LLM_RESPONSE: {"choices": [{"message": {"content": text, "tool_calls": tool_calls}}]},
        semconv.MODEL_VERSION: version,
    }
    if ids:
        attrs[semconv.LLM_PROMPT_TOKEN_IDS] = prompt
        attrs[semconv.LLM_COMPLETION_TOKEN_IDS] = completion
        attrs[semconv.LLM_LOGPROBS] = [-0.5] * len(completion)
    if agent:
        attrs[semconv.AGENT_NAME] = agent
    kwargs = {"span_id": span_id} if span_id else {}
    return Span(
        rollout_id=rid, attempt_id=aid, name=semconv.SPAN_LLM_CALL, parent_id=parent, attributes=attrs, **kwargs
    )


def reward_span(rid, aid, value):
    return Span(rollout_id=rid, attempt_id=aid, name=semconv.SPAN_REWARD, attributes={semconv.REWARD_VALUE: value})


def run_rollout(store, spans_of, group_id=None, succeed=True):
    """Enqueue + claim a rollout, write ``spans_of(rid, aid)`` one by one, finish it."""
    store.enqueue_rollout({"q": 1}, metadata={"group_id": group_id} if group_id else {})
    claimed = store.dequeue_rollout("w")
    rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
    for span in spans_of(rid, aid):
        store.add_span(span)
    store.update_attempt(rid, aid, AttemptStatus.SUCCEEDED if succeed else AttemptStatus.FAILED)
    return store.get_rollout(rid)


def two_turns(reward, *, extend=True):
    """A tool-calling exchange: call 2's prompt extends call 1's prompt + completion (or not)."""

    def spans(rid, aid):
        p1, c1 = [1, 2, 3], [10, 11]
        p2 = p1 + c1 + [20, 21] if extend else [1, 2, 99]
        return [llm_span(rid, aid, p1, c1), llm_span(rid, aid, p2, [30, 31, 32]), reward_span(rid, aid, reward)]

    return spans


def test_merge_extending_prompts_into_one_masked_sequence(memory_store):
    rollout = run_rollout(memory_store, two_turns(1.0))
    transitions, stats = TransitionAdapter().adapt(memory_store, [rollout])
    assert len(transitions) == 1 and stats.merged_calls == 1 and stats.transitions == 1
    t = transitions[0]
    assert t.prompt_ids == [1, 2, 3]
    assert t.response_ids == [10, 11, 20, 21, 30, 31, 32]
    assert t.response_mask == [1, 1, 0, 0, 1, 1, 1]
    assert t.response_logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5, -0.5, -0.5]
    assert t.reward == 1.0 and t.metadata["calls"] == [0, 1] and t.model_version == "v0"


def test_non_extending_prompts_stay_separate(memory_store):
    rollout = run_rollout(memory_store, two_turns(1.0, extend=False))
    transitions, stats = TransitionAdapter().adapt(memory_store, [rollout])
    assert [t.response_ids for t in transitions] == [[10, 11], [30, 31, 32]]
    assert stats.merged_calls == 0 and stats.transitions == 2
    merged_off, _ = TransitionAdapter(merge=False).adapt(memory_store, [run_rollout(memory_store, two_turns(1.0))])
    assert len(merged_off) == 2


def test_final_credit_on_every_call(memory_store):
    rollout = run_rollout(memory_store, two_turns(0.7, extend=False))
    transitions, _ = TransitionAdapter("final").adapt(memory_store, [rollout])
    assert [t.reward for t in transitions] == [0.7, 0.7]


def test_discounted_credit_and_merge_split_on_different_rewards(memory_store):
    rollout = run_rollout(memory_store, two_turns(1.0))
    transitions, stats = TransitionAdapter("discounted:0.5").adapt(memory_store, [rollout])
    # Different rewards cannot share one sequence: the calls stay separate even though they extend.
    assert [t.reward for t in transitions] == [0.5, 1.0] and stats.merged_calls == 0


def test_emitted_rewards_follow_their_call_and_fall_back_to_final(memory_store):
    def spans(rid, aid):
        return [
            llm_span(rid, aid, [1], [2]),
            reward_span(rid, aid, 0.25),
            llm_span(rid, aid, [5], [6]),
            llm_span(rid, aid, [7], [8]),
            reward_span(rid, aid, 1.0),
        ]

    rollout = run_rollout(memory_store, spans)
    transitions, _ = TransitionAdapter("emitted").adapt(memory_store, [rollout])
    assert [t.reward for t in transitions] == [0.25, 0.0, 1.0]
    # No reward span at all: every call gets the final reward.
    calls = extract_calls(memory_store.query_spans(rollout.rollout_id, "latest"))
    assert Emitted().assign(RolloutTrace("r", calls, [], final_reward=0.4)) == [0.4, 0.4, 0.4]


def test_air_penalties_from_system_signals(memory_store):
    bad_json = '<tool_call>\n{"name": "calculator", "arguments": {oops}\n</tool_call>'
    call = {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "1/0"}'}}

    def spans(rid, aid):
        history = [
            {"role": "user", "content": "q"},
            {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "Error: division by zero"},
        ]
        return [
            llm_span(rid, aid, [1], [2, 3], text=bad_json),  # unparsable tool call
            llm_span(rid, aid, [4], [5], tool_calls=[call]),  # its tool errors …
            llm_span(rid, aid, [6], [5], messages=history, tool_calls=[call]),  # … seen here; repeat of call 1
            reward_span(rid, aid, 1.0),
        ]

    rollout = run_rollout(memory_store, spans)
    rule = AIR(unparsable_tool_call=-0.5, tool_error=-0.25, repeated_call=-0.1)
    calls = extract_calls(memory_store.query_spans(rollout.rollout_id, "latest"))
    trace = RolloutTrace(rollout.rollout_id, calls, [], final_reward=1.0)
    assert rule.signals(trace) == [["unparsable_tool_call"], ["tool_error"], ["repeated_call"]]
    assert rule.assign(trace) == [0.5, 0.75, 0.9]
    transitions, _ = TransitionAdapter(rule).adapt(memory_store, [rollout])
    assert [t.reward for t in transitions] == [0.5, 0.75, 0.9]


def test_agent_match_from_attribute_and_from_ancestor_scope(memory_store):
    def spans(rid, aid):
        scope = Span(
            rollout_id=rid,
            attempt_id=aid,
            span_id="scope1",
            name=semconv.SPAN_AGENT,
            attributes={semconv.AGENT_NAME: "writer"},
        )
        op = Span(rollout_id=rid, attempt_id=aid, span_id="op1", parent_id="scope1", name=semconv.SPAN_OPERATION)
        return [
            llm_span(rid, aid, [1], [2], agent="checker"),
            llm_span(rid, aid, [3], [4], parent="op1"),  # nested under the writer scope
            llm_span(rid, aid, [5], [6]),  # no name anywhere
            op,
            scope,
            reward_span(rid, aid, 1.0),
        ]

    rollout = run_rollout(memory_store, spans)
    writer, stats = TransitionAdapter(agent_match="^writ").adapt(memory_store, [rollout])
    assert [(t.agent_name, t.prompt_ids) for t in writer] == [("writer", [3])]
    assert stats.calls_other_agents == 2
    everyone, _ = TransitionAdapter().adapt(memory_store, [rollout])
    assert [t.agent_name for t in everyone] == ["checker", "writer", None]


def test_call_without_token_ids_is_reported_and_excluded(memory_store):
    def spans(rid, aid):
        return [llm_span(rid, aid, [1], [2]), llm_span(rid, aid, [3], [4], ids=False), reward_span(rid, aid, 1.0)]

    rollout = run_rollout(memory_store, spans)
    transitions, stats = TransitionAdapter().adapt(memory_store, [rollout])
    assert stats.calls_without_token_ids == [(rollout.rollout_id, 1)]
    assert [t.prompt_ids for t in transitions] == [[1]]
    assert stats.as_metrics()["adapter/calls_without_token_ids"] == 1


def test_failed_and_empty_rollouts_give_nothing_and_are_counted(memory_store):
    failed = run_rollout(memory_store, two_turns(1.0), succeed=False)
    empty = run_rollout(memory_store, lambda rid, aid: [reward_span(rid, aid, 1.0)])
    transitions, stats = TransitionAdapter().adapt(memory_store, [failed, empty])
    assert transitions == [] and stats.rollouts_not_succeeded == 1 and stats.rollouts_without_calls == 1


def _t(group, reward):
    return Transition(
        rollout_id=f"r{reward}",
        attempt_id="a",
        group_id=group,
        index=0,
        prompt_ids=[1],
        response_ids=[2],
        reward=reward,
    )


def test_group_advantages_grpo_dr_grpo_and_zero_variance_dropped():
    ts = [_t("g1", 1.0), _t("g1", 0.0), _t("g1", 0.0), _t("g1", 1.0), _t("g2", 1.0), _t("g2", 1.0)]
    kept, stats = group_advantages(ts, "grpo")
    assert stats.groups == 2 and stats.zero_variance_groups == 1 and stats.dropped_transitions == 2
    assert [round(t.advantage, 4) for t in kept] == [1.0, -1.0, -1.0, 1.0]
    kept, _ = group_advantages([_t("g", 1.0), _t("g", 0.0), _t("g", 0.0), _t("g", 0.0)], "dr_grpo")
    assert [t.advantage for t in kept] == [0.75, -0.25, -0.25, -0.25]


def test_credit_rule_names_and_custom_rules():
    assert credit_rule("discounted:0.8").gamma == 0.8  # type: ignore[attr-defined]
    assert isinstance(credit_rule("air"), AIR) and isinstance(credit_rule("discounted"), Discounted)
    with pytest.raises(ValueError, match="unknown credit rule"):
        credit_rule("nope")

    class Half:
        name = "half"

        def assign(self, trace):
            return [trace.final_reward / 2] * len(trace.calls)

    assert credit_rule(Half()).name == "half"
    assert math.isclose(Discounted(0.5).assign(RolloutTrace("r", [None, None, None], final_reward=4.0))[0], 1.0)  # type: ignore[list-item]

"""Reading LLM call spans (adapters.calls): one rule for token ids, and malformed spans never raise."""

from __future__ import annotations

import json
import math

import pytest

from agentgrad import semconv
from agentgrad.adapters.calls import extract_calls
from agentgrad.types import Span


def call_span(**attributes: object) -> Span:
    return Span(
        rollout_id="ro-1",
        attempt_id="at-1",
        span_id="s1",
        name=semconv.SPAN_LLM_CALL,
        sequence_id=1,
        attributes={
            semconv.LLM_PROMPT_TOKEN_IDS: [1, 2],
            semconv.LLM_COMPLETION_TOKEN_IDS: [3],
            **{getattr(semconv, k): v for k, v in attributes.items()},
        },
    )


def test_a_well_formed_call() -> None:
    (call,) = extract_calls(
        [
            call_span(
                LLM_LOGPROBS=[-0.5], GEN_AI_REQUEST_MODEL="m", LLM_FINISH_REASON="stop", GEN_AI_USAGE_INPUT_TOKENS=9
            )
        ]
    )
    assert call.has_token_ids and call.problems == []
    assert (call.prompt_ids, call.completion_ids, call.logprobs) == ([1, 2], [3], [-0.5])
    assert (call.model, call.finish_reason, call.prompt_tokens, call.completion_tokens) == ("m", "stop", 2, 1)


def test_token_ids_as_json_text_are_read() -> None:
    (call,) = extract_calls([call_span(LLM_PROMPT_TOKEN_IDS="[1, 2, 3]", LLM_COMPLETION_TOKEN_IDS=json.dumps([]))])
    assert (call.prompt_ids, call.completion_ids) == ([1, 2, 3], []) and call.has_token_ids


@pytest.mark.parametrize(
    "bad", [[1, True], [1, 2.0], [1, 2.7], ["1"], [1, None], "[1, 2", "12", 7, {"ids": [1]}], ids=repr
)
def test_malformed_token_ids_are_refused_whole_and_named(bad: object) -> None:
    (call,) = extract_calls([call_span(LLM_COMPLETION_TOKEN_IDS=bad)])
    assert call.completion_ids is None and not call.has_token_ids  # never coerced: not trainable
    assert call.prompt_ids == [1, 2]
    (problem,) = call.problems
    assert problem.startswith(f"{semconv.LLM_COMPLETION_TOKEN_IDS} is not a list of integers")


def test_absent_token_ids_are_not_a_problem() -> None:
    span = call_span()
    del span.attributes[semconv.LLM_PROMPT_TOKEN_IDS]
    (call,) = extract_calls([span])
    assert call.prompt_ids is None and not call.has_token_ids and call.problems == []


def test_empty_prompt_is_not_trainable() -> None:
    (call,) = extract_calls([call_span(LLM_PROMPT_TOKEN_IDS=[])])
    assert not call.has_token_ids


def test_logprobs_missing_entries_read_as_nan_and_garbage_is_refused() -> None:
    (call,) = extract_calls([call_span(LLM_LOGPROBS=[-0.1, None, -2])])
    assert call.logprobs is not None and call.logprobs[0] == -0.1 and math.isnan(call.logprobs[1])
    assert call.logprobs[2] == -2.0 and call.problems == []
    (bad,) = extract_calls([call_span(LLM_LOGPROBS=[-0.1, "x"])])
    assert bad.logprobs is None and bad.has_token_ids  # logprobs are optional: the call still trains
    assert bad.problems[0].startswith(f"{semconv.LLM_LOGPROBS} is not a list of numbers")


def test_usage_counts_must_be_counts() -> None:
    span = call_span(GEN_AI_USAGE_INPUT_TOKENS=True, GEN_AI_USAGE_OUTPUT_TOKENS=-1)
    del span.attributes[semconv.LLM_PROMPT_TOKEN_IDS], span.attributes[semconv.LLM_COMPLETION_TOKEN_IDS]
    (call,) = extract_calls([span])
    assert (call.prompt_tokens, call.completion_tokens) == (None, None)

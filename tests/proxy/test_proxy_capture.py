"""The proxy against the scripted upstream: what clients see and what the store gets."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from proxy_support import flush_all, new_attempt

from agentgrad import semconv
from agentgrad.context import RolloutContext, use_context
from agentgrad.demo.calc import CALCULATOR_TOOL
from agentgrad.proxy import LLMProxy
from agentgrad.store.protocol import Store
from agentgrad.testing.stub import STUB_MODEL, StubUpstream, decode
from agentgrad.tracing import instrument
from agentgrad.types import AttemptedRollout

MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]


def llm_spans(store: Store, claimed: AttemptedRollout) -> list:
    flush_all(claimed)
    return store.query_spans(claimed.rollout.rollout_id, claimed.attempt.attempt_id, name=semconv.SPAN_LLM_CALL)


def client_for(proxy: LLMProxy, claimed: AttemptedRollout, **options) -> openai.OpenAI:
    endpoint = proxy.endpoint_for(claimed.rollout.rollout_id, claimed.attempt.attempt_id)
    return openai.OpenAI(base_url=endpoint, api_key="sk-test", **options)


def test_chat_non_streamed_records_token_ids_and_hides_them(memory_store, stub, proxy, attempt) -> None:
    client = client_for(proxy, attempt)
    first = client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, tools=[CALCULATOR_TOOL])
    second = client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    assert first.choices[0].message.tool_calls[0].function.name == "calculator"
    assert second.choices[0].message.content == "The answer is 5."
    assert "prompt_token_ids" not in (second.model_extra or {})  # the client did not ask for them
    assert second.choices[0].logprobs is None
    assert stub.requests[0]["model"] == STUB_MODEL  # any name maps to the served model
    assert stub.requests[0]["return_token_ids"] is True and stub.requests[0]["logprobs"] is True

    assert stub.models_read == 1  # the served names, read once: an unlisted name re-reads them at most once a second

    spans = llm_spans(memory_store, attempt)
    assert len(spans) == 2
    attrs = spans[1].attributes
    assert decode(attrs[semconv.LLM_COMPLETION_TOKEN_IDS]) == "The answer is 5."
    assert decode(attrs[semconv.LLM_PROMPT_TOKEN_IDS]) == json.dumps(MESSAGES)
    assert len(attrs[semconv.LLM_LOGPROBS]) == len(attrs[semconv.LLM_COMPLETION_TOKEN_IDS])
    assert attrs[semconv.MODEL_VERSION] == "v0"
    assert attrs[semconv.LLM_REQUEST]["model"] == "gpt-4o-mini"
    assert attrs[semconv.LLM_RESPONSE] == second.model_dump(mode="json", exclude_unset=True)
    assert attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == len("The answer is 5.")
    assert memory_store.get_rollout(attempt.rollout.rollout_id).llm_calls == 2


def test_client_that_asks_for_token_ids_keeps_them(memory_store, proxy, attempt) -> None:
    reply = client_for(proxy, attempt).chat.completions.create(
        model="m", messages=MESSAGES, logprobs=True, extra_body={"return_token_ids": True}
    )
    assert reply.model_extra["prompt_token_ids"]
    assert reply.choices[0].model_extra["token_ids"]
    assert reply.choices[0].logprobs.content
    # the answer passed through unparsed; the span, built off the client's path, has it all the same
    (span,) = llm_spans(memory_store, attempt)
    assert span.attributes[semconv.LLM_RESPONSE] == reply.model_dump(mode="json", exclude_unset=True)
    assert span.attributes[semconv.LLM_COMPLETION_TOKEN_IDS] == reply.choices[0].model_extra["token_ids"]


def test_chat_streamed_passes_chunks_and_reassembles_tool_calls(memory_store, stub, proxy, attempt) -> None:
    client = client_for(proxy, attempt)
    chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, tools=[CALCULATOR_TOOL], stream=True))
    assert len(chunks) > 2 and all(chunk.choices for chunk in chunks)  # no usage chunk: not asked for
    arguments = "".join(
        c.choices[0].delta.tool_calls[0].function.arguments or "" for c in chunks if c.choices[0].delta.tool_calls
    )
    assert json.loads(arguments) == {"expression": "2 + 3"}
    assert stub.requests[0]["stream_options"] == {"include_usage": True}

    text_chunks = list(
        client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
    )
    assert text_chunks[-1].usage.completion_tokens == len("The answer is 5.")
    spans = llm_spans(memory_store, attempt)
    call, text = spans[0].attributes, spans[1].attributes
    assert call[semconv.LLM_STREAMED] is True
    tool_call = call[semconv.LLM_RESPONSE]["choices"][0]["message"]["tool_calls"][0]
    assert tool_call["function"] == {"name": "calculator", "arguments": arguments}
    assert decode(call[semconv.LLM_COMPLETION_TOKEN_IDS]).startswith("<tool_call>")
    received = "".join(c.choices[0].delta.content or "" for c in text_chunks if c.choices)
    assert decode(text[semconv.LLM_COMPLETION_TOKEN_IDS]) == received == "The answer is 5."
    assert text[semconv.LLM_RESPONSE]["usage"]["completion_tokens"] == len(received)


def test_completions_api(memory_store, proxy, attempt) -> None:
    reply = client_for(proxy, attempt).completions.create(model="m", prompt="2 + 3 =", max_tokens=8)
    span = llm_spans(memory_store, attempt)[0]
    assert decode(span.attributes[semconv.LLM_COMPLETION_TOKEN_IDS]) == reply.choices[0].text
    assert decode(span.attributes[semconv.LLM_PROMPT_TOKEN_IDS]) == "2 + 3 ="
    assert span.attributes[semconv.LLM_API] == "completions"


RESPONSES_TOOL = {
    "type": "function",
    "name": "calculator",
    "description": "Evaluate arithmetic.",
    "parameters": CALCULATOR_TOOL["function"]["parameters"],
}


def test_responses_api_translated_to_chat(memory_store, stub, proxy, attempt) -> None:
    client = client_for(proxy, attempt)
    first = client.responses.create(
        model="gpt-4o-mini", instructions="Be brief.", input="What is 2 + 3?", tools=[RESPONSES_TOOL]
    )
    (call,) = first.output
    assert call.type == "function_call" and call.name == "calculator"
    history = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "5"},
    ]
    second = client.responses.create(
        model="gpt-4o-mini", instructions="Be brief.", input=history, tools=[RESPONSES_TOOL]
    )
    assert second.output_text == "The answer is 5."
    sent = stub.requests[1]
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "tool"]
    assert sent["messages"][2]["tool_calls"][0]["id"] == call.call_id
    assert sent["tools"][0]["function"]["name"] == "calculator"
    span = llm_spans(memory_store, attempt)[1]
    assert span.attributes[semconv.LLM_API] == "responses"
    assert span.attributes[semconv.LLM_UPSTREAM_REQUEST]["messages"][3]["content"] == "5"
    assert decode(span.attributes[semconv.LLM_COMPLETION_TOKEN_IDS]) == second.output_text


def test_responses_api_streamed_events(memory_store, proxy, attempt) -> None:
    client = client_for(proxy, attempt)
    events = list(client.responses.create(model="m", input="What is 2 + 3?", tools=[RESPONSES_TOOL], stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds
    final = events[-1].response
    assert final.output[0].type == "function_call"
    assert json.loads(final.output[0].arguments) == {"expression": "2 + 3"}
    events = list(client.responses.create(model="m", input="What is 2 + 3?", stream=True))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text == "The answer is 5."
    spans = llm_spans(memory_store, attempt)
    assert decode(spans[1].attributes[semconv.LLM_COMPLETION_TOKEN_IDS]) == text
    assert spans[1].attributes[semconv.LLM_RESPONSE]["output"][0]["content"][0]["text"] == text


def test_headers_attribute_calls_and_name_the_agent(memory_store, proxy, attempt) -> None:
    headers = {
        "X-Rollout-Id": attempt.rollout.rollout_id,
        "X-Attempt-Id": attempt.attempt.attempt_id,
        "X-Agent-Name": "solver",
        "traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01",
    }
    client = openai.OpenAI(base_url=proxy.base_url, api_key="k", default_headers=headers)
    client.chat.completions.create(model="m", messages=MESSAGES)
    (span,) = llm_spans(memory_store, attempt)
    assert span.attributes[semconv.AGENT_NAME] == "solver"
    assert span.parent_id == "cd" * 8 and span.trace_id == "ab" * 16
    assert proxy.metrics.unattributed == 0


def test_call_without_rollout_is_forwarded_and_counted(memory_store, proxy) -> None:
    reply = openai.OpenAI(base_url=proxy.base_url, api_key="k").chat.completions.create(model="m", messages=MESSAGES)
    assert reply.choices[0].message.tool_calls
    assert proxy.metrics.unattributed == 1 and proxy.metrics.recorded == 0
    assert httpx.get(proxy.url + "/metrics").json()["unattributed"] == 1


def test_sdk_retry_after_upstream_error_is_one_span(memory_store, attempt) -> None:
    with (
        StubUpstream(["ok"], fail_first=1) as stub,
        LLMProxy(memory_store, f"http://127.0.0.1:{stub.port}/v1") as proxy,
    ):
        client = client_for(proxy, attempt, max_retries=2)
        client._client.timeout = 5  # noqa: SLF001 - keep the SDK's backoff short
        assert client.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content == "ok"
        assert len(stub.requests) == 2
    assert len(llm_spans(memory_store, attempt)) == 1


def test_retry_of_a_recorded_call_is_deduplicated(memory_store, proxy, attempt) -> None:
    url = proxy.endpoint_for(attempt.rollout.rollout_id, attempt.attempt.attempt_id) + "/chat/completions"
    body = json.dumps({"model": "m", "messages": MESSAGES}).encode()
    for retry in ("0", "1"):
        assert (
            httpx.post(
                url, content=body, headers={"x-stainless-retry-count": retry, "Content-Type": "application/json"}
            ).status_code
            == 200
        )
    httpx.post(
        url, content=body, headers={"Content-Type": "application/json"}
    )  # a fresh call with the same prompt is a new sample
    assert len(llm_spans(memory_store, attempt)) == 2
    assert proxy.metrics.retries_deduplicated == 1


def test_instrumented_shared_async_client_keeps_concurrent_rollouts_apart(memory_store, proxy) -> None:
    instrument()
    instrument()  # idempotent
    claimed = [new_attempt(memory_store) for _ in range(4)]
    client = openai.AsyncOpenAI(base_url=proxy.base_url, api_key="k")  # one client, no URL prefix

    async def run(one: AttemptedRollout, name: str) -> None:
        context = RolloutContext(
            store=memory_store, rollout=one.rollout, attempt=one.attempt, agent_name=name, parent_span_id=f"sp-{name}"
        )
        with use_context(context):
            for _ in range(2):
                await client.chat.completions.create(model="m", messages=MESSAGES)
                await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(*(run(one, f"agent{i}") for i, one in enumerate(claimed)))

    asyncio.run(main())
    for index, one in enumerate(claimed):
        spans = llm_spans(memory_store, one)
        assert len(spans) == 2
        assert {s.attributes[semconv.AGENT_NAME] for s in spans} == {f"agent{index}"}
        # With OpenInference installed the parent is its ChatCompletion span (stored in the same
        # attempt), whose parent is the agent scope; without it, the agent scope directly.
        by_id = {s.span_id: s for s in memory_store.query_spans(one.rollout.rollout_id)}
        for span in spans:
            parent = span.parent_id
            while parent in by_id:
                parent = by_id[parent].parent_id
            assert parent == f"sp-agent{index}"
    assert proxy.metrics.unattributed == 0


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_sync_mode_stores_every_call_before_the_client_has_the_answer(memory_store, stub, attempt, api) -> None:
    with LLMProxy(memory_store, f"http://127.0.0.1:{stub.port}/v1", record_mode="sync") as proxy:
        client = client_for(proxy, attempt)
        if api == "chat":
            for _ in client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
                pass
        else:
            for _ in client.responses.create(model="m", input="hi", stream=True):
                pass
        # no flush: in sync mode the span is committed before the stream's last event
        spans = memory_store.query_spans(
            attempt.rollout.rollout_id, attempt.attempt.attempt_id, name=semconv.SPAN_LLM_CALL
        )
        assert len(spans) == 1
        assert proxy.metrics.recorded == 1 and proxy.metrics.store_batches == 1
        proxy.flush(attempt.rollout.rollout_id, attempt.attempt.attempt_id, timeout=0)  # nothing pending

"""Bad input gets OpenAI-style errors; an unreachable upstream loses nothing already stored."""

from __future__ import annotations

import socket

import httpx
import openai
import pytest

from agentgrad import semconv
from agentgrad.proxy import LLMProxy
from agentgrad.testing.stub import StubUpstream

MESSAGES = [{"role": "user", "content": "hi"}]


def post(proxy: LLMProxy, path: str, **kwargs) -> httpx.Response:
    """POST with a JSON content type (bodies of any other type are refused with 415)."""
    return httpx.post(proxy.base_url + path, timeout=30, headers={"Content-Type": "application/json"}, **kwargs)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b'{"model": "m"}', "messages"),
        (b'{"model": "m", "messages": []}', "messages"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "stream"),
    ],
)
def test_malformed_chat_requests_get_400_with_openai_error(proxy, body, param) -> None:
    response = post(proxy, "/chat/completions", content=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"] and error["param"] == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "input"),
        ({"model": "m", "input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"model": "m", "input": [{"type": "mystery"}]}, "input[0].type"),
    ],
)
def test_unsupported_responses_requests_name_the_field(proxy, body, param) -> None:
    response = post(proxy, "/responses", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_openai_sdk_raises_bad_request(proxy) -> None:
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        openai.OpenAI(base_url=proxy.base_url, api_key="k").responses.create(
            model="m", input="x", previous_response_id="r"
        )


def test_oversized_body_is_refused_with_413(memory_store, stub) -> None:
    with LLMProxy(memory_store, f"http://127.0.0.1:{stub.port}/v1", max_body_bytes=1000) as proxy:
        big = {"model": "m", "messages": [{"role": "user", "content": "x" * 2000}]}
        response = post(proxy, "/chat/completions", json=big)
        assert response.status_code == 413 and "limit" in response.json()["error"]["message"]
        chunked = post(proxy, "/chat/completions", content=iter([b'{"messages": "', b"y" * 2000, b'"}']))
        assert chunked.status_code == 413
    assert not stub.requests


def test_unknown_route_is_404_json_but_chat_never_is(proxy) -> None:
    response = httpx.get(proxy.url + "/v1/nothing")
    assert response.status_code == 404 and "error" in response.json()
    wrong_method = httpx.get(proxy.base_url + "/chat/completions")  # the fast path leaves it to Starlette
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()
    assert post(proxy, "/chat/completions", json={"model": "no-such-model", "messages": MESSAGES}).status_code == 200


def test_upstream_error_passes_through_with_status_and_body(memory_store, attempt) -> None:
    with StubUpstream(["x"], fail_first=5) as stub, LLMProxy(memory_store, f"http://127.0.0.1:{stub.port}/v1") as proxy:
        client = openai.OpenAI(
            base_url=proxy.endpoint_for(attempt.rollout.rollout_id, attempt.attempt.attempt_id),
            api_key="k",
            max_retries=0,
        )
        with pytest.raises(openai.InternalServerError, match="scripted failure"):
            client.chat.completions.create(model="m", messages=MESSAGES)
        assert proxy.metrics.upstream_errors == 1
    assert not memory_store.query_spans(attempt.rollout.rollout_id, name=semconv.SPAN_LLM_CALL)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_upstream_gives_502_and_keeps_stored_data(memory_store, stub, attempt) -> None:
    endpoint_args = (attempt.rollout.rollout_id, attempt.attempt.attempt_id)
    with LLMProxy(memory_store, f"http://127.0.0.1:{stub.port}/v1") as good:
        openai.OpenAI(base_url=good.endpoint_for(*endpoint_args), api_key="k").chat.completions.create(
            model="m", messages=MESSAGES
        )
    with LLMProxy(memory_store, f"http://127.0.0.1:{_free_port()}/v1") as dead:
        for stream in (False, True):
            response = httpx.post(
                dead.endpoint_for(*endpoint_args) + "/chat/completions",
                json={"model": "m", "messages": MESSAGES, "stream": stream},
            )
            assert response.status_code == 502
            assert "unreachable" in response.json()["error"]["message"]
        assert dead.metrics.upstream_unreachable == 2
    spans = memory_store.query_spans(attempt.rollout.rollout_id, name=semconv.SPAN_LLM_CALL)
    assert len(spans) == 1 and spans[0].attributes[semconv.LLM_COMPLETION_TOKEN_IDS]
    assert memory_store.get_rollout(attempt.rollout.rollout_id).llm_calls == 1


def test_an_upstream_that_takes_the_call_and_never_answers_is_a_504_that_says_so(memory_store, attempt) -> None:
    """Not "unreachable": the upstream is there, its answer is late (a generation with no
    max_tokens) — the error names the wait and the likely cause, and no span is recorded."""
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        upstream = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
        with LLMProxy(memory_store, upstream, upstream_timeout=0.3) as proxy:
            for stream in (False, True):
                response = httpx.post(
                    proxy.endpoint_for(attempt.rollout.rollout_id, attempt.attempt.attempt_id) + "/chat/completions",
                    json={"model": "m", "messages": MESSAGES, "stream": stream},
                    timeout=30,
                )
                assert response.status_code == 504
                error = response.json()["error"]
                assert error["code"] == "upstream_timeout"
                assert error["message"] == f"upstream {upstream} did not answer within 0.3 s (a long generation? " + (
                    "give the request a max_tokens)"
                )
            assert proxy.metrics.upstream_timeouts == 2 and proxy.metrics.upstream_unreachable == 0
    assert memory_store.get_rollout(attempt.rollout.rollout_id).llm_calls == 0

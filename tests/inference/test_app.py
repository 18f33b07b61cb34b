"""The OpenAI-compatible server, exercised over real HTTP (and the real ``openai`` client)."""

from __future__ import annotations

import json
from concurrent.futures import Future
from pathlib import Path

import httpx
import pytest

from agentgrad.demo import calc
from agentgrad.inference import Engine, GenerationResult, ModelServer, TokenEvent

MESSAGES = [{"role": "system", "content": calc.SYSTEM_PROMPT}, {"role": "user", "content": "What is 2 + 3?"}]


def test_openai_client_chat_with_token_ids_and_logprobs(base_url: str, engine: Engine) -> None:
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="unused")
    out = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=MESSAGES,
        tools=[calc.CALCULATOR_TOOL],
        max_tokens=12,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"return_token_ids": True},
    )
    assert out.model == "gpt-4o-mini"  # unknown names are served by the loaded model and echoed
    extra, choice = out.model_extra, out.choices[0]
    assert extra["model_version"] == engine.model_version
    rendered = engine.tokenizer.apply_chat_template(
        MESSAGES, tools=[calc.CALCULATOR_TOOL], add_generation_prompt=True, tokenize=False
    )
    expected_prompt = engine.tokenizer.encode(rendered, add_special_tokens=False)
    assert extra["prompt_token_ids"] == expected_prompt
    token_ids = choice.model_extra["token_ids"]
    assert len(token_ids) == len(choice.logprobs.content) == out.usage.completion_tokens
    assert engine.tokenizer.decode(token_ids, skip_special_tokens=True) == (choice.message.content or "")
    for entry in choice.logprobs.content:  # greedy: the chosen token is the most likely one
        assert entry.logprob == pytest.approx(max(t.logprob for t in entry.top_logprobs))
        assert len(entry.top_logprobs) == 3
    assert out.usage.prompt_tokens == len(expected_prompt)


def test_logprobs_without_token_ids_and_n(base_url: str) -> None:
    body = httpx.post(
        f"{base_url}/chat/completions",
        json={"messages": MESSAGES, "max_tokens": 5, "logprobs": True, "n": 3, "seed": 1},
        timeout=60,
    ).json()
    assert len(body["choices"]) == 3 and "prompt_token_ids" not in body
    assert all(len(c["logprobs"]["content"]) >= 1 and "token_ids" not in c for c in body["choices"])


def test_streaming_carries_token_ids_and_matches_non_streaming(base_url: str) -> None:
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="unused")
    request = dict(
        model="tiny",
        messages=MESSAGES,
        max_tokens=10,
        temperature=0,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    full = client.chat.completions.create(**request)
    chunks = list(client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].model_extra["prompt_token_ids"] == full.model_extra["prompt_token_ids"]
    ids = [t for c in chunks for ch in c.choices for t in (ch.model_extra or {}).get("token_ids", [])]
    assert ids == full.choices[0].model_extra["token_ids"]
    text = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 10
    assert [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason] == ["length"]


def test_text_completions_with_token_id_prompt(base_url: str, engine: Engine) -> None:
    prompt = engine.tokenizer.encode("What is", add_special_tokens=False)
    body = httpx.post(
        f"{base_url}/completions",
        json={
            "prompt": prompt,
            "max_tokens": 6,
            "temperature": 0,
            "logprobs": 2,
            "return_token_ids": True,
            "ignore_eos": True,
        },
        timeout=60,
    ).json()
    choice = body["choices"][0]
    assert choice["prompt_token_ids"] == prompt and len(choice["token_ids"]) == 6
    assert choice["logprobs"]["token_logprobs"][0] == pytest.approx(max(choice["logprobs"]["top_logprobs"][0].values()))
    text_body = httpx.post(
        f"{base_url}/completions",
        json={"prompt": "What is", "max_tokens": 6, "temperature": 0, "ignore_eos": True},
        timeout=60,
    ).json()
    assert text_body["choices"][0]["text"] == choice["text"]


def test_models_endpoint(base_url: str, engine: Engine) -> None:
    body = httpx.get(f"{base_url}/models").json()
    assert body["data"][0]["id"] == "tiny" and body["data"][0]["model_version"] == engine.model_version


@pytest.mark.parametrize(
    "payload,param",
    [
        ({"messages": MESSAGES, "temperature": 5}, "temperature"),
        ({"messages": MESSAGES, "top_p": 0}, "top_p"),
        ({"messages": MESSAGES, "max_tokens": 0}, "max_tokens"),
        ({"messages": MESSAGES, "max_tokens": 10**6}, "max_tokens"),
        ({"messages": MESSAGES, "n": 0}, "n"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
        ({"messages": [{"role": "user", "content": "hi " * 3000}]}, "messages"),
        ({"messages": MESSAGES, "tool_choice": "sometimes"}, "tool_choice"),
        ({"messages": MESSAGES, "frequency_penalty": 0.5}, "frequency_penalty"),
        ({}, "messages"),
    ],
)
def test_bad_chat_requests_get_openai_400(base_url: str, payload: dict, param: str) -> None:
    response = httpx.post(f"{base_url}/chat/completions", json=payload, timeout=60)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and param in error["message"]


def test_malformed_json_and_bad_completion_prompt(base_url: str) -> None:
    response = httpx.post(
        f"{base_url}/chat/completions",
        content=b'{"messages": [',
        timeout=30,
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "body"
    response = httpx.post(f"{base_url}/completions", json={"prompt": [10**9]}, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"


class ScriptedEngine(Engine):
    """A real engine whose completions are scripted texts, to exercise response shaping."""

    script: list[str] = []

    def submit(self, prompt_ids, params=None, *, lora=None, on_token=None):  # type: ignore[override]
        text = self.script.pop(0)
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        for i, token in enumerate(ids):
            if on_token is not None:
                on_token(TokenEvent(token, -0.5, None, i == len(ids) - 1))
        future: Future = Future()
        future.set_result(
            GenerationResult(list(prompt_ids), ids, [-0.5] * len(ids), None, text, "stop", self.model_version)
        )
        return future


@pytest.fixture(scope="module")
def scripted(tiny_model_dir: Path):
    engine = ScriptedEngine(tiny_model_dir)
    server = ModelServer(engine)
    url = server.start()
    yield engine, url
    server.stop()
    engine.close()


CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call>'


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_become_openai_tool_calls(scripted, stream: bool) -> None:
    import openai

    engine, url = scripted
    engine.script[:] = ["Let me compute.\n" + CALL]
    client = openai.OpenAI(base_url=url, api_key="unused")
    kwargs = dict(model="m", messages=MESSAGES, tools=[calc.CALCULATOR_TOOL])
    if not stream:
        message = client.chat.completions.create(**kwargs).choices[0]
        assert message.finish_reason == "tool_calls"
        calls, content = message.message.tool_calls, message.message.content
        name, args = calls[0].function.name, calls[0].function.arguments
    else:
        chunks = list(client.chat.completions.create(**kwargs, stream=True))
        content = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
        deltas = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
        name, args = deltas[0].function.name, deltas[0].function.arguments
        assert [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason] == ["tool_calls"]
    assert content.strip() == "Let me compute." and "<tool_call>" not in content
    assert name == "calculator" and json.loads(args) == {"expression": "2 + 3"}


@pytest.mark.parametrize(("script", "content"), [("\n" + CALL, ""), ("  Sure.\n\n", "  Sure.\n\n")])
def test_streamed_content_matches_the_unstreamed_message(scripted, script: str, content: str) -> None:
    """Whitespace before a tool call is not content (the message strips it), so a stream holds it
    back until the next visible text settles it; a plain answer keeps its whitespace."""
    engine, url = scripted
    payload = {"messages": MESSAGES, "tools": [calc.CALCULATOR_TOOL], "stream": True}
    engine.script[:] = [script]
    response = httpx.post(f"{url}/chat/completions", json=payload, timeout=30)
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    assert "".join(c["delta"].get("content") or "" for e in events for c in e["choices"]) == content


@pytest.mark.parametrize("stream", [False, True])
def test_malformed_tool_call_json_is_kept_as_text(scripted, stream: bool) -> None:
    engine, url = scripted
    bad = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}\n</tool_call>'
    engine.script[:] = [bad]
    payload = {"messages": MESSAGES, "tools": [calc.CALCULATOR_TOOL], "stream": stream}
    response = httpx.post(f"{url}/chat/completions", json=payload, timeout=30)
    if stream:
        events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
        text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
        assert not any(c["delta"].get("tool_calls") for e in events for c in e["choices"])
    else:
        message = response.json()["choices"][0]["message"]
        text = message["content"]
        assert "tool_calls" not in message and response.json()["choices"][0]["finish_reason"] == "stop"
    assert text == bad


def test_tool_choice_none_returns_text(scripted) -> None:
    engine, url = scripted
    engine.script[:] = [CALL]
    body = httpx.post(
        f"{url}/chat/completions",
        json={"messages": MESSAGES, "tools": [calc.CALCULATOR_TOOL], "tool_choice": "none"},
        timeout=30,
    ).json()
    assert body["choices"][0]["message"]["content"] == CALL


def test_assistant_tool_call_history_renders_back(scripted) -> None:
    """An agent echoes the tool call back with string arguments: the prompt must render it."""
    engine, url = scripted
    engine.script[:] = ["The answer is 5."]
    history = MESSAGES + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": json.dumps({"expression": "2 + 3"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]
    body = httpx.post(
        f"{url}/chat/completions",
        json={"messages": history, "tools": [calc.CALCULATOR_TOOL], "return_token_ids": True},
        timeout=30,
    ).json()
    prompt_text = engine.tokenizer.decode(body["prompt_token_ids"])
    assert CALL + "<|im_end|>" in prompt_text and "<tool_response>\n5\n</tool_response>" in prompt_text


def test_lora_and_weight_endpoints(scripted, tmp_path: Path) -> None:
    engine, url = scripted
    response = httpx.post(f"{url}/load_lora_adapter", json={"lora_name": "x", "lora_path": str(tmp_path / "nope")})
    assert response.status_code == 400 and response.json()["error"]["param"] == "lora_path"
    response = httpx.post(f"{url}/unload_lora_adapter", json={"lora_name": "x"})
    assert response.status_code == 404
    response = httpx.post(
        f"{url}/update_weights", json={"path": str(engine.model_dir), "version": "step-7"}, timeout=60
    )
    assert response.json() == {"status": "ok", "model_version": "step-7"}
    assert httpx.get(f"{url}/models").json()["data"][0]["model_version"] == "step-7"


def test_streaming_errors_come_before_the_stream(base_url: str) -> None:
    response = httpx.post(
        f"{base_url}/chat/completions", json={"messages": MESSAGES, "stream": True, "max_tokens": 10**6}, timeout=30
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "max_tokens"


def test_streaming_text_completion(base_url: str, engine: Engine) -> None:
    prompt = engine.tokenizer.encode("What is", add_special_tokens=False)
    response = httpx.post(
        f"{base_url}/completions",
        json={
            "prompt": prompt,
            "max_tokens": 5,
            "temperature": 0,
            "stream": True,
            "return_token_ids": True,
            "ignore_eos": True,
        },
        timeout=60,
    )
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    assert events[0]["choices"][0]["prompt_token_ids"] == prompt
    assert sum(len(e["choices"][0]["token_ids"]) for e in events) == 5
    assert events[-1]["choices"][0]["finish_reason"] == "length"

"""The model server against hostile input and callers it should not serve (issue 22, findings 5-7):
a 4xx with an OpenAI-style body for every bad request, a body limit, prompts rendered and tokenized
off the event loop (``/health`` answers meanwhile), a bearer token, JSON-only bodies and allowed
``Host`` names. A refused weight update swaps nothing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from agentgrad.http.guard import ALLOWED_HOSTS_ENV
from agentgrad.inference import Engine, ModelServer

pytestmark = pytest.mark.tiny_model

MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]
TOKEN = "model-s3cret"


def _refused(response: httpx.Response, status: int = 400) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    return response.json()["error"]


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"messages": MESSAGES, "seed": 2**70}, "seed"),
        ({"messages": MESSAGES, "seed": -(2**70)}, "seed"),
        ({"messages": MESSAGES, "stream": "yes"}, "stream"),
        ({"messages": MESSAGES, "stream": 1}, "stream"),
        ({"messages": MESSAGES, "logprobs": "true"}, "logprobs"),
        ({"messages": MESSAGES, "return_token_ids": "false"}, "return_token_ids"),
        ({"messages": MESSAGES, "max_tokens": "5"}, "max_tokens"),
    ],
)
def test_fields_are_typed_strictly_and_bounded(base_url: str, payload: dict, param: str) -> None:
    assert _refused(httpx.post(f"{base_url}/chat/completions", json=payload, timeout=60))["param"] == param


def test_a_vanishing_temperature_is_greedy_not_a_failed_batch(base_url: str) -> None:
    def ask(temperature: float) -> dict:
        body = {"messages": MESSAGES, "temperature": temperature, "max_tokens": 4, "return_token_ids": True}
        response = httpx.post(f"{base_url}/chat/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text  # was 503: logits / 1e-300 are infinite
        return response.json()

    assert ask(1e-300)["choices"][0]["token_ids"] == ask(0)["choices"][0]["token_ids"]


def test_the_largest_seed_still_samples(base_url: str) -> None:
    body = {"messages": MESSAGES, "seed": 2**64 - 1 - 16, "n": 2, "max_tokens": 2}
    assert httpx.post(f"{base_url}/chat/completions", json=body, timeout=60).status_code == 200


@pytest.mark.parametrize(
    "raw",
    [
        b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
        b'{"prompt": "x\\udfff"}',
        b'{"messages": [{"role": "user", "content": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]}",
        b'{"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": '
        + b'{"a":' * 500
        + b"1"
        + b"}" * 500
        + b"}}]}]}",
    ],
)
def test_lone_surrogates_and_deep_nesting_get_400(base_url: str, raw: bytes) -> None:
    path = "/completions" if b"prompt" in raw else "/chat/completions"
    error = _refused(httpx.post(base_url + path, content=raw, headers={"Content-Type": "application/json"}, timeout=60))
    assert "surrogate" in error["message"] or "nested too deeply" in error["message"]


def test_prompts_beyond_the_context_are_refused_on_a_prefix(base_url: str, engine: Engine, monkeypatch) -> None:
    seen: list[int] = []
    encode = engine.tokenizer.encode

    def recording(text, *args, **kwargs):
        seen.append(len(text))
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(engine.tokenizer, "encode", recording)
    huge = "hello there " * 900_000  # ~10 MB: tokenized whole, it took 42.8 s on the event loop
    error = _refused(
        httpx.post(f"{base_url}/chat/completions", timeout=120, json={"messages": [{"role": "user", "content": huge}]})
    )
    assert error["param"] == "messages" and "maximum context length" in error["message"]
    assert seen and max(seen) <= engine.max_model_len * 8  # only a prefix was tokenized
    ids = _refused(httpx.post(f"{base_url}/completions", json={"prompt": [1] * 2_000_000}, timeout=120))
    assert ids["param"] == "prompt" and "maximum context length" in ids["message"]


def test_health_answers_while_a_prompt_is_tokenized(base_url: str, engine: Engine, monkeypatch) -> None:
    entered, release = threading.Event(), threading.Event()
    encode = engine.tokenizer.encode

    def slow(text, *args, **kwargs):
        entered.set()
        release.wait(60)
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(engine.tokenizer, "encode", slow)
    result: dict[str, int] = {}

    def call() -> None:
        body = {"messages": MESSAGES, "max_tokens": 1}
        result["status"] = httpx.post(f"{base_url}/chat/completions", json=body, timeout=120).status_code

    caller = threading.Thread(target=call)
    caller.start()
    try:
        assert entered.wait(60)
        health = httpx.get(base_url.removesuffix("/v1") + "/health", timeout=30)
        assert health.status_code == 200  # the loop is free
    finally:
        release.set()
        caller.join(60)
    assert result == {"status": 200}


def test_update_weights_refuses_what_is_not_weights_and_swaps_nothing(
    base_url: str, engine: Engine, tmp_path: Path
) -> None:
    text_file = tmp_path / "notes.txt"
    text_file.write_text("these are not weights")
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "model.safetensors").write_bytes(b"\x00" * 64)
    pickle = tmp_path / "pytorch_model.bin"
    pickle.write_bytes(b"not a pickle")
    before = engine.model_version
    root = base_url.removesuffix("/v1")
    for path in (text_file, fake, pickle, tmp_path / "missing", "\x00"):
        error = _refused(
            httpx.post(f"{root}/v1/update_weights", json={"path": str(path), "version": "evil"}, timeout=60)
        )
        assert error["param"] == "path"
    assert engine.model_version == before and httpx.get(f"{root}/health").json()["model_version"] == before
    lora = _refused(
        httpx.post(f"{root}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(fake)}, timeout=60)
    )
    assert lora["param"] == "lora_path" and "adapter_config.json" in lora["message"]
    assert engine.loras == []


def test_body_limit_declared_and_chunked(engine: Engine) -> None:
    with ModelServer(engine, max_body_bytes=1000) as server:
        big = {"messages": [{"role": "user", "content": "x" * 2000}]}
        error = _refused(httpx.post(f"{server.base_url}/chat/completions", json=big, timeout=30), 413)
        assert "1000 bytes" in error["message"]
        chunked = httpx.post(
            f"{server.base_url}/chat/completions",
            content=iter([b'{"messages": "', b"y" * 2000, b'"}']),
            headers={"Content-Type": "application/json"},
            timeout=30,
        )
        _refused(chunked, 413)


@pytest.fixture
def guarded(engine: Engine, monkeypatch) -> Iterator[ModelServer]:
    monkeypatch.delenv(ALLOWED_HOSTS_ENV, raising=False)
    with ModelServer(engine, token=TOKEN, allowed_hosts=["gpu-box.lan"]) as server:
        yield server


def test_token_guards_every_route_but_health(guarded: ModelServer, engine: Engine, tmp_path: Path) -> None:
    root = guarded.base_url.removesuffix("/v1")
    before = engine.model_version
    for method, path, body in (
        ("POST", "/v1/chat/completions", {"messages": MESSAGES}),
        ("POST", "/v1/completions", {"prompt": "x"}),
        ("GET", "/v1/models", None),
        ("POST", "/v1/update_weights", {"path": str(tmp_path)}),
        ("POST", "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(tmp_path)}),
        ("POST", "/v1/unload_lora_adapter", {"lora_name": "x"}),
    ):
        for headers in ({}, {"Authorization": "Bearer nope"}):
            error = _refused(httpx.request(method, root + path, json=body, headers=headers, timeout=30), 401)
            assert error["type"] == "authentication_error"
    assert engine.model_version == before
    assert httpx.get(f"{root}/health").status_code == 200
    client = openai.OpenAI(base_url=guarded.base_url, api_key=TOKEN, max_retries=0)
    assert client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2).choices


def test_only_json_bodies_and_our_host_names(guarded: ModelServer) -> None:
    url, auth = f"{guarded.base_url}/chat/completions", {"Authorization": f"Bearer {TOKEN}"}
    raw = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}'
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=b"):
        _refused(httpx.post(url, content=raw, headers={**auth, "Content-Type": content_type}, timeout=30), 415)
    _refused(httpx.post(url, content=raw, headers=auth, timeout=30), 415)  # no type at all
    rebound = _refused(
        httpx.post(
            url,
            content=raw,
            headers={**auth, "Content-Type": "application/json", "Host": "attacker.example"},
            timeout=30,
        ),
        421,
    )
    assert "--allowed-host" in rebound["message"]
    for host in ("gpu-box.lan:8000", "localhost"):
        assert (
            httpx.post(
                url, content=raw, headers={**auth, "Content-Type": "application/json", "Host": host}, timeout=30
            ).status_code
            == 200
        )


class _Weights:
    """What ``ModelServerPublisher`` reads of a trainer: its step and the engine's weights."""

    def __init__(self, engine: Engine) -> None:
        self.step, self._engine = 7, engine

    def engine_state_dict(self) -> dict:
        return {k: v for k, v in self._engine._base.state_dict().items() if "lora_" not in k}


def test_publishers_send_the_model_token_from_the_environment(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    from agentgrad.http.guard import MODEL_TOKEN_ENV
    from agentgrad.training.publish import ModelServerPublisher, VLLMLoRAPublisher

    engine = Engine(tiny_model_dir, max_batch_size=2)  # its own: a publish changes the served version
    try:
        with ModelServer(engine, token=TOKEN) as server:
            monkeypatch.delenv(MODEL_TOKEN_ENV, raising=False)
            with pytest.raises(RuntimeError, match="401"):
                ModelServerPublisher(server.base_url, tmp_path / "w").publish(_Weights(engine))
            assert engine.model_version == "v0"
            monkeypatch.setenv(MODEL_TOKEN_ENV, TOKEN)
            assert ModelServerPublisher(server.base_url, tmp_path / "w").publish(_Weights(engine)).version == "v7"
            assert engine.model_version == "v7"
            assert VLLMLoRAPublisher(server.base_url, tmp_path / "a").headers == {"Authorization": f"Bearer {TOKEN}"}
    finally:
        engine.close()

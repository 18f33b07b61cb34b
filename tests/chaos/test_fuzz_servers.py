"""Chaos: hostile and generated requests against the capture proxy and the model server — no answer
is a 5xx, every refusal is an OpenAI-style JSON body, and a refused call changes nothing (no span
stored, nothing forwarded upstream, no weights swapped).

The hostile cases are those of issue 22 (finding 5: a lone surrogate, 100,000-level nesting, a
flush timeout of 1e308, ``seed: 2**70``, ``"stream": "yes"``, a weight update from a file that is
not weights; finding 6: a 10 MB prompt); Hypothesis then generates chat, completions and
Responses bodies around the fields the servers read. The proxy runs in front of the stub upstream
(``agentgrad.testing.stub``), the model server on the random tiny model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from agentgrad import semconv  # noqa: E402
from agentgrad.http.guard import ALLOWED_HOSTS_ENV  # noqa: E402
from agentgrad.proxy import LLMProxy  # noqa: E402
from agentgrad.store.memory import MemoryStore  # noqa: E402
from agentgrad.testing.stub import StubUpstream  # noqa: E402

pytestmark = pytest.mark.chaos

JSON_HEADERS = {"Content-Type": "application/json"}
DEEP = b"[" * 100_000 + b"]" * 100_000
#: Refused by both servers (the proxy reads these fields itself).
HOSTILE_CHAT_BODIES = [
    b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
    b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "\\udfff": 1}',
    b'{"model": "m", "messages": [{"role": "user", "content": ' + DEEP + b"}]}",
    b'{"model": "m", "messages": ' + DEEP + b"}",
    DEEP,
    b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
    b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": true, "stream_options": [null]}',
    b"\xff\xfe{}",
    b"",
]
#: Refused by the model server (the proxy passes sampling fields on for the engine to judge).
HOSTILE_SAMPLING_BODIES = [
    b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "seed": ' + str(2**70).encode() + b"}",
    b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": NaN, "max_tokens": 1}',
    b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1e400}',
    b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "top_k": ' + str(2**70).encode() + b"}",
]

# ---- generated bodies ---------------------------------------------------------------------------

_text = st.lists(st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr)), max_size=12).map("".join)
_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**80), 2**80), st.floats(), _text)
_json = st.recursive(
    _scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_text, inner, max_size=4)),
    max_leaves=12,
)


def _mostly(valid: st.SearchStrategy) -> st.SearchStrategy:
    """``valid`` three times in four, any JSON value otherwise: most bodies get past validation."""
    return st.one_of(valid, valid, valid, _json)


_role = _mostly(st.sampled_from(["system", "developer", "user", "assistant", "tool", "wizard"]))
_content = _mostly(
    st.one_of(
        _text,
        st.lists(
            st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "x"]), "text": _text}), max_size=2
        ),
    )
)
_message = _mostly(
    st.fixed_dictionaries(
        {"role": _role, "content": _content}, optional={"tool_calls": _json, "tool_call_id": _json, "name": _json}
    )
)
_tool = _mostly(
    st.fixed_dictionaries(
        {"type": st.just("function"), "function": st.fixed_dictionaries({"name": _text, "parameters": _json})}
    )
)
_common = {
    "model": _mostly(st.sampled_from(["tiny", "m", "gpt-4o-mini"])),
    "temperature": _mostly(st.floats(-1, 3)),
    "top_p": _mostly(st.floats(-1, 2)),
    "top_k": _mostly(st.integers(-3, 2**70)),
    "n": _mostly(st.integers(-1, 3)),
    "seed": _mostly(st.integers(-(2**70), 2**70)),
    "stream": _mostly(st.booleans()),
    "stream_options": _mostly(st.fixed_dictionaries({}, optional={"include_usage": _mostly(st.booleans())})),
    "stop": _mostly(st.one_of(_text, st.lists(_text, max_size=3))),
    "stop_token_ids": _mostly(st.lists(st.integers(-(2**70), 2**70), max_size=3)),
    "return_token_ids": _mostly(st.booleans()),
    "ignore_eos": _mostly(st.booleans()),
    "presence_penalty": _json,
    "user": _json,
}
#: max_tokens is always there and mostly small: a generated body must not sample 1,000 tokens.
_max_tokens = st.one_of(st.integers(1, 3), st.integers(1, 3), st.integers(-(2**70), 2**70), _json)
CHAT_BODIES = st.fixed_dictionaries(
    {"messages": _mostly(st.lists(_message, min_size=1, max_size=3)), "max_tokens": _max_tokens},
    optional={
        **_common,
        "tools": _mostly(st.lists(_tool, max_size=2)),
        "tool_choice": _json,
        "logprobs": _mostly(st.booleans()),
        "top_logprobs": _mostly(st.integers(-1, 30)),
        "max_completion_tokens": _json,
        "response_format": _json,
    },
)
COMPLETION_BODIES = st.fixed_dictionaries(
    {
        "prompt": _mostly(st.one_of(_text, st.lists(st.integers(-5, 2**40), max_size=5), st.lists(_text, max_size=3))),
        "max_tokens": _max_tokens,
    },
    optional={**_common, "logprobs": _mostly(st.integers(-1, 30)), "echo": _json, "suffix": _json},
)
RESPONSES_BODIES = st.fixed_dictionaries(
    {
        "input": _mostly(
            st.one_of(
                _text,
                st.lists(
                    st.one_of(
                        _message,
                        st.fixed_dictionaries(
                            {
                                "type": st.sampled_from(
                                    ["message", "function_call", "function_call_output", "reasoning", "x"]
                                ),
                                "role": _role,
                                "content": _content,
                                "call_id": _json,
                                "output": _json,
                                "arguments": _json,
                                "name": _json,
                            }
                        ),
                    ),
                    max_size=3,
                ),
            )
        )
    },
    optional={
        "model": _common["model"],
        "instructions": _json,
        "tools": _json,
        "tool_choice": _json,
        "max_output_tokens": _max_tokens,
        "stream": _common["stream"],
        "temperature": _common["temperature"],
        "previous_response_id": _json,
        "text": _json,
        "reasoning": _json,
    },
)
#: Well-formed bodies with every optional sampling field in range: they get past validation, so
#: the pass reaches the engine, streams and tool parsing too.
_clean_text = st.text(st.characters(codec="utf-8"), min_size=1, max_size=40)
_clean = {
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "top_k": st.integers(0, 50),
    "n": st.integers(1, 3),
    "seed": st.integers(0, 2**63),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "stop": st.lists(_clean_text, max_size=2),
    "return_token_ids": st.booleans(),
    "ignore_eos": st.booleans(),
}
CLEAN_CHAT_BODIES = st.fixed_dictionaries(
    {
        "messages": st.lists(
            st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": _clean_text}),
            min_size=1,
            max_size=3,
        ),
        "max_tokens": st.integers(1, 3),
    },
    optional={**_clean, "logprobs": st.booleans(), "top_logprobs": st.integers(0, 5), "tool_choice": st.just("auto")},
)
CLEAN_COMPLETION_BODIES = st.fixed_dictionaries(
    {
        "prompt": st.one_of(_clean_text, st.lists(st.integers(1, 100), min_size=1, max_size=5)),
        "max_tokens": st.integers(1, 3),
    },
    optional={**_clean, "logprobs": st.integers(0, 5)},
)
ROUTES = st.sampled_from(
    [
        ("/chat/completions", CHAT_BODIES | CLEAN_CHAT_BODIES),
        ("/completions", COMPLETION_BODIES | CLEAN_COMPLETION_BODIES),
        ("/responses", RESPONSES_BODIES),
    ]
)


def _encoded(body: Any) -> bytes:
    return json.dumps(body).encode()  # ensure_ascii: lone surrogates travel as \\udXXX escapes


def _assert_json_refusal(response: httpx.Response) -> None:
    event(f"HTTP {response.status_code}")  # pytest --hypothesis-show-statistics: how many got through
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["message"] and error["type"], response.text


# ---- the proxy ----------------------------------------------------------------------------------


class _Proxied:
    def __init__(self, store: MemoryStore, stub: StubUpstream, proxy: LLMProxy) -> None:
        self.store, self.stub, self.proxy = store, stub, proxy
        store.enqueue_rollout({"q": "fuzz"})
        claimed = store.dequeue_rollout("fuzzer")
        assert claimed is not None
        self.rollout_id, self.attempt_id = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        self.url = proxy.endpoint_for(self.rollout_id, self.attempt_id)

    def spans(self) -> int:
        self.proxy.flush(self.rollout_id, self.attempt_id, timeout=30)
        return len(self.store.query_spans(self.rollout_id, name=semconv.SPAN_LLM_CALL))


@pytest.fixture(scope="module")
def proxied() -> Iterator[_Proxied]:
    store = MemoryStore(watchdog_interval=None)
    with StubUpstream(["The answer is 5."]) as stub, LLMProxy(store, f"http://127.0.0.1:{stub.port}/v1") as proxy:
        yield _Proxied(store, stub, proxy)
    store.close()


@pytest.mark.parametrize("raw", HOSTILE_CHAT_BODIES, ids=range(len(HOSTILE_CHAT_BODIES)))
def test_proxy_refuses_hostile_bodies_with_openai_400(proxied: _Proxied, raw: bytes) -> None:
    forwarded, stored = len(proxied.stub.requests), proxied.spans()
    response = httpx.post(proxied.url + "/chat/completions", content=raw, headers=JSON_HEADERS, timeout=60)
    assert response.status_code == 400, response.text[:300]
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert len(proxied.stub.requests) == forwarded and proxied.spans() == stored


@pytest.mark.parametrize("timeout", ["1e308", "Infinity", "NaN", "-1", str(2**70), "true", '"5"', "3601"])
def test_proxy_flush_refuses_unusable_timeouts(proxied: _Proxied, timeout: str) -> None:
    raw = f'{{"rollout_id": "{proxied.rollout_id}", "attempt_id": "{proxied.attempt_id}", "timeout": {timeout}}}'
    response = httpx.post(proxied.proxy.url + "/agentgrad/flush", content=raw.encode(), headers=JSON_HEADERS)
    error = response.json()["error"]
    assert response.status_code == 400
    # NaN and Infinity are no JSON numbers: the body parser names them; the others are bad timeouts
    assert error["param"] == "timeout" or (timeout in ("Infinity", "NaN") and timeout in error["message"])


def test_proxy_flush_refuses_hostile_bodies(proxied: _Proxied) -> None:
    for raw in (b'{"rollout_id": "\\ud800", "attempt_id": "a"}', b'{"rollout_id": ' + DEEP + b"}", DEEP, b"null"):
        response = httpx.post(proxied.proxy.url + "/agentgrad/flush", content=raw, headers=JSON_HEADERS)
        assert response.status_code == 400 and "flush needs" in response.json()["error"]["message"]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_proxy_never_answers_5xx_and_refusals_store_nothing(proxied: _Proxied, data: st.DataObject) -> None:
    path, bodies = data.draw(ROUTES, label="route")
    body = data.draw(bodies, label="body")
    forwarded, stored = len(proxied.stub.requests), proxied.spans()
    response = httpx.post(proxied.url + path, content=_encoded(body), headers=JSON_HEADERS, timeout=60)
    _assert_json_refusal(response)
    if response.status_code >= 400:
        assert len(proxied.stub.requests) == forwarded, "a refused call reached the upstream"
        assert proxied.spans() == stored, "a refused call stored a span"


# ---- the model server ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_server(tiny_model_dir) -> Iterator[Any]:
    from agentgrad.inference import ModelServer

    with ModelServer(tiny_model_dir, served_model_name="tiny", max_batch_size=8) as server:
        yield server


@pytest.mark.tiny_model
@pytest.mark.parametrize(
    "raw",
    HOSTILE_CHAT_BODIES + HOSTILE_SAMPLING_BODIES,
    ids=range(len(HOSTILE_CHAT_BODIES) + len(HOSTILE_SAMPLING_BODIES)),
)
def test_model_server_refuses_hostile_bodies_with_openai_400(model_server: Any, raw: bytes) -> None:
    response = httpx.post(model_server.base_url + "/chat/completions", content=raw, headers=JSON_HEADERS, timeout=60)
    assert response.status_code == 400, response.text[:300]
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.tiny_model
def test_model_server_refuses_a_10_mb_prompt_early(model_server: Any) -> None:
    body = {"messages": [{"role": "user", "content": "x " * 5_000_000}], "max_tokens": 1}
    response = httpx.post(model_server.base_url + "/chat/completions", json=body, timeout=120)
    assert response.status_code == 400 and "maximum context length" in response.json()["error"]["message"]


@pytest.mark.tiny_model
def test_model_server_swaps_nothing_on_refused_weight_calls(model_server: Any, tmp_path) -> None:
    root, version = model_server.base_url.removesuffix("/v1"), model_server.engine.model_version
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\xff" * 100)
    for path, body in (
        ("/v1/update_weights", {"path": str(junk)}),
        ("/v1/update_weights", {"path": str(tmp_path)}),
        ("/v1/update_weights", {"path": "\ud800"}),
        ("/v1/update_weights", {"path": 3}),
        ("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(tmp_path)}),
        ("/v1/unload_lora_adapter", {"lora_name": "never-loaded"}),
    ):
        response = httpx.post(root + path, content=_encoded(body), headers=JSON_HEADERS, timeout=60)
        assert 400 <= response.status_code < 500, (path, response.text)
        assert response.json()["error"]["message"]
    assert model_server.engine.model_version == version and model_server.engine.loras == []


@pytest.mark.tiny_model
@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_model_server_never_answers_5xx(model_server: Any, data: st.DataObject) -> None:
    path, bodies = data.draw(
        st.sampled_from(
            [
                ("/chat/completions", CHAT_BODIES | CLEAN_CHAT_BODIES),
                ("/completions", COMPLETION_BODIES | CLEAN_COMPLETION_BODIES),
            ]
        ),
        label="route",
    )
    body = data.draw(bodies, label="body")
    version = model_server.engine.model_version
    response = httpx.post(model_server.base_url + path, content=_encoded(body), headers=JSON_HEADERS, timeout=120)
    _assert_json_refusal(response)
    if response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream"):
        assert "server_error" not in response.text, response.text[-500:]
    assert model_server.engine.model_version == version


@pytest.mark.tiny_model
def test_weight_routes_never_answer_5xx_for_generated_bodies(model_server: Any) -> None:
    version = model_server.engine.model_version

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        path=st.sampled_from(["/v1/update_weights", "/v1/load_lora_adapter", "/v1/unload_lora_adapter"]),
        body=st.fixed_dictionaries(
            {}, optional={"path": _json, "version": _json, "lora_name": _json, "lora_path": _json}
        ),
    )
    def run(path: str, body: dict[str, Any]) -> None:
        response = httpx.post(
            model_server.base_url.removesuffix("/v1") + path, content=_encoded(body), headers=JSON_HEADERS, timeout=60
        )
        _assert_json_refusal(response)

    run()
    assert model_server.engine.model_version == version and model_server.engine.loras == []


def test_servers_started_by_the_package_check_the_host(proxied: _Proxied, monkeypatch) -> None:
    monkeypatch.delenv(ALLOWED_HOSTS_ENV, raising=False)
    response = httpx.post(
        proxied.url + "/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}]},
        headers={"Host": "rebound.attacker.example"},
    )
    assert response.status_code == 421 and response.json()["error"]["code"] == "host_not_allowed"

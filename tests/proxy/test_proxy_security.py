"""The proxy's gate (issue 22, finding 7): a bearer token, JSON-only bodies, allowed ``Host`` names;
and the clients inside agentgrad that call it (a runner's flush, the agents' LLM resource) send the
token. A refused call reaches neither the upstream nor the store."""

from __future__ import annotations

import logging

import httpx
import openai
import pytest

from agentgrad import semconv
from agentgrad.http.guard import ALLOWED_HOSTS_ENV, MODEL_TOKEN_ENV, PROXY_TOKEN_ENV
from agentgrad.proxy import LLMProxy, ProxyResourcesHook
from agentgrad.runner import Runner
from agentgrad.types import LLM, Resources

TOKEN = "proxy-s3cret"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def guarded(memory_store, stub, monkeypatch):
    monkeypatch.delenv(ALLOWED_HOSTS_ENV, raising=False)
    with LLMProxy(memory_store, f"http://127.0.0.1:{stub.port}/v1", token=TOKEN) as proxy:
        yield proxy


def _spans(store, claimed) -> list:
    return store.query_spans(claimed.rollout.rollout_id, name=semconv.SPAN_LLM_CALL)


def test_token_is_required_on_every_route_but_health(guarded, stub, memory_store, attempt) -> None:
    url = guarded.endpoint_for(attempt.rollout.rollout_id, attempt.attempt.attempt_id)
    for path, kwargs in (
        ("/chat/completions", {"json": CHAT}),
        ("/completions", {"json": {"prompt": "x"}}),
        ("/responses", {"json": {"model": "m", "input": "x"}}),
    ):
        for auth in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            response = httpx.post(url + path, headers=auth, timeout=30, **kwargs)
            assert response.status_code == 401, (path, auth)
            error = response.json()["error"]
            assert error["type"] == "authentication_error" and "bearer token" in error["message"]
            assert response.headers["www-authenticate"] == "Bearer"
    assert httpx.get(guarded.base_url + "/models").status_code == 401
    assert httpx.get(guarded.url + "/metrics").status_code == 401
    flush = {"rollout_id": "r", "attempt_id": "a", "timeout": 0}
    assert httpx.post(guarded.url + "/agentgrad/flush", json=flush).status_code == 401
    assert httpx.get(guarded.url + "/health").status_code == 200
    assert not stub.requests
    guarded.flush(attempt.rollout.rollout_id, attempt.attempt.attempt_id, timeout=10)
    assert not _spans(memory_store, attempt)  # no spoofed span was written into the attempt

    client = openai.OpenAI(base_url=url, api_key=TOKEN, max_retries=0)  # the SDK sends it as a bearer token
    assert client.chat.completions.create(**CHAT).choices[0].finish_reason == "tool_calls"  # the stub's script
    assert len(stub.requests) == 1
    assert (
        httpx.post(
            guarded.url + "/agentgrad/flush",
            json=flush,
            headers={"Authorization": f"Bearer {TOKEN}"},
        ).status_code
        == 200
    )


def test_only_json_bodies_are_accepted(proxy, stub, memory_store, attempt) -> None:
    url = proxy.endpoint_for(attempt.rollout.rollout_id, attempt.attempt.attempt_id) + "/chat/completions"
    import json

    raw = json.dumps(CHAT).encode()
    for content_type in (
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        None,
    ):
        headers = {"Content-Type": content_type} if content_type else {}
        response = httpx.post(url, content=raw, headers=headers)
        assert response.status_code == 415, content_type
        assert "application/json" in response.json()["error"]["message"]
    flush = httpx.post(
        proxy.url + "/agentgrad/flush",
        content=b'{"rollout_id":"r","attempt_id":"a"}',
        headers={"Content-Type": "text/plain"},
    )
    assert flush.status_code == 415
    assert not stub.requests
    proxy.flush(attempt.rollout.rollout_id, attempt.attempt.attempt_id, timeout=10)
    assert not _spans(memory_store, attempt)


def test_a_call_whose_span_could_not_be_stored_is_refused_not_answered(proxy, stub, memory_store, attempt) -> None:
    """``temperature: NaN`` parses in Python but is no JSON number, and the store refuses it: the
    call must be refused (400) before it reaches the model, not answered and lost from the trace."""
    url = proxy.endpoint_for(attempt.rollout.rollout_id, attempt.attempt.attempt_id) + "/chat/completions"
    raw = b'{"model": "m", "temperature": NaN, "messages": [{"role": "user", "content": "hi"}]}'
    response = httpx.post(url, content=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and "NaN" in response.json()["error"]["message"]
    assert not stub.requests
    proxy.flush(attempt.rollout.rollout_id, attempt.attempt.attempt_id, timeout=10)
    assert not _spans(memory_store, attempt)


def test_foreign_host_names_are_refused(memory_store, stub, monkeypatch, attempt) -> None:
    monkeypatch.setenv(ALLOWED_HOSTS_ENV, "gpu-box.lan")
    with LLMProxy(memory_store, f"http://127.0.0.1:{stub.port}/v1", allowed_hosts=["proxy.example"]) as proxy:
        url = proxy.endpoint_for(attempt.rollout.rollout_id, attempt.attempt.attempt_id) + "/chat/completions"
        rebound = httpx.post(url, json=CHAT, headers={"Host": "attacker.example"})
        assert rebound.status_code == 421 and "attacker.example" in rebound.json()["error"]["message"]
        assert httpx.get(proxy.url + "/health", headers={"Host": "attacker.example:80"}).status_code == 421
        assert not stub.requests
        for name in ("localhost", "proxy.example", "gpu-box.lan", f"127.0.0.1:{proxy.port}"):
            assert httpx.post(url, json=CHAT, headers={"Host": name}).status_code == 200, name
        proxy.flush(attempt.rollout.rollout_id, attempt.attempt.attempt_id, timeout=10)
    assert len(_spans(memory_store, attempt)) == 4


def test_binding_beyond_loopback_without_a_token_warns(memory_store, stub, caplog, monkeypatch) -> None:
    from agentgrad.http.serve import listening_socket
    from agentgrad.proxy import server

    monkeypatch.setattr(server, "listening_socket", lambda host, port: listening_socket("127.0.0.1", 0))
    with caplog.at_level(logging.WARNING, logger="agentgrad.proxy.server"):  # never listen beyond loopback
        LLMProxy(memory_store, "http://127.0.0.1:9/v1", token=TOKEN, host="0.0.0.0").bind()
        assert not caplog.records
        LLMProxy(memory_store, "http://127.0.0.1:9/v1", host="0.0.0.0").bind()
    assert "listens on 0.0.0.0 without a token" in caplog.text


def test_hook_gives_agents_the_token_as_their_api_key(monkeypatch, memory_store, attempt) -> None:
    resources = Resources(
        resources_id="r", version=1, items={"policy": LLM(endpoint="http://e/v1", model="p", api_key="engine-key")}
    )
    assert ProxyResourcesHook("http://127.0.0.1:9")(resources, attempt).items["policy"].api_key == "engine-key"
    monkeypatch.setenv(PROXY_TOKEN_ENV, TOKEN)
    hook = ProxyResourcesHook("http://127.0.0.1:9")
    assert hook(resources, attempt).items["policy"].api_key == TOKEN
    assert hook(Resources(resources_id="e", version=0), attempt).items["llm"].api_key == TOKEN
    assert TOKEN not in repr(hook)


def token_agent(task: dict, llm: LLM) -> float:
    client = openai.OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "none", max_retries=0)
    client.chat.completions.create(**CHAT)
    return 1.0


async def async_token_agent(task: dict, llm: LLM) -> float:
    async with openai.AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key or "none", max_retries=0) as client:
        await client.chat.completions.create(**CHAT)
    return 1.0


@pytest.mark.parametrize("agent", [token_agent, async_token_agent], ids=["sync", "async"])
def test_a_runner_reaches_a_guarded_proxy_with_the_token_from_its_environment(
    guarded, memory_store, agent, monkeypatch
) -> None:
    """The agent's calls and the runner's flush (from its thread for a sync agent, from its event
    loop for an async one) both carry the token."""
    monkeypatch.setenv(PROXY_TOKEN_ENV, TOKEN)  # what `agentgrad runner` inherits
    memory_store.enqueue_rollout({"q": "x"})
    runner = Runner(agent, memory_store, max_rollouts=1, llm_proxy_url=guarded.url, poll_timeout=0.1)
    stats = runner.run()
    assert stats.succeeded == 1 and not stats.errors  # the agent's call and the runner's flush both got in
    (rollout,) = memory_store.query_rollouts()
    assert len(memory_store.query_spans(rollout.rollout_id, name=semconv.SPAN_LLM_CALL)) == 1


@pytest.mark.tiny_model
def test_proxy_sends_the_model_token_upstream_never_its_own(memory_store, tiny_model_dir, monkeypatch, attempt) -> None:
    from agentgrad.inference import ModelServer

    with ModelServer(tiny_model_dir, token="model-s3cret") as server:
        upstream = server.base_url
        monkeypatch.delenv(MODEL_TOKEN_ENV, raising=False)
        with LLMProxy(memory_store, upstream, token=TOKEN) as proxy:  # no upstream key: the client's is ours
            client = openai.OpenAI(
                base_url=proxy.endpoint_for(attempt.rollout.rollout_id, attempt.attempt.attempt_id),
                api_key=TOKEN,
                max_retries=0,
            )
            with pytest.raises(openai.AuthenticationError):
                client.chat.completions.create(**CHAT, max_tokens=2)
        monkeypatch.setenv(MODEL_TOKEN_ENV, "model-s3cret")
        with LLMProxy(memory_store, upstream, token=TOKEN) as proxy:
            client = openai.OpenAI(
                base_url=proxy.endpoint_for(attempt.rollout.rollout_id, attempt.attempt.attempt_id),
                api_key=TOKEN,
                max_retries=0,
            )
            reply = client.chat.completions.create(**CHAT, max_tokens=2)
            assert reply.model_extra["model_version"] == server.engine.model_version
            proxy.flush(attempt.rollout.rollout_id, attempt.attempt.attempt_id, timeout=10)
    assert len(_spans(memory_store, attempt)) == 1


def test_cli_takes_the_token_and_hosts_from_flags_and_environment(tmp_path, stub) -> None:
    import os
    import signal
    import subprocess
    import sys

    env = {**os.environ, PROXY_TOKEN_ENV: TOKEN, ALLOWED_HOSTS_ENV: "ci.lan"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentgrad",
            "proxy",
            "--store",
            f"sqlite://{tmp_path / 'store.db'}",
            "--upstream",
            f"http://127.0.0.1:{stub.port}/v1",
            "--port",
            "0",
            "--allowed-host",
            "team.lan",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        line = process.stdout.readline()
        assert "LLM proxy on http://127.0.0.1:" in line, line
        base = line.split()[3]
        assert httpx.post(base + "/chat/completions", json=CHAT).status_code == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert (
            httpx.post(base + "/chat/completions", json=CHAT, headers={**auth, "Host": "evil.example"}).status_code
            == 421
        )
        for host in ("team.lan", "ci.lan"):
            assert httpx.post(base + "/chat/completions", json=CHAT, headers={**auth, "Host": host}).status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=20)
    assert process.returncode == 0, output

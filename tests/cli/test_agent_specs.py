"""``agentgrad dev`` / ``runner`` / ``train`` with ``module:Class`` agents and the LLM resource's name:
an Agent Lightning ``LitAgent`` module that says ``import agentlightning as agl`` loads unchanged
(the commands alias it to AgentGrad's compat module), is created with no arguments, and finds its
LLM as ``main_llm`` without ``--llm-resource``; an explicit ``--llm-resource`` still wins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agentgrad_command import agentgrad

from agentgrad.agents import Agent
from agentgrad.cli.run import llm_resource_name

#: An Agent Lightning agent as its users write it; it records which resource name it found.
LIT_AGENT = """
import agentlightning as agl


class LitEcho(agl.LitAgent):
    def __init__(self, trained_agents=None):
        super().__init__(trained_agents=trained_agents)

    def rollout(self, task, resources, rollout):
        llm = resources["main_llm"]
        assert isinstance(llm, agl.LLM) and rollout.attempt.attempt_id
        agl.emit_message(llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id))
        return float(task["x"])


class PlainAgent:
    pass
"""


@pytest.fixture
def agent_dir(tmp_path: Path) -> Path:
    (tmp_path / "lit_agents.py").write_text(LIT_AGENT)
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps({"x": x}) + "\n" for x in (0.25, 0.5, 0.75)))
    return tmp_path


@pytest.fixture
def stub_url() -> str:
    from agentgrad.testing.stub import StubUpstream

    with StubUpstream(["hi"]) as stub:
        yield f"http://127.0.0.1:{stub.port}/v1"


def test_the_resource_name_is_the_flag_else_the_agents_else_llm() -> None:
    class Named(Agent):
        llm_resource = "main_llm"

    assert llm_resource_name(None, Named()) == "main_llm"
    assert llm_resource_name("mine", Named()) == "mine"
    assert llm_resource_name(None, Agent()) == "llm"


@pytest.mark.parametrize("runners", ["1", "2"], ids=["in-process", "runner-processes"])
def test_dev_loads_a_lit_agent_class_under_the_alias(agent_dir: Path, stub_url: str, runners: str) -> None:
    done = agentgrad(
        "dev",
        "lit_agents:LitEcho",
        "--tasks",
        "tasks.jsonl",
        "--llm-endpoint",
        stub_url,
        "--n-runners",
        runners,
        "--json",
        cwd=agent_dir,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["succeeded"] == 3 and report["reward_mean"] == pytest.approx(0.5)


def test_dev_names_a_class_that_is_not_an_agent(agent_dir: Path, stub_url: str) -> None:
    done = agentgrad("dev", "lit_agents:PlainAgent", "--tasks", "tasks.jsonl", cwd=agent_dir)
    assert done.returncode == 1 and "does not subclass agentgrad.Agent" in done.stderr


def test_an_explicit_llm_resource_wins_over_the_agents(agent_dir: Path, stub_url: str) -> None:
    done = agentgrad(
        "dev",
        "lit_agents:LitEcho",
        "--tasks",
        "tasks.jsonl",
        "--llm-endpoint",
        stub_url,
        "--llm-resource",
        "other",
        "--json",
        cwd=agent_dir,
    )
    assert done.returncode == 1  # the agent reads main_llm, and was told the LLM is "other"
    assert json.loads(done.stdout.strip().splitlines()[-1])["failed"] == 3


def test_runner_gives_a_lit_agent_the_proxy_as_main_llm(agent_dir: Path, stub_url: str) -> None:
    pytest.importorskip("fastapi")
    from agentgrad import semconv
    from agentgrad.proxy.server import LLMProxy
    from agentgrad.store.protocol import RolloutRequest
    from agentgrad.store.sqlite import SqliteStore

    store = SqliteStore(agent_dir / "store.db", watchdog_interval=None)
    try:
        (rollout,) = store.enqueue_rollouts([RolloutRequest(input={"x": 0.5})])
        with LLMProxy(store, stub_url) as proxy:
            done = agentgrad(
                "runner",
                "lit_agents:LitEcho",
                "--store",
                f"sqlite://{agent_dir / 'store.db'}",
                "--proxy",
                proxy.url,
                "--max-rollouts",
                "1",
                cwd=agent_dir,
            )
        assert done.returncode == 0, done.stdout + done.stderr
        assert store.get_rollout(rollout.rollout_id).reward == 0.5
        (message,) = store.query_spans(rollout.rollout_id, name=semconv.SPAN_MESSAGE)
        assert f"/rollout/{rollout.rollout_id}/attempt/" in message.attributes[semconv.MESSAGE_BODY]
    finally:
        store.close()


@pytest.mark.tiny_model
def test_train_gives_a_lit_agent_the_policy_as_main_llm(agent_dir: Path, tiny_model_dir: Path) -> None:
    pytest.importorskip("torch")
    (agent_dir / "lit_caller.py").write_text("""
import openai
import agentlightning as agl


class LitCaller(agl.LitAgent):
    name = "caller"  # tags its calls (no framework here to name them)

    def __init__(self, trained_agents="^call"):
        super().__init__(trained_agents=trained_agents)

    def rollout(self, task, resources, rollout):
        llm = resources["main_llm"]
        client = openai.OpenAI(base_url=llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id),
                               api_key="none", max_retries=0)
        reply = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=4, temperature=llm.sampling_parameters["temperature"])
        return float(len(reply.choices[0].message.content or "") % 2)
""")
    out = agent_dir / "run"
    done = agentgrad(
        "train",
        "lit_caller:LitCaller",
        "--model",
        str(tiny_model_dir),
        "--tasks",
        "tasks.jsonl",
        "--steps",
        "1",
        "--batch-size",
        "2",
        "--group-size",
        "2",
        "--val-every",
        "0",
        "--output-dir",
        str(out),
        "--runners",
        "1",
        "--concurrency",
        "4",
        cwd=agent_dir,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((out / "summary.json").read_text())["steps"] == 1
    assert "agent_match: ^call" in (out / "config.yaml").read_text()  # the LitAgent's trained_agents

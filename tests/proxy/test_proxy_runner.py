"""Runner and trainer wiring: each rollout's LLM points at the proxy; empty rollouts are loud."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import openai
from proxy_support import new_attempt

from agentgrad import semconv
from agentgrad.emit import agent as agent_scope
from agentgrad.proxy import ProxyResourcesHook
from agentgrad.runner import Runner
from agentgrad.store import open_store
from agentgrad.trainer import Trainer
from agentgrad.types import LLM, AttemptedRollout, Resources

REPO = Path(__file__).resolve().parents[2]


def calling_agent(task: dict, llm: LLM) -> float:
    with agent_scope("solver"):
        client = openai.OpenAI(base_url=llm.endpoint, api_key="k")
        reply = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["q"]}])
    return 1.0 if reply.choices[0].message.content else 0.0


def silent_agent(task: dict, llm: LLM) -> float:
    return 0.0  # never calls its LLM: a rollout without training data


def test_resources_hook_rewrites_llm_endpoints(memory_store) -> None:
    claimed: AttemptedRollout = new_attempt(memory_store)
    resources = Resources(
        resources_id="r", version=1, items={"policy": LLM(endpoint="http://engine/v1", model="p"), "temperature": 0.5}
    )
    hooked = ProxyResourcesHook("http://127.0.0.1:9/v1")(resources, claimed)
    expected = f"http://127.0.0.1:9/rollout/{claimed.rollout.rollout_id}/attempt/{claimed.attempt.attempt_id}/v1"
    assert hooked.items["policy"].endpoint == expected and hooked.items["policy"].model == "p"
    assert resources.items["policy"].endpoint == "http://engine/v1"  # snapshots stay immutable
    empty = ProxyResourcesHook("http://127.0.0.1:9")(Resources(resources_id="e", version=0), claimed)
    assert empty.items["llm"].endpoint == expected


def test_trainer_with_proxy_captures_every_rollout(memory_store, proxy) -> None:
    trainer = Trainer(memory_store, proxy=proxy, concurrency=2, console=None)
    report = trainer.dev(
        calling_agent,
        [{"q": f"What is {i} + 1?"} for i in range(4)],
        {"llm": LLM(endpoint="http://unused.invalid/v1", model="gpt-4o-mini")},
        timeout=60,
        print_summary=False,
    )
    assert report.succeeded
    rollouts = memory_store.query_rollouts()
    assert len(rollouts) == 4 and all(r.llm_calls == 1 for r in rollouts)
    for rollout in rollouts:
        (span,) = memory_store.query_spans(rollout.rollout_id, name=semconv.SPAN_LLM_CALL)
        assert span.attributes[semconv.AGENT_NAME] == "solver"
        assert span.attributes[semconv.LLM_PROMPT_TOKEN_IDS]
    assert proxy.metrics.unattributed == 0
    assert proxy.metrics.as_dict()["attempts_with_calls"] == 4


def test_rollout_without_llm_calls_is_flagged(memory_store, proxy, caplog) -> None:
    memory_store.enqueue_rollout({"q": "x"})
    runner = Runner(silent_agent, memory_store, max_rollouts=1, llm_proxy_url=proxy.url, poll_timeout=0.1)
    with caplog.at_level(logging.WARNING, logger="agentgrad.runner"):
        stats = runner.run()
    assert stats.no_llm_calls == 1
    assert any("no captured LLM call" in record.getMessage() for record in caplog.records)
    from agentgrad.store.protocol import RolloutFilter

    assert memory_store.count_rollouts(RolloutFilter(no_llm_calls=True)) == 1


def test_a_runner_without_a_proxy_says_so_when_nothing_was_captured(memory_store, caplog) -> None:
    memory_store.add_resources({"llm": LLM(endpoint="http://unused.invalid/v1", model="m")})
    memory_store.enqueue_rollout({"q": "x"})
    runner = Runner(silent_agent, memory_store, max_rollouts=1, poll_timeout=0.1)
    with caplog.at_level(logging.WARNING, logger="agentgrad.runner"):
        runner.run()
    (message,) = [r.getMessage() for r in caplog.records if "no captured LLM call" in r.getMessage()]
    assert "this runner has no capture proxy" in message and "is the agent using" not in message


def test_cli_serves_until_sigterm(tmp_path, stub) -> None:
    db = tmp_path / "store.db"
    with open_store(f"sqlite://{db}") as s:
        claimed = new_attempt(s)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentgrad",
            "proxy",
            "--store",
            f"sqlite://{db}",
            "--upstream",
            f"http://127.0.0.1:{stub.port}/v1",
            "--port",
            "0",
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
        endpoint = base[:-3] + f"/rollout/{claimed.rollout.rollout_id}/attempt/{claimed.attempt.attempt_id}/v1"
        openai.OpenAI(base_url=endpoint, api_key="k").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=20)
    assert process.returncode == 0, output
    assert "'recorded': 1" in output
    with open_store(f"sqlite://{db}") as s:
        assert len(s.query_spans(claimed.rollout.rollout_id, name=semconv.SPAN_LLM_CALL)) == 1

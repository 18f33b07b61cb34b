"""``agentgrad dev`` / ``apo`` / ``eval`` with ``--llm-endpoint`` and no ``--proxy``: a capture proxy is
started in front of the endpoint, so the agent's calls are recorded as through ``agentgrad proxy``.

Without it a user who pointed ``dev`` at their model server read "llm calls per rollout 0" and
"is the agent using the LLM endpoint it was given?", and APO's critic read traces without the
agent's conversations. The endpoints are :class:`~agentgrad.testing.stub.StubUpstream`: scripted
stand-ins for a model server, answering at once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agentgrad_command import agentgrad

from agentgrad import semconv
from agentgrad.store.sqlite import SqliteStore
from agentgrad.testing.stub import StubUpstream

pytest.importorskip("fastapi")


#: An agent as a user writes it: the OpenAI client on the endpoint it is handed.
AGENT = """
import agentgrad as ag
from openai import OpenAI


@ag.rollout
def review_agent(task, resources):
    llm = resources.get("llm")
    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "none", max_retries=0)
    template = resources.get("prompt_template") if "prompt_template" in resources.items else None
    content = template.format(review=task["review"]) if template else task["review"]
    messages = [{"role": "user", "content": content}]
    reply = client.chat.completions.create(model=llm.model, max_tokens=16, messages=messages)
    return 1.0 if reply.choices[0].message.content == task["label"] else 0.0
"""


@pytest.fixture
def agent_dir(tmp_path: Path) -> Path:
    (tmp_path / "reviews.py").write_text(AGENT)
    tasks = [{"review": "Great screen.", "label": "positive"}, {"review": "Broke in a week.", "label": "negative"}]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return tmp_path


def captured_calls(path: Path) -> list[dict]:
    store = SqliteStore(path, watchdog_interval=None)
    try:
        return [
            span.attributes
            for rollout in store.query_rollouts()
            for span in store.query_spans(rollout.rollout_id, name=semconv.SPAN_LLM_CALL)
        ]
    finally:
        store.close()


@pytest.mark.parametrize("runners", ["1", "2"], ids=["in-process", "runner-processes"])
def test_dev_records_the_calls_made_to_the_endpoint(agent_dir: Path, runners: str) -> None:
    with StubUpstream(["positive"]) as model:
        done = agentgrad(
            "dev",
            "reviews:review_agent",
            "--tasks",
            "tasks.jsonl",
            "--llm-endpoint",
            f"http://127.0.0.1:{model.port}/v1",
            "--model",
            "stub-model",
            "--store",
            "dev.db",
            "--n-runners",
            runners,
            "--json",
            cwd=agent_dir,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["succeeded"] == 2 and report["reward_mean"] == pytest.approx(0.5)
    assert report["llm_calls_per_rollout"] == 1 and report["llm_calls_by_agent"] == {"review_agent": 2}
    assert "no captured LLM call" not in done.stderr
    calls = captured_calls(agent_dir / "dev.db")
    assert len(calls) == 2 and len(model.requests) == 2  # every call reached the endpoint, once
    assert {model.requests[i]["model"] for i in (0, 1)} == {"stub-model"}  # the name asked for, kept


def test_apo_critic_reads_the_agents_conversations(agent_dir: Path) -> None:
    edit = "<prompt>Answer with one word, positive or negative: {review}</prompt>"
    with StubUpstream(["positive"]) as model, StubUpstream(["The replies are not one word.", edit]) as critic:
        done = agentgrad(
            "apo",
            "reviews:review_agent",
            "--tasks",
            "tasks.jsonl",
            "--prompt",
            "Classify: {review}",
            "--llm-endpoint",
            f"http://127.0.0.1:{model.port}/v1",
            "--model",
            "stub-model",
            "--critic-base-url",
            f"http://127.0.0.1:{critic.port}/v1",
            "--critic-model",
            "critic",
            "--rounds",
            "1",
            "--beam-width",
            "1",
            "--branch-factor",
            "1",
            "--concurrency",
            "1",
            "--store",
            "apo.db",
            cwd=agent_dir,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no captured LLM call" not in done.stderr
    assert len(captured_calls(agent_dir / "apo.db")) == len(model.requests) > 0
    critique_request = json.dumps(critic.requests[0]["messages"])
    assert "Classify: Great screen." in critique_request or "Classify: Broke in a week." in critique_request


def test_eval_on_an_endpoint_records_its_calls(agent_dir: Path) -> None:
    with StubUpstream(["negative"]) as model:
        done = agentgrad(
            "eval",
            "reviews:review_agent",
            "--tasks",
            "tasks.jsonl",
            "--llm-endpoint",  # eval's --upstream, under the name dev and apo give it
            f"http://127.0.0.1:{model.port}/v1",
            "--served-model",
            "stub-model",
            "--store",
            "eval.db",
            "--json",
            cwd=agent_dir,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["reward_mean"] == pytest.approx(0.5) and report["llm_calls_per_rollout"] == 1
    assert len(captured_calls(agent_dir / "eval.db")) == len(model.requests) == 2

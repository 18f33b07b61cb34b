"""Agents for the ``agentgrad train`` / ``eval`` command tests (runner processes import them by name)."""

from __future__ import annotations

import openai

from agentgrad.agents import rollout
from agentgrad.types import LLM


@rollout
def short_answer_agent(task: dict, llm: LLM) -> float:
    """One LLM call; the reward is 1 for a reply shorter than ``task["max_chars"]`` (a random tiny
    model writes replies of every length, so groups have reward variance to learn from)."""
    client = openai.OpenAI(base_url=llm.endpoint, api_key="none", max_retries=0)
    reply = client.chat.completions.create(
        model=llm.model,
        messages=[{"role": "user", "content": task["question"]}],
        max_tokens=8,
        temperature=llm.sampling.get("temperature", 1.0),
    )
    return 1.0 if len(reply.choices[0].message.content or "") < task["max_chars"] else 0.0


@rollout
def no_llm_agent(task: dict, llm: LLM) -> float:
    """Never calls its LLM: a run over it has nothing to train on."""
    return 1.0


@rollout
def parity_agent(task: dict, llm: LLM) -> float:
    """One LLM call; the reward is the parity of the reply's length: about half of a group's
    samples differ from the other half, so nearly every group has a learning signal."""
    client = openai.OpenAI(base_url=llm.endpoint, api_key="none", max_retries=0)
    reply = client.chat.completions.create(
        model=llm.model,
        messages=[{"role": "user", "content": task["question"]}],
        max_tokens=8,
        temperature=llm.sampling.get("temperature", 1.0),
    )
    return float(len(reply.choices[0].message.content or "") % 2)

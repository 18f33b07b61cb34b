"""An OpenAI-client agent that asks for its LLM under another name than ``llm`` (``main_llm``),
for the CLI's ``--llm-resource``."""

from __future__ import annotations

import openai

from agentgrad.agents import rollout
from agentgrad.types import Resources


@rollout
def main_llm_agent(task: dict, resources: Resources) -> float:
    llm = resources.get("main_llm")
    client = openai.OpenAI(base_url=llm.endpoint, api_key="none", max_retries=0)
    reply = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": str(task)}], max_tokens=8
    )
    return 1.0 if reply.choices[0].message.content else 0.0

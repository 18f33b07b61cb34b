"""An OpenAI Agents SDK agent as an Agent Lightning 0.x ``LitAgent``, run by AgentGrad.

A triage agent hands a question off to a math agent (``Agent.name`` ``triage`` and ``math``); the
rollout returns 1.0 when the final output contains the expected number. Async all the way down
(``rollout_async``). Only the import line differs from an Agent Lightning agent.
"""

from __future__ import annotations

import os
from typing import Any

from agents import (
    Agent,
    AgentsException,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

# the one line that differs from Agent Lightning's: import agentlightning as agl
from agentgrad.compat import agentlightning as agl

set_tracing_disabled(True)  # the SDK would export its traces to OpenAI


class LitMathAgent(agl.LitAgent[dict[str, Any]]):
    def __init__(self, max_turns: int = 3) -> None:
        super().__init__()
        self.max_turns = max_turns

    async def rollout_async(self, task: dict[str, Any], resources: agl.NamedResources, rollout: agl.Rollout) -> float:
        llm = resources["main_llm"]
        client = AsyncOpenAI(
            base_url=llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id),
            api_key=os.environ.get("OPENAI_API_KEY", "dummy"),
            max_retries=0,
        )
        model = OpenAIChatCompletionsModel(model=llm.model, openai_client=client)
        settings = ModelSettings(
            temperature=llm.sampling_parameters.get("temperature"),
            max_tokens=llm.sampling_parameters.get("max_tokens", 32),
        )
        math = Agent(
            name="math",
            instructions="Solve the arithmetic question. Reply with the number.",
            model=model,
            model_settings=settings,
        )
        triage = Agent(
            name="triage",
            instructions="Hand arithmetic questions to the math agent.",
            handoffs=[math],
            model=model,
            model_settings=settings,
        )
        try:
            result = await Runner.run(triage, task["question"], max_turns=self.max_turns)
        except AgentsException:  # too many turns, or a malformed reply
            return 0.0
        return 1.0 if str(task["answer"]) in str(result.final_output) else 0.0

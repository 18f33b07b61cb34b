"""A calculator agent written with AutoGen AgentChat: an `AssistantAgent` with one tool.

An ordinary AutoGen program: `AssistantAgent("calc", …)` with a `calculator` `FunctionTool`,
`reflect_on_tool_use=True` (after the tool's result the model states the answer), and an
`OpenAIChatCompletionClient` pointed at the LLM resource's base URL, with `model_info` filled in
because AutoGen knows nothing of a model it has not heard of. AgentGrad appears only as
`@agentgrad.rollout` and the `llm` resource; the task, the calculator and the answer check are
the calculator demo's (`agentgrad.demo.calc`), so the same problems and reward as `agentgrad demo`.
"""

from __future__ import annotations

from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_core.models import ModelFamily, ModelInfo
from autogen_core.tools import FunctionTool
from autogen_ext.models.openai import OpenAIChatCompletionClient

import agentgrad
from agentgrad.demo.calc import CALCULATOR_TOOL, SYSTEM_PROMPT, check_answer, run_calculator
from agentgrad.types import LLM

MAX_TOKENS = 64
#: What AutoGen needs to know of a model that is not one of OpenAI's.
MODEL_INFO = ModelInfo(
    vision=False, function_calling=True, json_output=False, family=ModelFamily.UNKNOWN, structured_output=False
)
calculator = FunctionTool(run_calculator, name="calculator", description=CALCULATOR_TOOL["function"]["description"])


@agentgrad.rollout
async def math_agent(task: dict[str, Any], llm: LLM) -> float:
    """Solve one arithmetic question with the calculator; 1.0 when the final answer is right."""
    client = OpenAIChatCompletionClient(
        model=llm.model,
        base_url=llm.base_url,
        api_key=llm.api_key or "not-needed",
        model_info=MODEL_INFO,
        temperature=llm.sampling.get("temperature", 1.0),
        max_tokens=llm.sampling.get("max_tokens", MAX_TOKENS),
        max_retries=0,
    )
    agent = AssistantAgent(
        "calc", model_client=client, tools=[calculator], system_message=SYSTEM_PROMPT, reflect_on_tool_use=True
    )
    try:
        result = await agent.run(task=task["question"])
    finally:
        await client.close()
    reply = result.messages[-1].content if result.messages else ""
    return 1.0 if isinstance(reply, str) and check_answer(reply, task["answer"]) else 0.0

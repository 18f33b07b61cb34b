"""An AutoGen calculator agent written for Agent Lightning 0.x (``examples/calc_x``), run by AgentGrad.

An ``AssistantAgent`` named ``calc`` with a calculator tool answers a math question; the rollout
emits its reward with ``agl.emit_reward``. The reference uses an MCP calculator server (``uvx
mcp-server-calculator``); this one passes the same calculator as a Python tool, so it runs offline.
Only the import line differs from an Agent Lightning agent.
"""

from __future__ import annotations

import asyncio
import os
import re
from typing import TypedDict, cast

from autogen_agentchat.agents import AssistantAgent
from autogen_core.models import ModelFamily
from autogen_ext.models.openai import OpenAIChatCompletionClient

# the one line that differs from Agent Lightning's: import agentlightning as agl
from agentgrad.compat import agentlightning as agl
from agentgrad.demo.calc import run_calculator


class MathProblem(TypedDict):
    id: str
    question: str
    result: str


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses, e.g. 37 * 12 + 5."""
    try:
        return run_calculator(expression)
    except Exception as exc:  # noqa: BLE001 - a model writes odd expressions; tell it, as a real tool would
        return f"error: {exc}"


def autogen_assistant_agent(
    model: str, openai_base_url: str, temperature: float, max_tokens: int
) -> tuple[AssistantAgent, OpenAIChatCompletionClient]:
    model_client = OpenAIChatCompletionClient(
        model=model,
        base_url=openai_base_url,
        api_key=os.environ.get("OPENAI_API_KEY", "token-abc123"),
        model_info={
            "vision": False,
            "function_calling": True,
            "json_output": False,
            "family": ModelFamily.UNKNOWN,
            "structured_output": False,
        },
        temperature=temperature,
        max_tokens=max_tokens,
    )
    calc_agent = AssistantAgent(name="calc", model_client=model_client, tools=[calculator], reflect_on_tool_use=True)
    return calc_agent, model_client


def evaluate(answer: str, ground_truth: str) -> float:
    try:
        return 1.0 if abs(float(answer) - float(ground_truth)) < 1e-6 else 0.0
    except ValueError:
        return 0.0


@agl.rollout
async def calc_agent(task: MathProblem, llm: agl.LLM) -> None:
    """Answer the question; emit the reward (and return None), as the reference does."""
    calc, client = autogen_assistant_agent(
        llm.model,
        llm.endpoint,
        llm.sampling_parameters.get("temperature", 0.7),
        llm.sampling_parameters.get("max_tokens", 48),
    )
    try:
        prompt = task["question"] + " Output the answer as ### ANSWER: <answer> ###."
        result = await asyncio.wait_for(calc.run(task=prompt), timeout=300.0)
        last_message = cast(str, result.messages[-1].content)
        answer = re.search(r"###\s*ANSWER:\s*(.+?)(\s*###|$)", last_message)
        answer_text = answer.group(1) if answer else last_message
    except Exception as exc:  # noqa: BLE001 - the reference scores a failed run 0 instead of failing the rollout
        print("Failure:", exc)
        answer_text = "None"
    finally:
        await client.close()
    agl.emit_reward(evaluate(answer_text, str(task["result"])))

"""smolagents' ToolCallingAgent with OpenAIServerModel (it replays tool calls as text)."""

from __future__ import annotations

import pytest
from capture_check import MAX_TOKENS, Capture, calculator, run_and_check

pytest.importorskip("smolagents")
from smolagents import OpenAIServerModel, ToolCallingAgent, tool  # noqa: E402

from agentgrad.demo.calc import SYSTEM_PROMPT  # noqa: E402
from agentgrad.types import LLM  # noqa: E402

pytestmark = pytest.mark.tiny_model  # runs last: see tests/conftest.py


@tool
def calculator_tool(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses.

    Args:
        expression: the expression, e.g. 37 * 12 + 5
    """
    return calculator(expression)


calculator_tool.name = "calculator"


def smolagents_agent(task: dict, llm: LLM) -> float:
    model = OpenAIServerModel(model_id=llm.model, api_base=llm.endpoint, api_key="sk-none", max_tokens=MAX_TOKENS)
    agent = ToolCallingAgent(tools=[calculator_tool], model=model, max_steps=2, verbosity_level=0)
    # The stock system prompt (thousands of tokens) does not fit the tiny model's 1024-token context.
    agent.prompt_templates["system_prompt"] = SYSTEM_PROMPT
    agent.run(task["question"])
    return 1.0


def test_smolagents_tool_calling_agent(capture: Capture) -> None:
    run_and_check(capture, smolagents_agent)

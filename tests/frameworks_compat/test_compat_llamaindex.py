"""LlamaIndex FunctionAgent (streams by default) with the OpenAI LLM class."""

from __future__ import annotations

import pytest
from capture_check import MAX_TOKENS, Capture, calculator, run_and_check

pytest.importorskip("llama_index.llms.openai")
from llama_index.core.agent.workflow import FunctionAgent  # noqa: E402
from llama_index.core.tools import FunctionTool  # noqa: E402
from llama_index.llms.openai import OpenAI  # noqa: E402

from agentgrad.demo.calc import SYSTEM_PROMPT  # noqa: E402
from agentgrad.types import LLM  # noqa: E402


async def llamaindex_agent(task: dict, llm: LLM) -> float:
    # LlamaIndex only accepts OpenAI model names (run_and_check hands out "gpt-4o-mini").
    model = OpenAI(model=llm.model, api_base=llm.endpoint, api_key="sk-none", max_tokens=MAX_TOKENS)
    agent = FunctionAgent(tools=[FunctionTool.from_defaults(calculator)], llm=model, system_prompt=SYSTEM_PROMPT)
    try:
        result = await agent.run(user_msg=task["question"], max_iterations=3)
    except Exception as exc:  # the tiny model may loop: only capture is under test
        if "max iterations" not in str(exc).lower():
            raise
        return 0.0
    return float(bool(str(result)))


def test_llamaindex_function_agent(capture: Capture) -> None:
    spans = run_and_check(capture, llamaindex_agent)
    assert all(s.attributes["agentgrad.llm.streamed"] for s in spans)

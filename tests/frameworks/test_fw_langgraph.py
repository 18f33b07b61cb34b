"""LangChain ChatOpenAI + LangGraph's prebuilt ReAct agent."""

from __future__ import annotations

import pytest
from capture_check import MAX_TOKENS, Capture, calculator, run_and_check

pytest.importorskip("langgraph")
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from langgraph.errors import GraphRecursionError  # noqa: E402
from langgraph.prebuilt import create_react_agent  # noqa: E402

from agentgrad.demo.calc import SYSTEM_PROMPT  # noqa: E402
from agentgrad.types import LLM  # noqa: E402

pytestmark = pytest.mark.tiny_model  # runs last: see tests/conftest.py

calculator_tool = tool(calculator)


def _agent(llm: LLM, streaming: bool):
    model = ChatOpenAI(
        model=llm.model, base_url=llm.endpoint, api_key="sk-none", max_tokens=MAX_TOKENS, streaming=streaming
    )
    return create_react_agent(model, [calculator_tool], prompt=SYSTEM_PROMPT)


def langgraph_agent(task: dict, llm: LLM) -> float:
    try:
        result = _agent(llm, streaming=False).invoke({"messages": [("user", task["question"])]}, {"recursion_limit": 6})
    except GraphRecursionError:
        return 0.0
    return float(bool(result["messages"][-1].content))


async def langgraph_streaming_agent(task: dict, llm: LLM) -> float:
    try:
        await _agent(llm, streaming=True).ainvoke({"messages": [("user", task["question"])]}, {"recursion_limit": 6})
    except GraphRecursionError:
        return 0.0
    return 1.0


def test_langgraph_react_agent(capture: Capture) -> None:
    spans = run_and_check(capture, langgraph_agent)
    assert {s.attributes["agentgrad.agent.name"] for s in spans} == {"agent"}  # the ReAct graph's model node


def test_langgraph_streaming_chat_model(capture: Capture) -> None:
    spans = run_and_check(capture, langgraph_streaming_agent)
    assert all(s.attributes["agentgrad.llm.streamed"] for s in spans)

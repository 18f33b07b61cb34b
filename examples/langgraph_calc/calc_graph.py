"""A calculator agent written as a LangGraph user writes one (issue 16's new-user agent).

The graph from LangGraph's docs: a model node that calls ``ChatOpenAI.bind_tools``, a prebuilt
``ToolNode``, and ``tools_condition`` routing between them::

    START → agent ─┬─ tool calls → tools → agent
                   └─ an answer ─────────→ END

The tool is an ordinary ``@tool`` function with the user's own docstring, and the system prompt
is the user's own: neither is the tiny model's demo wording, and the tool's schema is
LangChain's, not the plain client's. AgentGrad appears only as ``@agentgrad.rollout`` and the
``llm`` resource; the reward is the calculator task's answer check (the last number of the reply).
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

import agentgrad
from agentgrad.demo.calc import check_answer, run_calculator

SYSTEM = "You are a math assistant. Use the calculator to compute, then reply with the result."
MAX_TOKENS = 64


@tool
def calculator(expression: str) -> str:
    """Calculate the value of an arithmetic expression such as 3 * (4 + 5)."""
    return run_calculator(expression)


def build_graph(model: ChatOpenAI) -> Any:
    llm = model.bind_tools([calculator])

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [llm.invoke([SystemMessage(SYSTEM), *state["messages"]])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([calculator]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


@agentgrad.rollout
def calc_graph(task: dict[str, Any], llm: agentgrad.LLM) -> float:
    """Answer one arithmetic question; 1.0 when the final reply holds the right number."""
    model = ChatOpenAI(
        model=llm.model,
        base_url=llm.endpoint,
        api_key=llm.api_key or "none",
        max_retries=0,
        temperature=llm.sampling.get("temperature", 1.0),
        max_tokens=llm.sampling.get("max_tokens", MAX_TOKENS),
    )
    try:
        final = build_graph(model).invoke({"messages": [HumanMessage(task["question"])]}, {"recursion_limit": 8})
    except GraphRecursionError:
        return 0.0
    reply = final["messages"][-1].content
    return 1.0 if isinstance(reply, str) and check_answer(reply, task["answer"]) else 0.0

"""A text-to-SQL agent in LangGraph: write a query, run it, check it, rewrite it until it looks right.

The graph is the reference's Spider agent, scaled to the generated SQL world
(``agentgrad scenarios sql generate``)::

    START → write_query → execute_query → check_query ─┬─ accepted, or max_turns reached → END
                               ▲                        │
                               └──── rewrite_query ◄────┘

One ``ChatOpenAI`` model serves every node, each with its own prompt. It is ordinary LangGraph
code: AgentGrad appears only as ``@agentgrad.rollout`` and the ``llm`` resource (the endpoint and
model to call, and the sampling settings training asks for), plus one ``emit_message`` so that
a failed query's reason is visible next to the reward. The node names *are* the agent names
training sees — ``write_query``, ``check_query``, ``rewrite_query`` — with no code to say so
(docs/multi-agent.md), so ``agent_match: "write_query|rewrite_query"`` trains the writer and
the rewriter and leaves the checker alone, as the reference does.

The database and the reward come from the world (``agentgrad.scenarios.sql``), as the reference's
come from Spider's evaluation code: the query runs read-only with a time budget and a row cap,
and the reward is execution match against the task's gold query.
"""

from __future__ import annotations

import re
from typing import Any, Literal, TypedDict

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

import agentgrad
from agentgrad.scenarios.sql import execution_match, run_query
from agentgrad.scenarios.sql.prompt import (
    CHECK_PROMPT,
    CORRECT,
    INCORRECT,
    RESULT_CHARS,
    REWRITE_PROMPT,
    WRITE_PROMPT,
    check_request,
    result_text,
    rewrite_request,
    write_request,
)

#: Writes of a query (the first one and each rewrite) before the graph stops.
MAX_TURNS = 3
#: Completion tokens per call unless the LLM resource's sampling says otherwise.
MAX_TOKENS = 96


class State(TypedDict, total=False):
    question: str
    schema: str
    query: str
    result: str
    feedback: str
    turns: int


def extract_query(text: str) -> str:
    """The SQL in a reply: the last ```sql block, else the text from its first SELECT, else it all."""
    blocks = re.findall(r"```(?:sql)?\s*\n?(.*?)```", text, re.DOTALL | re.IGNORECASE)
    if blocks:
        return blocks[-1].strip()
    select = re.search(r"\b(SELECT|WITH)\b.*", text, re.DOTALL | re.IGNORECASE)
    return (select.group(0) if select else text).strip()


def build_graph(model: ChatOpenAI, db_path: str, max_turns: int = MAX_TURNS) -> Any:
    """The compiled graph over ``model``, answering questions about the database at ``db_path``."""

    def ask(system: str, user: str) -> str:
        return str(model.invoke([SystemMessage(system), HumanMessage(user)]).content)

    def write_query(state: State) -> State:
        reply = ask(WRITE_PROMPT.format(schema=state["schema"]), write_request(state["question"]))
        return {"query": extract_query(reply), "turns": 1}

    def execute_query(state: State) -> State:
        return {"result": result_text(run_query(db_path, state["query"]))}

    def check_query(state: State) -> State:
        user = check_request(state["question"], state["query"], state["result"])
        return {"feedback": ask(CHECK_PROMPT.format(schema=state["schema"]), user)}

    def rewrite_query(state: State) -> State:
        user = rewrite_request(state["question"], state["query"], state["result"], state["feedback"])
        reply = ask(REWRITE_PROMPT.format(schema=state["schema"]), user)
        return {"query": extract_query(reply) or state["query"], "turns": state["turns"] + 1}

    def after_check(state: State) -> Literal["rewrite_query", "__end__"]:
        feedback = state["feedback"]
        if feedback.rfind(CORRECT) > feedback.rfind(INCORRECT):
            return END
        return END if state["turns"] >= max_turns else "rewrite_query"

    graph = StateGraph(State)
    graph.add_node("write_query", write_query)
    graph.add_node("execute_query", execute_query)
    graph.add_node("check_query", check_query)
    graph.add_node("rewrite_query", rewrite_query)
    graph.add_edge(START, "write_query")
    graph.add_edge("write_query", "execute_query")
    graph.add_edge("execute_query", "check_query")
    graph.add_conditional_edges("check_query", after_check)
    graph.add_edge("rewrite_query", "execute_query")
    return graph.compile()


@agentgrad.rollout
def sql_agent(task: dict[str, Any], llm: agentgrad.LLM) -> float:
    """Answer one task of the SQL world; the reward is execution match of the final query."""
    model = ChatOpenAI(
        model=llm.model,
        base_url=llm.endpoint,
        api_key=llm.api_key or "none",
        max_retries=0,
        temperature=llm.sampling.get("temperature", 1.0),
        max_tokens=llm.sampling.get("max_tokens", MAX_TOKENS),
    )
    graph = build_graph(model, task["db_path"], task.get("max_turns", MAX_TURNS))
    final = graph.invoke({"question": task["question"], "schema": task["schema"]}, {"recursion_limit": 50})
    score = execution_match(final["query"], task["query"], task["db_path"], ordered=task.get("ordered"))
    agentgrad.emit_message(f"{score.message} (after {final['turns']} write(s)): {final['query'][:RESULT_CHARS]}")
    return score.reward

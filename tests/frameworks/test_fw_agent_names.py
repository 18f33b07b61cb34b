"""Two-agent programs, unchanged, on the real engine: every call is stored under the framework's
own name for the agent that made it, and ``agent_match`` keeps exactly one of the two agents.

No ``agentgrad.agent(...)`` scope anywhere: the names come from the frameworks (LangGraph nodes,
Agents SDK agents and handoffs, AutoGen agents in a team, smolagents agents). CrewAI and
LlamaIndex: ``tests/frameworks_compat/test_compat_agent_names.py``.
"""

from __future__ import annotations

from typing import Any, TypedDict

import pytest
from capture_check import MAX_TOKENS, Capture, calculator
from names_check import run_and_check_names

from agentgrad import semconv
from agentgrad.demo.calc import SYSTEM_PROMPT
from agentgrad.types import LLM

pytestmark = pytest.mark.tiny_model  # runs last: see tests/conftest.py

CHECK_PROMPT = "You check answers to arithmetic questions. Say whether the answer is right."


# ---- LangGraph: two nodes calling the same ChatOpenAI -------------------------------------------


class SqlState(TypedDict, total=False):
    question: str
    draft: str
    verdict: str


def make_langgraph_agent(asynchronous: bool):
    pytest.importorskip("langgraph")
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, StateGraph

    def build(llm: LLM) -> Any:
        model = ChatOpenAI(model=llm.model, base_url=llm.endpoint, api_key="sk-none", max_tokens=MAX_TOKENS)

        def write(state: SqlState) -> list:
            return [("system", SYSTEM_PROMPT), ("user", state["question"])]

        def check(state: SqlState) -> list:
            return [("system", CHECK_PROMPT), ("user", f"{state['question']} {state['draft']}")]

        if asynchronous:

            async def write_query(state: SqlState) -> SqlState:
                return {"draft": (await model.ainvoke(write(state))).content}

            async def check_query(state: SqlState) -> SqlState:
                return {"verdict": (await model.ainvoke(check(state))).content}
        else:  # sync nodes run in LangGraph's thread pool

            def write_query(state: SqlState) -> SqlState:
                return {"draft": model.invoke(write(state)).content}

            def check_query(state: SqlState) -> SqlState:
                return {"verdict": model.invoke(check(state)).content}

        graph = StateGraph(SqlState)
        graph.add_node("write_query", write_query)
        graph.add_node("check_query", check_query)
        graph.add_edge(START, "write_query")
        graph.add_edge("write_query", "check_query")
        graph.add_edge("check_query", END)
        return graph.compile()

    if asynchronous:

        async def langgraph_agent(task: dict, llm: LLM) -> float:
            await build(llm).ainvoke({"question": task["question"]})
            return 1.0
    else:

        def langgraph_agent(task: dict, llm: LLM) -> float:
            build(llm).invoke({"question": task["question"]})
            return 1.0

    return langgraph_agent


@pytest.mark.parametrize("asynchronous", [False, True], ids=["invoke", "ainvoke"])
def test_langgraph_nodes_are_the_agents(capture: Capture, asynchronous: bool) -> None:
    run_and_check_names(
        capture,
        make_langgraph_agent(asynchronous),
        names=["write_query", "check_query"],
        agents={"write_query", "check_query"},
        match="write",
        selected="write_query",
    )


# ---- OpenAI Agents SDK: a writer that hands off to a checker --------------------------------------


def make_sdk_agent(api: str):
    pytest.importorskip("agents")
    from agents import (
        Agent,
        AgentsException,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from agents.items import ModelResponse
    from openai import AsyncOpenAI
    from openai.types.responses import ResponseFunctionToolCall

    set_tracing_disabled(True)
    model_class = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel

    class HandsOff(model_class):  # type: ignore[misc, valid-type]
        """The real model's call, then a handoff: the tiny model cannot be relied on to choose one."""

        async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
            response = await super().get_response(*args, **kwargs)
            handoff = ResponseFunctionToolCall(
                type="function_call", call_id="handoff-1", name="transfer_to_checker", arguments="{}"
            )
            return ModelResponse(output=[handoff], usage=response.usage, response_id=response.response_id)

    async def sdk_agent(task: dict, llm: LLM) -> float:
        client = AsyncOpenAI(base_url=llm.endpoint, api_key="sk-none")
        settings = ModelSettings(max_tokens=MAX_TOKENS)
        checker = Agent(
            name="checker",
            instructions=SYSTEM_PROMPT,
            tools=[function_tool(calculator)],
            model=model_class(model=llm.model, openai_client=client),
            model_settings=settings,
        )
        writer = Agent(
            name="writer",
            instructions=SYSTEM_PROMPT,
            handoffs=[checker],
            model=HandsOff(model=llm.model, openai_client=client),
            model_settings=settings,
        )
        try:
            result = await Runner.run(writer, task["question"], max_turns=3)
        except AgentsException:  # the checker's turns ran out: its calls are made all the same
            return 0.0
        assert result.last_agent is checker
        return 1.0

    return sdk_agent


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_agents_sdk_handoff_switches_the_agent(capture: Capture, api: str) -> None:
    spans = run_and_check_names(
        capture, make_sdk_agent(api), agents={"writer", "checker"}, match="^writer$", selected="writer"
    )
    names = [s.attributes[semconv.AGENT_NAME] for s in sorted(spans, key=lambda s: s.sequence_id)]
    assert names[0] == "writer" and names[1:] == ["checker"] * (len(names) - 1), names  # one turn, then handed off


# ---- AutoGen: two AssistantAgents taking turns in a team ------------------------------------------


def autogen_team(task: dict, llm: LLM) -> Any:
    pytest.importorskip("autogen_agentchat")
    from autogen_agentchat.agents import AssistantAgent
    from autogen_agentchat.conditions import MaxMessageTermination
    from autogen_agentchat.teams import RoundRobinGroupChat
    from autogen_ext.models.openai import OpenAIChatCompletionClient
    from test_fw_autogen import MODEL_INFO

    async def run() -> float:
        client = OpenAIChatCompletionClient(
            model=llm.model, base_url=llm.endpoint, api_key="sk-none", model_info=MODEL_INFO, max_tokens=MAX_TOKENS
        )
        writer = AssistantAgent("writer", model_client=client, system_message=SYSTEM_PROMPT)
        checker = AssistantAgent("checker", model_client=client, system_message=CHECK_PROMPT)
        team = RoundRobinGroupChat([writer, checker], termination_condition=MaxMessageTermination(3))
        try:
            await team.run(task=task["question"])
        finally:
            await client.close()
        return 1.0

    return run()


def test_autogen_team_agents(capture: Capture) -> None:
    run_and_check_names(
        capture,
        autogen_team,
        names=["writer", "checker"],
        agents={"writer", "checker"},
        match="check",
        selected="checker",
    )


# ---- smolagents: two agents run one after the other ------------------------------------------------


def smolagents_pair(task: dict, llm: LLM) -> float:
    pytest.importorskip("smolagents")
    from smolagents import OpenAIServerModel, ToolCallingAgent
    from test_fw_smolagents import calculator_tool

    model = OpenAIServerModel(model_id=llm.model, api_base=llm.endpoint, api_key="sk-none", max_tokens=MAX_TOKENS)
    writer, checker = (
        ToolCallingAgent(
            tools=[calculator_tool], model=model, max_steps=1, verbosity_level=0, name=name, description=f"the {name}"
        )
        for name in ("writer", "checker")
    )
    for agent in (writer, checker):
        agent.prompt_templates["system_prompt"] = SYSTEM_PROMPT  # the stock one overflows the tiny model
    draft = writer.run(task["question"])
    checker.run(f"{task['question']} Proposed answer: {draft}")
    return 1.0


def test_smolagents_agents(capture: Capture) -> None:
    spans = run_and_check_names(
        capture, smolagents_pair, agents={"writer", "checker"}, match="writer", selected="writer"
    )
    names = [s.attributes[semconv.AGENT_NAME] for s in sorted(spans, key=lambda s: s.sequence_id)]
    assert names == sorted(names, key=lambda n: n != "writer"), names  # all the writer's calls, then the checker's

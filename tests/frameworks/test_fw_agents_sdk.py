"""OpenAI Agents SDK: the default Responses API and chat-completions mode, streamed and not."""

from __future__ import annotations

import pytest
from capture_check import MAX_TOKENS, Capture, calculator, run_and_check

pytest.importorskip("agents")
from agents import (  # noqa: E402
    Agent,
    AgentsException,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI  # noqa: E402

from agentgrad.demo.calc import SYSTEM_PROMPT  # noqa: E402
from agentgrad.types import LLM  # noqa: E402

pytestmark = pytest.mark.tiny_model  # runs last: see tests/conftest.py

set_tracing_disabled(True)  # the SDK would export traces to OpenAI with our fake key
calculator_tool = function_tool(calculator)


def _agent(llm: LLM, api: str) -> Agent:
    client = AsyncOpenAI(base_url=llm.endpoint, api_key="sk-none")
    model_class = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
    return Agent(
        name="calc",
        instructions=SYSTEM_PROMPT,
        tools=[calculator_tool],
        model=model_class(model=llm.model, openai_client=client),
        model_settings=ModelSettings(max_tokens=MAX_TOKENS),
    )


def make_agent(api: str, streamed: bool):
    async def sdk_agent(task: dict, llm: LLM) -> float:
        agent = _agent(llm, api)
        try:
            if streamed:
                result = Runner.run_streamed(agent, task["question"], max_turns=3)
                async for _ in result.stream_events():
                    pass
            else:
                result = await Runner.run(agent, task["question"], max_turns=3)
        except AgentsException:  # too many turns, or a reply cut at max_tokens (Responses "incomplete")
            return 0.0
        return float(bool(result.final_output))

    return sdk_agent


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
@pytest.mark.parametrize("api", ["responses", "chat"])
def test_agents_sdk(capture: Capture, api: str, streamed: bool) -> None:
    spans = run_and_check(capture, make_agent(api, streamed))
    assert {s.attributes["agentgrad.llm.api"] for s in spans} == {api}
    assert all(s.attributes["agentgrad.llm.streamed"] is streamed for s in spans)
    assert {s.attributes["agentgrad.agent.name"] for s in spans} == {"calc"}  # Agent.name

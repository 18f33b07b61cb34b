"""AutoGen AgentChat's AssistantAgent with an OpenAI-compatible model client."""

from __future__ import annotations

import pytest
from capture_check import MAX_TOKENS, Capture, calculator, run_and_check

pytest.importorskip("autogen_agentchat")
from autogen_agentchat.agents import AssistantAgent  # noqa: E402
from autogen_ext.models.openai import OpenAIChatCompletionClient  # noqa: E402

from agentgrad.demo.calc import SYSTEM_PROMPT  # noqa: E402
from agentgrad.types import LLM  # noqa: E402

pytestmark = pytest.mark.tiny_model  # runs last: see tests/conftest.py

#: Required by AutoGen for any model name it does not know.
MODEL_INFO = {
    "vision": False,
    "function_calling": True,
    "json_output": False,
    "family": "unknown",
    "structured_output": False,
}


def make_agent(streaming: bool):
    async def autogen_agent(task: dict, llm: LLM) -> float:
        client = OpenAIChatCompletionClient(
            model=llm.model, base_url=llm.endpoint, api_key="sk-none", model_info=MODEL_INFO, max_tokens=MAX_TOKENS
        )
        agent = AssistantAgent(
            "calc",
            model_client=client,
            tools=[calculator],
            system_message=SYSTEM_PROMPT,
            reflect_on_tool_use=True,
            model_client_stream=streaming,
        )
        try:
            result = await agent.run(task=task["question"])
        finally:
            await client.close()
        return float(bool(result.messages))

    return autogen_agent


@pytest.mark.parametrize("streaming", [False, True], ids=["plain", "streamed"])
def test_autogen_assistant_agent(capture: Capture, streaming: bool) -> None:
    spans = run_and_check(capture, make_agent(streaming))
    assert all(s.attributes["agentgrad.llm.streamed"] is streaming for s in spans)
    assert {s.attributes["agentgrad.agent.name"] for s in spans} == {"calc"}  # the agent's name, not the function's

"""CrewAI and LlamaIndex: agent names inferred from the frameworks (openai 2.x venv).

Fast tests first — a scripted model records the name the openai-client hook would send — then
two-agent programs, unchanged, on the real engine through the proxy (``names_check``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from capture_check import MAX_TOKENS, Capture
from names_check import run_and_check_names

from agentgrad import semconv
from agentgrad.demo.calc import SYSTEM_PROMPT
from agentgrad.tracing import agent_names
from agentgrad.types import LLM

agent_names.install()

CHECK_PROMPT = "You check answers to arithmetic questions. Say whether the answer is right."


def in_order(spans: list[Any]) -> list[str]:
    return [s.attributes[semconv.AGENT_NAME] for s in sorted(spans, key=lambda s: s.sequence_id)]


# ---- CrewAI: the agent's role ------------------------------------------------------------------------


def test_crewai_role_names_each_agents_calls() -> None:
    pytest.importorskip("crewai")
    from crewai import Agent, Crew, Task
    from crewai.llms.base_llm import BaseLLM

    seen: list[str | None] = []

    class Scripted(BaseLLM):
        def call(self, messages: Any, *args: Any, **kwargs: Any) -> str:
            seen.append(agent_names.framework_agent_name())
            return "Thought: done\nFinal Answer: ok"

        def supports_function_calling(self) -> bool:
            return False

    llm = Scripted(model="scripted")
    writer = Agent(role="Writer", goal="write", backstory="writes", llm=llm, verbose=False)
    checker = Agent(role="Rédacteur en chef", goal="check", backstory="checks", llm=llm, verbose=False)
    crew = Crew(
        agents=[writer, checker],
        verbose=False,
        tasks=[
            Task(description="write", expected_output="text", agent=writer),
            Task(description="check", expected_output="text", agent=checker),
        ],
    )
    assert crew.kickoff().raw == "ok"
    assert seen == ["Writer", "Rédacteur en chef"]
    seen.clear()
    writer.kickoff("write on your own")  # an agent without a crew
    assert seen == ["Writer"]
    assert agent_names.framework_agent_name() is None


def crewai_pair(task: dict, llm: LLM) -> float:
    from crewai import LLM as CrewLLM
    from crewai import Agent, Crew, Task

    model = CrewLLM(model=llm.model, base_url=llm.endpoint, api_key="sk-none", max_tokens=MAX_TOKENS)
    writer = Agent(
        role="Writer", goal="Answer arithmetic questions", backstory=SYSTEM_PROMPT, llm=model, max_iter=1, verbose=False
    )
    checker = Agent(role="Checker", goal="Check answers", backstory=CHECK_PROMPT, llm=model, max_iter=1, verbose=False)
    tasks = [
        Task(description=task["question"], expected_output="The answer", agent=writer),
        Task(description="Check the answer.", expected_output="Right or wrong", agent=checker),
    ]
    Crew(agents=[writer, checker], tasks=tasks, verbose=False).kickoff()
    return 1.0


def test_crewai_crew_roles(capture: Capture) -> None:
    pytest.importorskip("crewai")
    spans = run_and_check_names(
        capture, crewai_pair, agents={"Writer", "Checker"}, match="^Checker$", selected="Checker"
    )
    names = in_order(spans)
    assert names == sorted(names, key=lambda n: n != "Writer"), names  # the writer's task, then the checker's


# ---- LlamaIndex: the workflow agent's name ---------------------------------------------------------


def test_llamaindex_agent_workflow_handoff_switches_the_name() -> None:
    pytest.importorskip("llama_index.core")
    from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent
    from llama_index.core.llms import ChatMessage, ChatResponse, LLMMetadata
    from llama_index.core.llms.llm import ToolSelection
    from llama_index.core.llms.mock import MockFunctionCallingLLM

    seen: list[str | None] = []

    class Scripted(MockFunctionCallingLLM):
        """First call: hand off to the checker; then answer."""

        @property
        def metadata(self) -> LLMMetadata:
            return LLMMetadata(is_function_calling_model=True, model_name="scripted")

        def _prepare_chat_with_tools(
            self, tools: Any, user_msg: Any = None, chat_history: Any = None, **kwargs: Any
        ) -> dict:
            return {"messages": list(chat_history or [])}

        async def astream_chat(self, messages: Any, **kwargs: Any) -> Any:
            seen.append(agent_names.framework_agent_name())
            text = "HANDOFF" if len(seen) == 1 else "ok"

            async def stream() -> Any:
                yield ChatResponse(message=ChatMessage(role="assistant", content=text), delta=text)

            return stream()

        def get_tool_calls_from_response(
            self, response: Any, error_on_no_tool_call: bool = True, **kwargs: Any
        ) -> list:
            if response.message.content != "HANDOFF":
                return []
            return [
                ToolSelection(
                    tool_id="t1", tool_name="handoff", tool_kwargs={"to_agent": "checker", "reason": "check it"}
                )
            ]

    llm = Scripted()
    writer = FunctionAgent(name="writer", description="writes", llm=llm, can_handoff_to=["checker"])
    checker = FunctionAgent(name="checker", description="checks", llm=llm)

    async def main() -> None:
        assert str(await AgentWorkflow(agents=[writer, checker], root_agent="writer").run(user_msg="go")) == "ok"
        await FunctionAgent(name="solo", llm=llm).run(user_msg="go")

    asyncio.run(main())
    assert seen == ["writer", "checker", "solo"]


async def llamaindex_pair(task: dict, llm: LLM) -> float:
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.llms.openai import OpenAI

    # LlamaIndex only accepts OpenAI model names (run_and_check hands out "gpt-4o-mini").
    model = OpenAI(model=llm.model, api_base=llm.endpoint, api_key="sk-none", max_tokens=MAX_TOKENS)
    writer = FunctionAgent(name="writer", llm=model, system_prompt=SYSTEM_PROMPT)
    checker = FunctionAgent(name="checker", llm=model, system_prompt=CHECK_PROMPT)
    draft = await writer.run(user_msg=task["question"], max_iterations=2)
    await checker.run(user_msg=f"{task['question']} Proposed answer: {draft}", max_iterations=2)
    return 1.0


def test_llamaindex_function_agents(capture: Capture) -> None:
    pytest.importorskip("llama_index.llms.openai")
    run_and_check_names(
        capture,
        llamaindex_pair,
        names=["writer", "checker"],
        agents={"writer", "checker"},
        match="writer",
        selected="writer",
    )

"""CrewAI: one agent with the calculator tool, one task."""

from __future__ import annotations

import pytest
from capture_check import MAX_TOKENS, Capture, calculator, run_and_check

pytest.importorskip("crewai")
from crewai import LLM as CrewLLM  # noqa: E402
from crewai import Agent, Crew, Task  # noqa: E402
from crewai.tools import tool  # noqa: E402

from agentgrad.demo.calc import SYSTEM_PROMPT  # noqa: E402
from agentgrad.types import LLM  # noqa: E402

calculator_tool = tool("calculator")(calculator)


def make_agent(stream: bool):
    def crewai_agent(task: dict, llm: LLM) -> float:
        model = CrewLLM(model=llm.model, base_url=llm.endpoint, api_key="sk-none", max_tokens=MAX_TOKENS, stream=stream)
        solver = Agent(
            role="Calculator",
            goal="Answer arithmetic questions",
            backstory=SYSTEM_PROMPT,
            tools=[calculator_tool],
            llm=model,
            max_iter=2,
            verbose=False,
        )
        job = Task(description=task["question"], expected_output="The answer", agent=solver)
        output = Crew(agents=[solver], tasks=[job], verbose=False).kickoff()
        return float(bool(output.raw))

    return crewai_agent


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_crewai_crew(capture: Capture, stream: bool) -> None:
    run_and_check(capture, make_agent(stream))

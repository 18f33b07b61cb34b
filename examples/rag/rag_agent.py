"""A retrieval agent written with the OpenAI Agents SDK: a `search` tool over an encyclopedia.

An ordinary Agents SDK program: an `Agent` named `searcher` with one function tool, run by
`Runner.run`, which may search several times (a 2-hop question needs a second search for the
person, place or organisation the first entry names) and then answers as `<answer>…</answer>`.
The model is an `OpenAIChatCompletionsModel` whose `AsyncOpenAI` client points at the LLM
resource's base URL. AgentGrad appears only as `@agentgrad.rollout`, the `llm` resource and the
reward it emits: exact match (trained on) and token F1 (recorded beside it).

Each task names its corpus file (written by `agentgrad scenarios rag generate`); the search tool
is BM25 over that file's SQLite FTS5 index (`agentgrad.scenarios.rag.search`).
"""

from __future__ import annotations

from typing import Any

from agents import (
    Agent,
    AgentsException,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI, BadRequestError

import agentgrad
from agentgrad.scenarios.rag.prompt import INSTRUCTIONS, SEARCH_DESCRIPTION
from agentgrad.scenarios.rag.reward import score_reply
from agentgrad.scenarios.rag.search import open_index, run_search
from agentgrad.types import LLM

set_tracing_disabled(True)  # the SDK would export its traces to OpenAI

#: Model turns per question: a search, a second search, the answer, and one to spare.
MAX_TURNS = 4
MAX_TOKENS = 64


def build_agent(llm: LLM, corpus: str) -> Agent:
    """The `searcher` agent, its search tool bound to one corpus."""
    index = open_index(corpus)

    def search(query: str) -> str:
        return run_search(index, query)

    client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key or "not-needed", max_retries=0)
    return Agent(
        name="searcher",
        instructions=INSTRUCTIONS,
        tools=[function_tool(search, description_override=SEARCH_DESCRIPTION)],
        model=OpenAIChatCompletionsModel(model=llm.model, openai_client=client),
        model_settings=ModelSettings(
            temperature=llm.sampling.get("temperature"), max_tokens=llm.sampling.get("max_tokens", MAX_TOKENS)
        ),
    )


@agentgrad.rollout
async def rag_agent(task: dict[str, Any], llm: LLM) -> None:
    """Answer one question with the search tool; emit exact match (the reward) and token F1."""
    agent = build_agent(llm, task["corpus"])
    try:
        result = await Runner.run(agent, task["question"], max_turns=MAX_TURNS)
        reply = str(result.final_output or "")
    except AgentsException as exc:  # out of turns, or a call to a tool that does not exist
        agentgrad.emit_message(f"no answer: {type(exc).__name__}: {exc}")
        reply = ""
    except BadRequestError as exc:  # the conversation outgrew the model's context
        agentgrad.emit_message(f"no answer: {exc}")
        reply = ""
    agentgrad.emit_reward(score_reply(reply, task["answer"]).as_reward(), primary="em")

"""A calculator agent written with the plain OpenAI client — nothing AgentGrad-specific inside.

The loop: ask the model (with the calculator tool), run the tool calls it makes, ask again, and
score the final answer. AgentGrad only provides ``llm`` (endpoint, model name, sampling settings)
and captures the calls through its proxy; the function returns the reward.
"""

from __future__ import annotations

import functools
import json
from typing import Any, cast

from openai import DefaultHttpxClient, OpenAI
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

import agentgrad
from agentgrad.demo.calc import CALCULATOR_TOOL, SYSTEM_PROMPT, check_answer, generate_problems, run_calculator
from agentgrad.types import LLM

MAX_TURNS = 3
MAX_TOKENS = 64


@functools.cache
def _http() -> DefaultHttpxClient:
    """One connection pool for every rollout of this process. Each rollout has an endpoint of its
    own (the capture proxy's per-attempt URL), so each gets an ``OpenAI`` object; sharing the HTTP
    client spares each one the 19 ms of CPU that loading the TLS certificates costs."""
    return DefaultHttpxClient()


def _client(llm: LLM) -> OpenAI:
    # No client timeout of its own: the rollout's timeout bounds the attempt, and a slow CPU model
    # under load (SmolLM2 with every runner busy) may take minutes for one reply.
    return OpenAI(
        base_url=llm.endpoint, api_key=llm.api_key or "not-needed", max_retries=0, timeout=None, http_client=_http()
    )


@agentgrad.rollout
def calc_agent(task: dict[str, Any], llm: LLM) -> float:
    """Solve one arithmetic question with the calculator tool; 1.0 if the answer is right."""
    client = _client(llm)
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task["question"]},
    ]
    for _ in range(MAX_TURNS):
        response = client.chat.completions.create(
            model=llm.model,
            messages=messages,
            tools=[cast(ChatCompletionToolParam, CALCULATOR_TOOL)],
            temperature=llm.sampling.get("temperature", 1.0),
            max_tokens=llm.sampling.get("max_tokens", MAX_TOKENS),
        )
        message = response.choices[0].message
        calls = [c for c in message.tool_calls or [] if c.type == "function"]
        if not calls:
            return 1.0 if check_answer(message.content or "", task["answer"]) else 0.0
        messages.append(
            {
                "role": "assistant",
                "content": message.content,
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": c.function.arguments},
                    }
                    for c in calls
                ],
            }
        )
        for call in calls:
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (ValueError, AttributeError):
                expression = ""
            messages.append({"role": "tool", "tool_call_id": call.id, "content": run_calculator(str(expression))})
    return 0.0  # ran out of turns without a final answer


def train_tasks(n: int = 2000, seed: int = 0) -> list[dict[str, Any]]:
    return generate_problems(n, seed, "train")


def val_tasks(n: int = 64, seed: int = 0) -> list[dict[str, Any]]:
    return generate_problems(n, seed, "val")

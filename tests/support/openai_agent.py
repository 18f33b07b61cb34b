"""The calculator agent written with the plain openai client (runs under openai 2.x and 3.x)."""

from __future__ import annotations

import json
from typing import Any

import openai
from capture_check import MAX_TOKENS, calculator

from agentgrad.demo.calc import CALCULATOR_TOOL, SYSTEM_PROMPT
from agentgrad.types import LLM


def _tool_result(call: Any) -> str:
    try:
        return calculator(json.loads(call.function.arguments).get("expression", ""))
    except (ValueError, AttributeError) as exc:
        return f"error: {exc}"


def openai_agent(task: dict, llm: LLM) -> float:
    """A tool loop with the sync client, as in the OpenAI cookbook."""
    client = openai.OpenAI(base_url=llm.endpoint, api_key="sk-none")
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task["question"]},
    ]
    for _ in range(3):
        reply = client.chat.completions.create(
            model=llm.model, messages=messages, tools=[CALCULATOR_TOOL], max_tokens=MAX_TOKENS
        )
        message = reply.choices[0].message
        if not message.tool_calls:
            return 1.0
        messages.append(message.model_dump(exclude_none=True))
        messages += [{"role": "tool", "tool_call_id": c.id, "content": _tool_result(c)} for c in message.tool_calls]
    return 0.0


async def openai_streaming_agent(task: dict, llm: LLM) -> float:
    """The same loop with the async client, streamed, accumulating tool-call deltas by hand."""
    client = openai.AsyncOpenAI(base_url=llm.endpoint, api_key="sk-none")
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task["question"]},
    ]
    for _ in range(3):
        stream = await client.chat.completions.create(
            model=llm.model, messages=messages, tools=[CALCULATOR_TOOL], max_tokens=MAX_TOKENS, stream=True
        )
        text, calls = "", {}
        async for chunk in stream:
            delta = chunk.choices[0].delta if chunk.choices else None
            text += (delta.content or "") if delta else ""
            for call in (delta.tool_calls or []) if delta else []:
                entry = calls.setdefault(
                    call.index, {"id": call.id, "type": "function", "function": {"name": "", "arguments": ""}}
                )
                entry["function"]["name"] += call.function.name or ""
                entry["function"]["arguments"] += call.function.arguments or ""
        if not calls:
            return 1.0
        messages.append({"role": "assistant", "content": text or None, "tool_calls": list(calls.values())})
        for call in calls.values():
            try:
                result = calculator(json.loads(call["function"]["arguments"]).get("expression", ""))
            except (ValueError, AttributeError) as exc:
                result = f"error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return 0.0

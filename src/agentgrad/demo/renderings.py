"""The calculator tool as agent frameworks really send it: data for the tiny model's warm-up.

A tiny model sees the ``tools`` of a request as JSON text in its system turn (``tool | tojson``
keeps the framework's key order), so every framework's way of writing the same tool is a
different prompt. Warmed up on the plain client's rendering alone, the model called its tool on
0.125 of questions with the schema keys in LangChain's order instead of 0.44, and never with
AutoGen's. The warm-up therefore draws each conversation's tool, system prompt and tool
description from the renderings below.

Every schema here was captured, not written by hand: ``bench/capture_tool_renderings.py`` runs a
real agent of each framework (LangChain 1.x / LangGraph ``bind_tools`` with ``@tool``, the OpenAI
Agents SDK 0.24 ``function_tool``, AutoGen 0.7 ``AssistantAgent`` + ``FunctionTool``, the openai
client) against a scripted server and prints the chat request the model server sees (the Agents
SDK's Responses request translated to chat as the capture proxy does).
``tests/demo/test_renderings.py`` re-captures them when the frameworks are installed. No
framework is imported here: building the model needs none of them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from agentgrad.demo import calc

_DESCRIPTION = calc.CALCULATOR_TOOL["function"]["description"]
_EXAMPLE = calc.CALCULATOR_TOOL["function"]["parameters"]["properties"]["expression"]["description"]


def _function(parameters: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": "calculator", "description": _DESCRIPTION, "parameters": parameters, **extra},
    }


#: The ``tools`` entry of each framework's calculator (same name, description and argument).
TOOL_SCHEMAS: dict[str, dict[str, Any]] = {
    # the openai client with the demo's hand-written schema
    "plain": calc.CALCULATOR_TOOL,
    # LangChain / LangGraph: ``@tool`` with a one-line docstring, ``ChatOpenAI.bind_tools``
    "langchain": _function(
        {"properties": {"expression": {"type": "string"}}, "required": ["expression"], "type": "object"}
    ),
    # ``@tool(parse_docstring=True)`` with an Args section, or an ``Annotated[str, "..."]`` argument
    "langchain_described": _function(
        {
            "properties": {"expression": {"description": _EXAMPLE, "type": "string"}},
            "required": ["expression"],
            "type": "object",
        }
    ),
    # ``bind_tools([...], strict=True)``
    "langchain_strict": _function(
        {
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
            "type": "object",
            "additionalProperties": False,
        },
        strict=True,
    ),
    # OpenAI Agents SDK ``@function_tool`` with an Args docstring (Responses or chat: the same)
    "agents_sdk": _function(
        {
            "properties": {"expression": {"description": _EXAMPLE, "title": "Expression", "type": "string"}},
            "required": ["expression"],
            "title": "calculator_args",
            "type": "object",
            "additionalProperties": False,
        },
        strict=True,
    ),
    # ``@function_tool`` whose docstring has no Args section
    "agents_sdk_short_doc": _function(
        {
            "properties": {"expression": {"title": "Expression", "type": "string"}},
            "required": ["expression"],
            "title": "calculator_args",
            "type": "object",
            "additionalProperties": False,
        },
        strict=True,
    ),
    # AutoGen ``FunctionTool(fn, description=...)``: the argument's description is its name
    "autogen": _function(
        {
            "type": "object",
            "properties": {"expression": {"description": "expression", "title": "Expression", "type": "string"}},
            "required": ["expression"],
            "additionalProperties": False,
        },
        strict=False,
    ),
}

#: AutoGen ``AssistantAgent``'s system message when the user gives none.
AUTOGEN_DEFAULT_SYSTEM = (
    "You are a helpful AI assistant. Solve tasks using your tools. "
    "Reply with TERMINATE when the task has been completed."
)

#: System prompts the warm-up draws from. None: no system message (LangGraph's
#: ``create_react_agent`` without ``prompt``, an Agents SDK agent without ``instructions``), so the
#: chat template writes its default. The others: the demo's, AutoGen's default, and two a user
#: writes for their own agent (the ones the capture script's LangGraph and Agents SDK agents use).
SYSTEM_PROMPTS: tuple[str | None, ...] = (
    calc.SYSTEM_PROMPT,
    None,
    AUTOGEN_DEFAULT_SYSTEM,
    "You are a helpful math assistant. Use the calculator tool.",
    "You solve arithmetic questions with the calculator.",
)

#: Tool descriptions a user may write for the same calculator (the warm-up swaps them in).
DESCRIPTIONS: tuple[str, ...] = (
    _DESCRIPTION,
    "Evaluate a math expression.",
    "Calculate the result of an arithmetic expression.",
    "A calculator. Input: an arithmetic expression, output: its value.",
)


def with_description(tool: dict[str, Any], description: str) -> dict[str, Any]:
    """``tool`` with another description, in the same place of the JSON."""
    out = copy.deepcopy(tool)
    out["function"]["description"] = description
    return out


@dataclass(frozen=True)
class Rendering:
    """How one agent presents the calculator task to the model: the ``tools`` entry, the system
    prompt (None: no system message), whether the answer turn still carries the tools (AutoGen's
    reflection call sends none), and whether the framework's answer is the tool's result itself
    (AutoGen without reflection returns it as the final message)."""

    tool: dict[str, Any]
    system: str | None
    answer_tools: bool = True
    answer_is_tool_result: bool = False


#: The agents the capture script runs, as the model sees them: each is measured by
#: ``bench/bench_tool_renderings.py``.
FRAMEWORKS: dict[str, Rendering] = {
    "plain": Rendering(TOOL_SCHEMAS["plain"], calc.SYSTEM_PROMPT),
    "langgraph": Rendering(TOOL_SCHEMAS["langchain"], SYSTEM_PROMPTS[3]),
    "langchain_docstring": Rendering(TOOL_SCHEMAS["langchain_described"], calc.SYSTEM_PROMPT),
    "langgraph_react": Rendering(TOOL_SCHEMAS["langchain_described"], None),
    "langchain_strict": Rendering(TOOL_SCHEMAS["langchain_strict"], calc.SYSTEM_PROMPT),
    "agents_sdk": Rendering(TOOL_SCHEMAS["agents_sdk"], SYSTEM_PROMPTS[4]),
    "agents_sdk_chat": Rendering(TOOL_SCHEMAS["agents_sdk"], None),
    "agents_sdk_short_doc": Rendering(TOOL_SCHEMAS["agents_sdk_short_doc"], calc.SYSTEM_PROMPT),
    "autogen": Rendering(TOOL_SCHEMAS["autogen"], calc.SYSTEM_PROMPT, answer_tools=False),
    "autogen_default": Rendering(TOOL_SCHEMAS["autogen"], AUTOGEN_DEFAULT_SYSTEM, answer_is_tool_result=True),
}

#: Renderings the warm-up never sees (a system prompt and a description of their own), to measure
#: how far the model generalises beyond the captured ones.
HELD_OUT: dict[str, Rendering] = {
    "unseen_prompt": Rendering(
        TOOL_SCHEMAS["langchain"], "You are a math tutor. Always use the calculator for arithmetic."
    ),
    "unseen_description": Rendering(
        with_description(TOOL_SCHEMAS["langchain"], "Useful for when you need to answer questions about math."),
        calc.SYSTEM_PROMPT,
    ),
}

#: The demo's own rendering (what ``agentgrad demo`` and the build's validation use).
PLAIN = FRAMEWORKS["plain"]

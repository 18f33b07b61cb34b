"""Capture, for real, what each agent framework sends for the calculator tool.

Each framework's agent is written as its users write it (a `calculator(expression: str) -> str`
tool with the description of ``calc.CALCULATOR_TOOL``) and pointed at a scripted OpenAI-compatible
server on 127.0.0.1 that logs every request: the first call gets back a tool call, the second
the final answer. The Agents SDK's default Responses request is translated to chat exactly as
the capture proxy does (``proxy.responses.to_chat_request``), since the chat template sees the
translated ``tools``. Prints JSON: per framework, every request's ``tools`` and message roles /
system prompts. ``src/agentgrad/demo/renderings.py`` holds the result as data (no framework is
imported when the tiny model is built); ``tests/demo/test_renderings.py`` re-captures when the
frameworks are installed and checks the data still matches.

    .venv/bin/python bench/capture_tool_renderings.py [--only langchain,autogen,...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Annotated, Any

from agentgrad.demo import calc
from agentgrad.proxy.responses import to_chat_request

DESCRIPTION = calc.CALCULATOR_TOOL["function"]["description"]
QUESTION = "What is 12 + 7?"
ARGUMENTS = json.dumps({"expression": "12 + 7"})


def _chat_reply(body: dict[str, Any]) -> dict[str, Any]:
    answered = any(m.get("role") == "tool" for m in body.get("messages", []))
    message: dict[str, Any] = {"role": "assistant", "content": "The answer is 19." if answered else None}
    if not answered:
        message["tool_calls"] = [
            {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": ARGUMENTS}}
        ]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "m"),
        "choices": [{"index": 0, "message": message, "finish_reason": "stop" if answered else "tool_calls"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def _responses_reply(body: dict[str, Any]) -> dict[str, Any]:
    items = body.get("input") if isinstance(body.get("input"), list) else []
    answered = any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in items)
    if answered:
        output: dict[str, Any] = {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "The answer is 19.", "annotations": []}],
        }
    else:
        output = {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "calculator",
            "arguments": ARGUMENTS,
            "status": "completed",
        }
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": int(time.time()),
        "model": body.get("model", "m"),
        "status": "completed",
        "output": [output],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 1,
            "output_tokens": 1,
            "total_tokens": 2,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


@contextmanager
def recording_server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """(base URL, list the requests are appended to: path and JSON body)."""
    log: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            log.append({"path": self.path, "body": body})
            reply = _responses_reply(body) if self.path.endswith("/responses") else _chat_reply(body)
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", log
    finally:
        server.shutdown()
        server.server_close()


# ---- the agents, as each framework's users write them -------------------------------------------


def plain_client(base_url: str) -> None:
    """The demo's agent: the openai client with ``calc.CALCULATOR_TOOL`` and ``calc.SYSTEM_PROMPT``."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="x", max_retries=0)
    messages: list[Any] = [{"role": "system", "content": calc.SYSTEM_PROMPT}, {"role": "user", "content": QUESTION}]
    reply = client.chat.completions.create(model="m", messages=messages, tools=[calc.CALCULATOR_TOOL])
    call = reply.choices[0].message.tool_calls[0]
    messages += [reply.choices[0].message.model_dump(exclude_none=True)]
    messages += [{"role": "tool", "tool_call_id": call.id, "content": "19"}]
    client.chat.completions.create(model="m", messages=messages, tools=[calc.CALCULATOR_TOOL])


def _langgraph_run(base_url: str, tool_obj: Any, prompt: str | None, strict: bool | None = None) -> None:
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    llm = ChatOpenAI(model="m", base_url=base_url, api_key="x", max_retries=0).bind_tools([tool_obj], strict=strict)

    def agent(state: MessagesState) -> dict[str, Any]:
        system = [SystemMessage(prompt)] if prompt else []
        return {"messages": [llm.invoke(system + state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([tool_obj]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    graph.add_edge("agent", END)
    graph.compile().invoke({"messages": [HumanMessage(QUESTION)]})


def langgraph_tool(base_url: str) -> None:
    """LangGraph StateGraph + ``ChatOpenAI.bind_tools`` with a plain ``@tool`` (docstring only)."""
    from langchain_core.tools import tool

    @tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression with + - * / and parentheses."""
        return calc.run_calculator(expression)

    _langgraph_run(base_url, calculator, "You are a helpful math assistant. Use the calculator tool.")


def langchain_tool_docstring(base_url: str) -> None:
    """``@tool(parse_docstring=True)`` with a Google-style Args section (parameter description)."""
    from langchain_core.tools import tool

    @tool(parse_docstring=True)
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression with + - * / and parentheses.

        Args:
            expression: e.g. 37 * 12 + 5
        """
        return calc.run_calculator(expression)

    _langgraph_run(base_url, calculator, calc.SYSTEM_PROMPT)


def langchain_react_agent(base_url: str) -> None:
    """``langgraph.prebuilt.create_react_agent`` with an ``Annotated`` parameter description."""
    import warnings

    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    @tool
    def calculator(expression: Annotated[str, "e.g. 37 * 12 + 5"]) -> str:
        """Evaluate an arithmetic expression with + - * / and parentheses."""
        return calc.run_calculator(expression)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        agent = create_react_agent(
            ChatOpenAI(model="m", base_url=base_url, api_key="x", max_retries=0), [calculator], prompt=None
        )
    agent.invoke({"messages": [{"role": "user", "content": QUESTION}]})


def _agents_sdk_run(base_url: str, chat_mode: bool, instructions: str | None, args_doc: bool = True) -> None:
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression with + - * / and parentheses.

        Args:
            expression: e.g. 37 * 12 + 5
        """
        return calc.run_calculator(expression)

    if not args_doc:
        calculator.__doc__ = DESCRIPTION
    calculator = function_tool(calculator)
    client = AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
    model_class = OpenAIChatCompletionsModel if chat_mode else OpenAIResponsesModel
    agent = Agent(
        name="calc",
        instructions=instructions,
        tools=[calculator],
        model=model_class(model="m", openai_client=client),
    )
    asyncio.run(Runner.run(agent, QUESTION))


def agents_sdk_responses(base_url: str) -> None:
    """Agents SDK ``function_tool``, its default Responses API (the proxy translates it to chat)."""
    _agents_sdk_run(base_url, chat_mode=False, instructions="You solve arithmetic questions with the calculator.")


def agents_sdk_chat(base_url: str) -> None:
    """Agents SDK ``function_tool`` over Chat Completions (``OpenAIChatCompletionsModel``), no instructions."""
    _agents_sdk_run(base_url, chat_mode=True, instructions=None)


def agents_sdk_short_doc(base_url: str) -> None:
    """Agents SDK ``function_tool`` whose docstring has no Args section (no parameter description)."""
    _agents_sdk_run(base_url, chat_mode=False, instructions=calc.SYSTEM_PROMPT, args_doc=False)


def langchain_strict(base_url: str) -> None:
    """LangGraph StateGraph + ``bind_tools([calculator], strict=True)`` with a plain ``@tool``."""
    from langchain_core.tools import tool

    @tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression with + - * / and parentheses."""
        return calc.run_calculator(expression)

    _langgraph_run(base_url, calculator, calc.SYSTEM_PROMPT, strict=True)


def _autogen_run(base_url: str, system_message: str | None, reflect: bool) -> None:
    from autogen_agentchat.agents import AssistantAgent
    from autogen_core.models import ModelFamily, ModelInfo
    from autogen_core.tools import FunctionTool
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    info = ModelInfo(
        vision=False, function_calling=True, json_output=False, family=ModelFamily.UNKNOWN, structured_output=False
    )
    tool_obj = FunctionTool(calc.run_calculator, name="calculator", description=DESCRIPTION)

    async def main() -> None:
        client = OpenAIChatCompletionClient(model="m", base_url=base_url, api_key="x", model_info=info, max_retries=0)
        extra = {} if system_message is None else {"system_message": system_message}
        agent = AssistantAgent("calc", model_client=client, tools=[tool_obj], reflect_on_tool_use=reflect, **extra)
        try:
            await agent.run(task=QUESTION)
        finally:
            await client.close()

    asyncio.run(main())


def autogen(base_url: str) -> None:
    """examples/math: ``AssistantAgent`` + ``FunctionTool(run_calculator)``, ``reflect_on_tool_use=True``."""
    _autogen_run(base_url, calc.SYSTEM_PROMPT, reflect=True)


def autogen_default(base_url: str) -> None:
    """``AssistantAgent`` with AutoGen's default system message and no reflection."""
    _autogen_run(base_url, None, reflect=False)


AGENTS: dict[str, Callable[[str], None]] = {
    "plain": plain_client,
    "langgraph": langgraph_tool,
    "langchain_docstring": langchain_tool_docstring,
    "langgraph_react": langchain_react_agent,
    "langchain_strict": langchain_strict,
    "agents_sdk": agents_sdk_responses,
    "agents_sdk_chat": agents_sdk_chat,
    "agents_sdk_short_doc": agents_sdk_short_doc,
    "autogen": autogen,
    "autogen_default": autogen_default,
}


def chat_view(request: dict[str, Any]) -> dict[str, Any]:
    """A logged request as the chat request the model server sees."""
    body = to_chat_request(request["body"]) if request["path"].endswith("/responses") else request["body"]
    return body


def capture(name: str) -> list[dict[str, Any]]:
    """The chat requests agent ``name`` sends for one question (tools, messages)."""
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    with recording_server() as (url, log):
        AGENTS[name](url)
    return [chat_view(r) for r in log]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=",".join(AGENTS), help="comma-separated agents")
    args = parser.parse_args()
    out = {}
    for name in args.only.split(","):
        requests = capture(name)
        out[name] = [
            {
                "tools": r.get("tools"),
                "tool_choice": r.get("tool_choice"),
                "messages": r["messages"],
            }
            for r in requests
        ]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

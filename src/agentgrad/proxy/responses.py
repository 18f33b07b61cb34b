"""The OpenAI Responses API on top of a chat-only upstream (our engine, vLLM).

The Agents SDK speaks Responses by default, LangChain and CrewAI can opt in, but the engines that
return token ids speak Chat Completions. The proxy therefore translates the request to chat, and
the chat answer — whole or streamed — back into a Response object or Response stream events.
Only what agents use is translated: messages, function tools, ``function_call`` and
``function_call_output`` items, sampling parameters and JSON output formats. Anything that needs
server-side state (``previous_response_id``) or hosted tools is refused with a 400 naming it,
rather than silently dropped.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from agentgrad.http.openai_errors import OpenAIError

#: Responses request fields copied to the chat request under the same name.
_SAME_NAME = ("temperature", "top_p", "parallel_tool_calls", "stream", "seed", "stop", "user")


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text_of(content: Any, field: str) -> str | list[dict[str, Any]]:
    """A Responses content value as chat content: a string, or chat parts when there are images."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise OpenAIError(f"{field} must be a string or a list of content parts", param=field)
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text", "refusal"):
            parts.append({"type": "text", "text": part.get("text", part.get("refusal", ""))})
        elif kind == "input_image":
            parts.append({"type": "image_url", "image_url": {"url": part.get("image_url", "")}})
        else:
            raise OpenAIError(f"unsupported content part type {kind!r}", param=f"{field}[{index}].type")
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    if not isinstance(items, list):
        raise OpenAIError("'input' must be a string or a list of items", param="input")
    for index, item in enumerate(items):
        field = f"input[{index}]"
        if not isinstance(item, dict):
            raise OpenAIError(f"{field} must be an object", param=field)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise OpenAIError(f"{field}.role must be user, assistant, system or developer", param=f"{field}.role")
            messages.append(
                {
                    "role": "system" if role == "developer" else role,
                    "content": _text_of(item.get("content", ""), f"{field}.content"),
                }
            )
        elif kind == "function_call":
            call = {
                "id": item.get("call_id") or item.get("id") or _new_id("call"),
                "type": "function",
                "function": {"name": item.get("name", ""), "arguments": item.get("arguments", "")},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and isinstance(last.get("content"), (str, type(None))):
                last.setdefault("tool_calls", []).append(call)  # one assistant turn, several calls
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output", "")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id", ""),
                    "content": output if isinstance(output, str) else _text_of(output, f"{field}.output"),
                }
            )
        elif kind == "reasoning":
            continue  # chat models have no reasoning items to replay
        else:
            raise OpenAIError(f"unsupported input item type {kind!r}", param=f"{field}.type")
    return messages


def _chat_tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise OpenAIError("'tools' must be a list", param="tools")
    converted = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise OpenAIError(
                f"only function tools can be served by a chat upstream, got {kind!r}", param=f"tools[{index}].type"
            )
        function = {"name": tool.get("name", "")}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        converted.append({"type": "function", "function": function})
    return converted


def _chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name", "")}}
    return choice


def _chat_response_format(text: Any) -> dict[str, Any] | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt["type"] == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    return {"type": fmt["type"]}


def to_chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses request as the equivalent Chat Completions request."""
    if body.get("previous_response_id"):
        raise OpenAIError(
            "previous_response_id needs server-side conversation state, which the proxy does not "
            "keep: send the full input instead",
            param="previous_response_id",
        )
    if "input" not in body:
        raise OpenAIError("missing required field 'input'", param="input")
    chat: dict[str, Any] = {"model": body.get("model"), "messages": _chat_messages(body)}
    for key in _SAME_NAME:
        if body.get(key) is not None:
            chat[key] = body[key]
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if body.get("tools"):
        chat["tools"] = _chat_tools(body["tools"])
        if body.get("tool_choice") is not None:
            chat["tool_choice"] = _chat_tool_choice(body["tool_choice"])
    response_format = _chat_response_format(body.get("text"))
    if response_format:
        chat["response_format"] = response_format
    return chat


# ---- chat answer → Response ------------------------------------------------------------------


def _usage(chat_usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not chat_usage:
        return None
    prompt, completion = chat_usage.get("prompt_tokens", 0), chat_usage.get("completion_tokens", 0)
    return {
        "input_tokens": prompt,
        "output_tokens": completion,
        "total_tokens": chat_usage.get("total_tokens", prompt + completion),
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _function_item(item_id: str, call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    function = call.get("function") or {}
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call.get("id") or item_id,
        "name": function.get("name", ""),
        "arguments": function.get("arguments", "") if status == "completed" else "",
        "status": status,
    }


def _response_shell(request: dict[str, Any], response_id: str, created: float) -> dict[str, Any]:
    """The fields of a Response object that echo the request (the SDKs read several of them)."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": "in_progress",
        "model": request.get("model"),
        "output": [],
        "usage": None,
        "error": None,
        "incomplete_details": None,
        "instructions": request.get("instructions"),
        "metadata": request.get("metadata") or {},
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "temperature": request.get("temperature"),
        "top_p": request.get("top_p"),
        "max_output_tokens": request.get("max_output_tokens"),
        "previous_response_id": None,
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "text": request.get("text") or {"format": {"type": "text"}},
        "truncation": "disabled",
        "reasoning": None,
        "store": False,
    }


def _status_of(finish_reason: str | None) -> tuple[str, dict[str, Any] | None]:
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None


def from_chat_completion(
    request: dict[str, Any],
    completion: dict[str, Any],
    response_id: str | None = None,
    item_ids: list[str] | None = None,
) -> dict[str, Any]:
    """A (non-streamed, or reassembled) chat completion as a Response object.

    ``item_ids`` lets a stream's final ``response.completed`` reuse the ids its deltas announced.
    """
    response = _response_shell(request, response_id or _new_id("resp"), completion.get("created") or time.time())
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    ids = iter(item_ids or [])
    output: list[dict[str, Any]] = []
    if message.get("content"):
        output.append(_message_item(next(ids, None) or _new_id("msg"), message["content"]))
    for call in message.get("tool_calls") or []:
        output.append(_function_item(next(ids, None) or _new_id("fc"), call))
    status, incomplete = _status_of(choice.get("finish_reason"))
    response.update(
        status=status,
        incomplete_details=incomplete,
        output=output,
        model=completion.get("model"),
        usage=_usage(completion.get("usage")),
    )
    return response


class ResponsesStreamWriter:
    """Chat completion chunks in, Responses stream events (SSE bytes) out, delta by delta.

    Text deltas go to one message item, each tool call to its own function_call item; items are
    opened when their first delta arrives, so time to first token is kept.
    """

    def __init__(self, request: dict[str, Any]) -> None:
        self.request = request
        self.response_id = _new_id("resp")
        self.created = time.time()
        self._sequence = 0
        self._items: list[dict[str, Any]] = []  # in output order: {"kind", "id", "index", "text"|"call"}
        self._message: dict[str, Any] | None = None
        self._calls: dict[int, dict[str, Any]] = {}

    def _event(self, kind: str, **payload: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._sequence, **payload}
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + json.dumps(payload).encode() + b"\n\n"

    def start(self) -> bytes:
        shell = _response_shell(self.request, self.response_id, self.created)
        return self._event("response.created", response=shell) + self._event("response.in_progress", response=shell)

    def chunk(self, chunk: dict[str, Any]) -> bytes:
        out = b""
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out += self._text_delta(delta["content"])
            for call in delta.get("tool_calls") or []:
                out += self._call_delta(call)
        return out

    def _text_delta(self, text: str) -> bytes:
        out = b""
        if self._message is None:
            self._message = {"kind": "message", "id": _new_id("msg"), "index": len(self._items), "text": ""}
            self._items.append(self._message)
            m = self._message
            out += self._event(
                "response.output_item.added", output_index=m["index"], item=_message_item(m["id"], "", "in_progress")
            )
            out += self._event(
                "response.content_part.added",
                item_id=m["id"],
                output_index=m["index"],
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": []},
            )
        m = self._message
        m["text"] += text
        return out + self._event(
            "response.output_text.delta",
            item_id=m["id"],
            output_index=m["index"],
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def _call_delta(self, delta: dict[str, Any]) -> bytes:
        out = b""
        key = delta.get("index", 0)
        entry = self._calls.get(key)
        function = delta.get("function") or {}
        if entry is None:
            call = {"id": delta.get("id"), "function": {"name": function.get("name") or "", "arguments": ""}}
            entry = {"kind": "function_call", "id": _new_id("fc"), "index": len(self._items), "call": call}
            self._calls[key] = entry
            self._items.append(entry)
            out += self._event(
                "response.output_item.added",
                output_index=entry["index"],
                item=_function_item(entry["id"], call, "in_progress"),
            )
        arguments = function.get("arguments")
        if arguments:
            entry["call"]["function"]["arguments"] += arguments
            out += self._event(
                "response.function_call_arguments.delta",
                item_id=entry["id"],
                output_index=entry["index"],
                delta=arguments,
            )
        return out

    def finish(self, completion: dict[str, Any]) -> bytes:
        """Close every open item and send ``response.completed`` built from the whole completion."""
        out = b""
        for entry in self._items:
            if entry["kind"] == "message":
                part = {"type": "output_text", "text": entry["text"], "annotations": []}
                out += self._event(
                    "response.output_text.done",
                    item_id=entry["id"],
                    output_index=entry["index"],
                    content_index=0,
                    text=entry["text"],
                    logprobs=[],
                )
                out += self._event(
                    "response.content_part.done",
                    item_id=entry["id"],
                    output_index=entry["index"],
                    content_index=0,
                    part=part,
                )
                item = _message_item(entry["id"], entry["text"])
            else:
                item = _function_item(entry["id"], entry["call"])
                out += self._event(
                    "response.function_call_arguments.done",
                    item_id=entry["id"],
                    output_index=entry["index"],
                    arguments=item["arguments"],
                )
            out += self._event("response.output_item.done", output_index=entry["index"], item=item)
        response = self.final_response(completion)
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        return out + self._event(kind, response=response)

    def final_response(self, completion: dict[str, Any]) -> dict[str, Any]:
        """The Response object the stream describes (what the client ends up with)."""
        ordered = [e for e in self._items if e["kind"] == "message"] + [
            e for e in self._items if e["kind"] != "message"
        ]
        return from_chat_completion(self.request, completion, self.response_id, [e["id"] for e in ordered])

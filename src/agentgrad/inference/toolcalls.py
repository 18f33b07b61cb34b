"""Qwen/Hermes ``<tool_call>{json}</tool_call>`` parsing into OpenAI ``tool_calls``.

Malformed tool-call JSON is never repaired: the whole completion is then returned as plain text
content, so the policy sees its own mistake and training can learn from it.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Split ``text`` into (content, tool_calls).

    Every ``<tool_call>`` block must hold a JSON object with a string ``name`` and an object
    ``arguments``; otherwise (or when a block is left unclosed) nothing is parsed and the full
    text is returned as content with no tool calls. ``content`` is the text outside the blocks,
    stripped, or None when empty.
    """
    if TOOL_CALL_OPEN not in text:
        return text, []
    calls: list[dict[str, Any]] = []
    for match in _BLOCK.finditer(text):
        try:
            payload = json.loads(match.group(1))
        except ValueError:
            return text, []
        if (
            not isinstance(payload, dict)
            or not isinstance(payload.get("name"), str)
            or not isinstance(payload.get("arguments", {}), dict)
        ):
            return text, []
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": payload["name"],
                    "arguments": json.dumps(payload.get("arguments", {}), ensure_ascii=False),
                },
            }
        )
    rest = _BLOCK.sub("", text)
    if TOOL_CALL_OPEN in rest or TOOL_CALL_CLOSE in rest:
        return text, []
    content = rest.strip() or None
    return content, calls

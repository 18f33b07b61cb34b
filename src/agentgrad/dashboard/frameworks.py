"""Spans other frameworks write, read for display: OpenInference (``openinference.span.kind``,
``input.value``/``output.value``, ``llm.input_messages.<i>.message.*``,
``llm.output_messages.<i>.message.*``) and the older OpenTelemetry GenAI convention
(``gen_ai.prompt.<i>.*``, ``gen_ai.completion.<i>.*``).

Attributes arrive flat (OTLP), so a message list is rebuilt from its indexed keys.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

#: (prefix of a message list, the infix before each message's fields)
_MESSAGE_LISTS = {
    "input": (("llm.input_messages.", "message."), ("gen_ai.prompt.", "")),
    "output": (("llm.output_messages.", "message."), ("gen_ai.completion.", "")),
}
_INDEXED = re.compile(r"^(\d+)\.(.+)$")


@dataclass
class FrameworkMessage:
    role: str
    content: str
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments)


@dataclass
class FrameworkIO:
    """What a framework span carried: its kind, model or tool, inputs and outputs."""

    kind: str
    name: str | None
    inputs: list[FrameworkMessage]
    outputs: list[FrameworkMessage]
    input_value: str | None
    output_value: str | None

    @property
    def summary(self) -> str:
        """One line for the span tree: the last output, else the input."""
        text = (
            (self.outputs[-1].content if self.outputs else None)
            or self.output_value
            or (self.inputs[-1].content if self.inputs else None)
            or self.input_value
            or ""
        )
        text = " ".join(text.split())
        return text if len(text) <= 160 else text[:159] + "…"


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, indent=2)


def _messages(attrs: dict[str, Any], prefix: str, infix: str) -> list[FrameworkMessage]:
    fields: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        if not key.startswith(prefix):
            continue
        match = _INDEXED.match(key[len(prefix) :])
        if match is None:
            continue
        rest = match[2].removeprefix(infix)
        fields.setdefault(int(match[1]), {})[rest] = value
    out = []
    for _, item in sorted(fields.items()):
        calls: dict[int, dict[str, str]] = {}
        for key, value in item.items():
            tool = re.match(r"^tool_calls\.(\d+)\.(?:tool_call\.)?function\.(name|arguments)$", key)
            if tool:
                calls.setdefault(int(tool[1]), {})[tool[2]] = _text(value)
        content = item.get("content")
        if content is None and any(k.startswith("contents.") for k in item):
            content = "\n".join(_text(v) for k, v in sorted(item.items()) if k.endswith(".message_content.text"))
        out.append(
            FrameworkMessage(
                str(item.get("role", "?")),
                _text(content),
                [(c.get("name", "?"), c.get("arguments", "")) for _, c in sorted(calls.items())],
            )
        )
    return out


def framework_io(attrs: dict[str, Any]) -> FrameworkIO | None:
    """The inputs and outputs a framework span recorded, or None when it follows neither convention."""
    inputs = next((m for p, i in _MESSAGE_LISTS["input"] if (m := _messages(attrs, p, i))), [])
    outputs = next((m for p, i in _MESSAGE_LISTS["output"] if (m := _messages(attrs, p, i))), [])
    input_value, output_value = attrs.get("input.value"), attrs.get("output.value")
    kind = attrs.get("openinference.span.kind")
    if kind is None and not (inputs or outputs or input_value is not None or output_value is not None):
        return None
    name = attrs.get("llm.model_name") or attrs.get("gen_ai.request.model") or attrs.get("tool.name")
    return FrameworkIO(
        str(kind or ("LLM" if inputs or outputs else "span")),
        str(name) if name else None,
        inputs,
        outputs,
        None if input_value is None else _text(input_value),
        None if output_value is None else _text(output_value),
    )

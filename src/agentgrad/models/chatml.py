"""The ChatML chat template with a tool-calling section, in the Qwen2.5 / Hermes format.

One template for every ChatML model AgentGrad serves (the embedded tiny model, an imported
SmolLM2): tools in the system turn, ``<tool_call>{json}</tool_call>`` in assistant turns (the
format ``inference/toolcalls.py`` parses), tool results as ``<tool_response>`` inside a user
turn. It renders exactly like Qwen2.5's own template, so code tested against one model behaves
the same with a real Qwen2.5 checkpoint. One deliberate difference: a tool call whose
``arguments`` is a string is rendered verbatim (Qwen's template would JSON-quote it), so a
model's malformed arguments round-trip unchanged.
"""

from __future__ import annotations

#: The system prompt of a conversation that brings none (Qwen2.5's).
DEFAULT_SYSTEM = "You are a helpful assistant."


def chatml_tool_template(default_system: str = DEFAULT_SYSTEM) -> str:
    """The template, with ``default_system`` as the system turn of a conversation without one
    (a model keeps the default it was tuned with)."""
    system = default_system.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
    return (
        "{%- if tools %}"
        "{{- '<|im_start|>system\\n' }}"
        "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
        "{%- else %}{{- '" + system + "' }}{%- endif %}"
        '{{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'
        'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}'
        '{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}'
        '{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and '
        'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": '
        '<function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}'
        "{%- else %}"
        "{%- if messages[0]['role'] == 'system' %}"
        "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
        "{%- else %}{{- '<|im_start|>system\\n" + system + "<|im_end|>\\n' }}{%- endif %}"
        "{%- endif %}"
        "{%- for message in messages %}"
        "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) "
        "or (message.role == 'assistant' and not message.tool_calls) %}"
        "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>' + '\\n' }}"
        "{%- elif message.role == 'assistant' %}"
        "{{- '<|im_start|>' + message.role }}"
        "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
        "{%- for tool_call in message.tool_calls %}"
        "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
        '{{- \'\\n<tool_call>\\n{"name": "\' }}{{- tool_call.name }}{{- \'", "arguments": \' }}'
        "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
        "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
        "{{- '}\\n</tool_call>' }}"
        "{%- endfor %}"
        "{{- '<|im_end|>\\n' }}"
        "{%- elif message.role == 'tool' %}"
        "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}"
        "{{- '<|im_start|>user' }}{%- endif %}"
        "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
        "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
        "{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )


#: The template with Qwen2.5's default system prompt (the tiny model's).
CHAT_TEMPLATE = chatml_tool_template()

__all__ = ["CHAT_TEMPLATE", "DEFAULT_SYSTEM", "chatml_tool_template"]

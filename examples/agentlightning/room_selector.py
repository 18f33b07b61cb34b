"""A room-selector agent in the style of Agent Lightning 0.x's ``examples/apo``, run by AgentGrad.

The prompt template (a resource, tuned by APO) turns a meeting request into the user message; the
model may call ``get_rooms_and_availability`` and then names a room. The reference grades with an
LLM judge; this one compares with the expected room, so the reward is deterministic. The model
is reached with ``OpenAI()``: ``OPENAI_BASE_URL`` points at AgentGrad's capture proxy, which
attributes each call to its rollout from the request headers. Only the import line differs.
"""

from __future__ import annotations

import json
from typing import Any

from openai import OpenAI

# the one line that differs from Agent Lightning's: import agentlightning as agl
from agentgrad.compat import agentlightning as agl

ROOMS = [
    {"id": "Orion", "capacity": 4, "equipment": ["tv"], "booked": [("10:00", 60)]},
    {"id": "Lyra", "capacity": 10, "equipment": ["projector"], "booked": [("11:00", 60)]},
    {"id": "Nova", "capacity": 12, "equipment": ["whiteboard"], "booked": []},
]

TOOL_DEFINITIONS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_rooms_and_availability",
            "description": "Return meeting rooms with capacity, equipment and booked slots.",
            "parameters": {"type": "object", "properties": {"time": {"type": "string"}}, "required": ["time"]},
        },
    }
]


def prompt_template_baseline() -> agl.PromptTemplate:
    return agl.PromptTemplate(
        template="Find a room at {time} for {attendees} people. Needs: {needs}.", engine="f-string"
    )


def get_rooms_and_availability(time: str) -> dict[str, Any]:
    return {"rooms": [{**room, "free": all(start != time for start, _ in room["booked"])} for room in ROOMS]}


def grade(final_message: str | None, expected_choice: str) -> float:
    return 1.0 if final_message and expected_choice.lower() in final_message.lower() else 0.0


@agl.rollout
def room_selector(task: dict[str, Any], prompt_template: agl.PromptTemplate) -> float:
    client = OpenAI()
    model = "gpt-4.1-nano"
    messages: list[Any] = [
        {"role": "system", "content": "You are a scheduling assistant."},
        {"role": "user", "content": prompt_template.format(**task["task_input"])},
    ]
    resp = client.chat.completions.create(
        model=model, messages=messages, tools=TOOL_DEFINITIONS, tool_choice="auto", temperature=0.0, max_tokens=32
    )
    tool_calls = resp.choices[0].message.tool_calls
    final_message = resp.choices[0].message.content
    if tool_calls:
        messages.append(
            {
                "role": "assistant",
                "content": final_message,
                "tool_calls": [
                    {
                        "id": tc.id,
                        "type": "function",
                        "function": {"name": tc.function.name, "arguments": tc.function.arguments},
                    }
                    for tc in tool_calls
                ],
            }
        )
        for tc in tool_calls:
            try:
                output: Any = get_rooms_and_availability(**json.loads(tc.function.arguments))
            except Exception as exc:  # noqa: BLE001 - the model's arguments may not parse
                output = {"error": str(exc)}
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": json.dumps(output)})
        next_resp = client.chat.completions.create(model=model, messages=messages, temperature=0.0, max_tokens=32)
        final_message = next_resp.choices[0].message.content
    return grade(final_message, task["expected_choice"])


TASKS = [
    {"id": "s01", "task_input": {"time": "10:00", "attendees": 3, "needs": "tv"}, "expected_choice": "Nova"},
    {"id": "s02", "task_input": {"time": "11:00", "attendees": 8, "needs": "projector"}, "expected_choice": "Nova"},
    {"id": "s03", "task_input": {"time": "09:00", "attendees": 3, "needs": "tv"}, "expected_choice": "Orion"},
    {"id": "s04", "task_input": {"time": "14:00", "attendees": 9, "needs": "projector"}, "expected_choice": "Lyra"},
]

"""Spans → LLM calls: the captured calls of one attempt, in order, with their agent names.

An LLM call span (``SPAN_LLM_CALL``, written by the capture proxy) carries the exact prompt and
completion token ids the engine saw and sampled. This module only *reads* them: a call without
token ids is reported, never re-tokenized (docs/architecture.md, "Rules of the road"), because
re-tokenized text is not what the policy sampled and silently trains on the wrong tokens.

It is the one reader of such spans: training (adapters, SFT, APO's traces) and the dashboard
both see the same :class:`LLMCall`, so "this call can be trained on" means one thing everywhere
(:attr:`LLMCall.has_token_ids`). Spans may come from any writer (OTLP, a hand-made span), so
reading never raises: an attribute that is present but malformed (token ids that are not all
integers, a bool among them, text that is not JSON) is read as absent and named in
:attr:`LLMCall.problems`, rather than coerced (``int(2.7)`` or ``int(True)`` would train on
tokens nobody sampled).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentgrad import semconv
from agentgrad.adapters.timeline import by_start, done_at
from agentgrad.types import Span

#: The finish reason of a reply the server cut at the request's token limit (``max_tokens``).
CUT_AT_TOKEN_LIMIT = "length"


def content_text(content: Any) -> str | None:
    """A message's content as text: ``""`` for none, a string as it is, a content-part list's parts
    one per line (a part's text, else its refusal, else its type in brackets); None for any other
    shape, which each reader shows its own way."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                parts.append(str(part.get("text") or part.get("refusal") or f"[{part.get('type', 'part')}]"))
            else:
                parts.append(str(part))
        return "\n".join(parts)
    return None


@dataclass
class LLMCall:
    """One captured LLM call of an attempt (``index`` counts all calls of the attempt from 0, in
    the order they started: see :mod:`agentgrad.adapters.timeline`)."""

    rollout_id: str
    attempt_id: str
    index: int
    span_id: str
    sequence_id: int
    #: When the call started and when its answer was complete (the proxy's clock).
    start_time: float
    end_time: float
    agent_name: str | None
    prompt_ids: list[int] | None
    completion_ids: list[int] | None
    logprobs: list[float] | None
    model_version: str | None
    request: dict[str, Any] = field(default_factory=dict)
    response: dict[str, Any] = field(default_factory=dict)
    #: The model that answered (the response's, else the request's), for people reading the call.
    model: str | None = None
    finish_reason: str | None = None
    #: Token counts the upstream reported (``gen_ai.usage.*``); :attr:`prompt_tokens` prefers the ids.
    usage_input_tokens: int | None = None
    usage_output_tokens: int | None = None
    #: Attributes that were present but could not be read (each read as absent), one line each.
    problems: list[str] = field(default_factory=list)

    @property
    def has_token_ids(self) -> bool:
        """Whether this call can be trained on: the one definition of "trainable" for a call.

        It needs the prompt's ids (a call without a prompt has no context to learn in) and the
        completion's (which may be empty: the model stopped at once)."""
        return bool(self.prompt_ids) and self.completion_ids is not None

    @property
    def prompt_tokens(self) -> int | None:
        return len(self.prompt_ids) if self.prompt_ids is not None else self.usage_input_tokens

    @property
    def completion_tokens(self) -> int | None:
        return len(self.completion_ids) if self.completion_ids is not None else self.usage_output_tokens

    # ---- views of the request/response used by credit rules -----------------------------------
    @property
    def assistant_text(self) -> str:
        """The text the model produced (first choice), whatever the API flavour."""
        choices = self.response.get("choices") or []
        if choices:
            choice = choices[0]
            message = choice.get("message") or {}
            return str(message.get("content") or choice.get("text") or "")
        return str(self.response.get("output_text") or "")

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        choices = self.response.get("choices") or []
        message = (choices[0].get("message") or {}) if choices else {}
        return list(message.get("tool_calls") or [])

    @property
    def request_messages(self) -> list[dict[str, Any]]:
        return list(self.request.get("messages") or [])


def _as_dict(value: Any) -> dict[str, Any]:
    """Request/response attributes may be stored as JSON text (OTLP) or as objects."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_list(value: Any, key: str = "", problems: list[str] | None = None) -> list[int] | None:
    """Token ids: a list (or its JSON text) of ints, none of them a bool; anything else is None.

    A malformed list is refused whole, never coerced element by element: a wrong id would train
    the policy on a token it never sampled. Absent (None) is not a problem; malformed is, and
    is appended to ``problems``."""
    if value is None:
        return None
    parsed = _json_list(value)
    if parsed is not None and all(_is_int(v) for v in parsed):
        return parsed
    if problems is not None:
        problems.append(f"{key} is not a list of integers: {_preview(value)}")
    return None


def _float_list(value: Any, key: str = "", problems: list[str] | None = None) -> list[float] | None:
    """Logprobs: a list (or its JSON text) of numbers; a None entry (a token the upstream gave no
    logprob for) reads as NaN, which the trainer treats as unknown. Anything else is None."""
    if value is None:
        return None
    parsed = _json_list(value)
    if parsed is not None and all(
        v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in parsed
    ):
        return [math.nan if v is None else float(v) for v in parsed]
    if problems is not None:
        problems.append(f"{key} is not a list of numbers: {_preview(value)}")
    return None


def _json_list(value: Any) -> list[Any] | None:
    """``value`` itself when a list, or the list its JSON text holds (attributes may be flat text)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, list) else None


def _count(value: Any) -> int | None:
    return value if _is_int(value) and value >= 0 else None


def _preview(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def agent_name_of(span: Span, by_id: dict[str, Span]) -> str | None:
    """The span's own ``AGENT_NAME``, else the name of its nearest ancestor agent scope."""
    name = span.attributes.get(semconv.AGENT_NAME)
    if name:
        return str(name)
    seen: set[str] = set()
    parent_id = span.parent_id
    while parent_id and parent_id not in seen:
        seen.add(parent_id)
        parent = by_id.get(parent_id)
        if parent is None:
            return None
        if parent.name == semconv.SPAN_AGENT and parent.attributes.get(semconv.AGENT_NAME):
            return str(parent.attributes[semconv.AGENT_NAME])
        parent_id = parent.parent_id
    return None


def read_call(span: Span, index: int, by_id: dict[str, Span]) -> LLMCall:
    """One LLM call span as an :class:`LLMCall` (``by_id``: the attempt's spans, for agent names)."""
    attrs = span.attributes
    problems: list[str] = []

    def text(key: str) -> str | None:
        value = attrs.get(key)
        return str(value) if value is not None and value != "" else None

    return LLMCall(
        rollout_id=span.rollout_id,
        attempt_id=span.attempt_id,
        index=index,
        span_id=span.span_id,
        sequence_id=span.sequence_id or 0,
        start_time=span.start_time,
        end_time=done_at(span),
        agent_name=agent_name_of(span, by_id),
        prompt_ids=_int_list(attrs.get(semconv.LLM_PROMPT_TOKEN_IDS), semconv.LLM_PROMPT_TOKEN_IDS, problems),
        completion_ids=_int_list(
            attrs.get(semconv.LLM_COMPLETION_TOKEN_IDS), semconv.LLM_COMPLETION_TOKEN_IDS, problems
        ),
        logprobs=_float_list(attrs.get(semconv.LLM_LOGPROBS), semconv.LLM_LOGPROBS, problems),
        model_version=text(semconv.MODEL_VERSION),
        request=_as_dict(attrs.get(semconv.LLM_REQUEST)),
        response=_as_dict(attrs.get(semconv.LLM_RESPONSE)),
        model=text(semconv.GEN_AI_RESPONSE_MODEL) or text(semconv.GEN_AI_REQUEST_MODEL),
        finish_reason=text(semconv.LLM_FINISH_REASON),
        usage_input_tokens=_count(attrs.get(semconv.GEN_AI_USAGE_INPUT_TOKENS)),
        usage_output_tokens=_count(attrs.get(semconv.GEN_AI_USAGE_OUTPUT_TOKENS)),
        problems=problems,
    )


def extract_calls(spans: Sequence[Span]) -> list[LLMCall]:
    """Every LLM call among ``spans`` (one attempt), in the order the calls started (the store's
    ``sequence_id`` breaks ties): not the order the store received them, which write-behind
    recording shuffles (see :mod:`agentgrad.adapters.timeline`)."""
    by_id = {s.span_id: s for s in spans}
    ordered = sorted((s for s in spans if s.name == semconv.SPAN_LLM_CALL), key=by_start)
    return [read_call(span, index, by_id) for index, span in enumerate(ordered)]


def matches_agent(call: LLMCall, pattern: re.Pattern[str] | None) -> bool:
    """``agent_match`` semantics: no pattern trains every call; else the name must match
    (``re.search``); calls with no agent name never match a pattern."""
    if pattern is None:
        return True
    return call.agent_name is not None and pattern.search(call.agent_name) is not None

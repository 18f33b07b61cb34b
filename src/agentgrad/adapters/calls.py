"""Spans → LLM calls: the captured calls of one attempt, in order, with their agent names.

An LLM call span (``SPAN_LLM_CALL``, written by the capture proxy) carries the exact prompt and
completion token ids the engine saw and sampled. This module only *reads* them: a call without
token ids is reported, never re-tokenized (DESIGN.md §5), because re-tokenized text is not what
the policy sampled and silently trains on the wrong tokens.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentgrad import semconv
from agentgrad.types import Span


@dataclass
class LLMCall:
    """One captured LLM call of an attempt (``index`` counts all calls of the attempt from 0)."""

    rollout_id: str
    attempt_id: str
    index: int
    span_id: str
    sequence_id: int
    agent_name: str | None
    prompt_ids: list[int] | None
    completion_ids: list[int] | None
    logprobs: list[float] | None
    model_version: str | None
    request: dict[str, Any] = field(default_factory=dict)
    response: dict[str, Any] = field(default_factory=dict)

    @property
    def has_token_ids(self) -> bool:
        return bool(self.prompt_ids) and self.completion_ids is not None

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


def _int_list(value: Any) -> list[int] | None:
    if isinstance(value, str):
        value = json.loads(value)
    return [int(v) for v in value] if isinstance(value, list) else None


def _float_list(value: Any) -> list[float] | None:
    if isinstance(value, str):
        value = json.loads(value)
    return [float(v) for v in value] if isinstance(value, list) else None


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


def extract_calls(spans: Sequence[Span]) -> list[LLMCall]:
    """Every LLM call among ``spans`` (one attempt), ordered by the store's ``sequence_id``."""
    by_id = {s.span_id: s for s in spans}
    ordered = sorted((s for s in spans if s.name == semconv.SPAN_LLM_CALL), key=lambda s: s.sequence_id or 0)
    calls = []
    for index, span in enumerate(ordered):
        attrs = span.attributes
        version = attrs.get(semconv.MODEL_VERSION)
        calls.append(LLMCall(
            rollout_id=span.rollout_id, attempt_id=span.attempt_id, index=index, span_id=span.span_id,
            sequence_id=span.sequence_id or 0, agent_name=agent_name_of(span, by_id),
            prompt_ids=_int_list(attrs.get(semconv.LLM_PROMPT_TOKEN_IDS)),
            completion_ids=_int_list(attrs.get(semconv.LLM_COMPLETION_TOKEN_IDS)),
            logprobs=_float_list(attrs.get(semconv.LLM_LOGPROBS)),
            model_version=str(version) if version is not None else None,
            request=_as_dict(attrs.get(semconv.LLM_REQUEST)), response=_as_dict(attrs.get(semconv.LLM_RESPONSE)),
        ))
    return calls


def matches_agent(call: LLMCall, pattern: re.Pattern[str] | None) -> bool:
    """``agent_match`` semantics: no pattern trains every call; else the name must match
    (``re.search``); calls with no agent name never match a pattern."""
    if pattern is None:
        return True
    return call.agent_name is not None and pattern.search(call.agent_name) is not None

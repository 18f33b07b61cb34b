"""What the proxy records about one LLM call, and how it is read out of upstream answers.

The upstream is asked for token ids and logprobs on every call (vLLM-style ``return_token_ids``);
the client sees the answer without what it did not ask for (see :func:`strip_for_client`), and
the store gets one span per completed call with the exact ids the model consumed and produced.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

from agentgrad import semconv
from agentgrad.types import Span

Api = Literal["chat", "responses", "completions"]


@dataclass(frozen=True)
class CallContext:
    """Where a call belongs: from the URL prefix or the headers that ``instrument()`` adds."""

    rollout_id: str
    attempt_id: str
    agent_name: str | None = None
    parent_id: str | None = None
    trace_id: str | None = None


@dataclass(frozen=True)
class Requested:
    """What the client itself asked for, so the proxy can hide what it added on its behalf."""

    token_ids: bool
    logprobs: bool
    usage_chunk: bool

    @classmethod
    def of(cls, body: dict[str, Any]) -> Requested:
        options = body.get("stream_options")
        return cls(
            token_ids=bool(body.get("return_token_ids")),
            logprobs=body.get("logprobs") not in (None, False),
            usage_chunk=isinstance(options, dict) and bool(options.get("include_usage")),
        )


def upstream_body(body: dict[str, Any], api: Api, model: str | None) -> dict[str, Any]:
    """The request sent upstream: the client's, plus token ids, logprobs and streamed usage."""
    out = dict(body)
    if model is not None:
        out["model"] = model
    out["return_token_ids"] = True
    if api == "completions":
        if out.get("logprobs") is None:
            out["logprobs"] = 0  # the sampled token's logprob, no alternatives
    else:
        out["logprobs"] = True
    if out.get("stream"):
        out["stream_options"] = {**(out.get("stream_options") or {}), "include_usage": True}
    return out


def strip_for_client(obj: dict[str, Any], asked: Requested) -> dict[str, Any]:
    """Remove the token ids and logprobs the client did not ask for (in place; returns ``obj``).

    Why strip: the agent must behave exactly as it would against the upstream directly, and
    the stored response must be what the agent saw. The fields are harmless to every parser we
    tested, but some frameworks copy unknown fields into their history or logs.
    """
    if not asked.token_ids:
        obj.pop("prompt_token_ids", None)
    for choice in obj.get("choices") or ():
        if not asked.token_ids:
            choice.pop("token_ids", None)
            choice.pop("prompt_token_ids", None)
        if not asked.logprobs and "logprobs" in choice:
            choice["logprobs"] = None
    return obj


def _choice_logprobs(choice: dict[str, Any]) -> list[float] | None:
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        return None
    if logprobs.get("content") is not None:  # chat
        return [entry.get("logprob") for entry in logprobs["content"]]
    if logprobs.get("token_logprobs") is not None:  # completions
        return list(logprobs["token_logprobs"])
    return None


@dataclass
class Capture:
    """The training-relevant part of an upstream answer, filled from a whole body or chunk by chunk."""

    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    model_version: str | None = None
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    response_model: str | None = None

    @classmethod
    def of_body(cls, body: dict[str, Any]) -> Capture:
        capture = cls()
        capture.absorb_top(body)
        choice = (body.get("choices") or [{}])[0]
        capture.completion_token_ids = choice.get("token_ids")
        capture.prompt_token_ids = capture.prompt_token_ids or choice.get("prompt_token_ids")
        capture.logprobs = _choice_logprobs(choice)
        capture.finish_reason = choice.get("finish_reason")
        return capture

    def absorb_top(self, body: dict[str, Any]) -> None:
        self.prompt_token_ids = body.get("prompt_token_ids") or self.prompt_token_ids
        self.model_version = body.get("model_version") or self.model_version
        self.usage = body.get("usage") or self.usage
        self.response_model = body.get("model") or self.response_model


@dataclass
class StreamAccumulator:
    """Reassembles a streamed chat (or completions) answer into the object the client ended up with.

    Tool-call deltas are merged by index (id and name from the first delta, arguments
    concatenated), as the openai SDK does, so the stored response equals the client's view.
    """

    api: Api
    capture: Capture = field(default_factory=Capture)
    text: str = ""
    role: str = "assistant"
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    first_chunk: dict[str, Any] | None = None

    def add(self, chunk: dict[str, Any]) -> None:
        if self.first_chunk is None:
            self.first_chunk = chunk
        capture = self.capture
        capture.absorb_top(chunk)
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue  # n > 1: only the first choice is trained on
            ids = choice.get("token_ids")
            if ids:
                capture.completion_token_ids = (capture.completion_token_ids or []) + list(ids)
            if choice.get("prompt_token_ids"):
                capture.prompt_token_ids = capture.prompt_token_ids or choice["prompt_token_ids"]
            logprobs = _choice_logprobs(choice)
            if logprobs:
                capture.logprobs = (capture.logprobs or []) + logprobs
            if choice.get("finish_reason"):
                capture.finish_reason = choice["finish_reason"]
            if self.api == "completions":
                self.text += choice.get("text") or ""
                continue
            delta = choice.get("delta") or {}
            self.role = delta.get("role") or self.role
            self.text += delta.get("content") or ""
            for call in delta.get("tool_calls") or ():
                self._merge_call(call)

    def _merge_call(self, delta: dict[str, Any]) -> None:
        entry = self.tool_calls.setdefault(
            delta.get("index", 0), {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        entry["id"] = entry["id"] or delta.get("id")
        function = delta.get("function") or {}
        entry["function"]["name"] += function.get("name") or ""
        entry["function"]["arguments"] += function.get("arguments") or ""

    def completion(self) -> dict[str, Any]:
        """The whole answer as a non-streamed ``chat.completion`` / ``text_completion`` object."""
        first = self.first_chunk or {}
        if self.api == "completions":
            choice: dict[str, Any] = {"index": 0, "text": self.text, "finish_reason": self.capture.finish_reason}
            kind = "text_completion"
        else:
            message: dict[str, Any] = {"role": self.role, "content": self.text or None}
            if self.tool_calls:
                message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
            choice = {"index": 0, "message": message, "finish_reason": self.capture.finish_reason}
            kind = "chat.completion"
        return {
            "id": first.get("id"),
            "object": kind,
            "created": first.get("created"),
            "model": self.capture.response_model,
            "choices": [choice],
            "usage": self.capture.usage,
        }


def build_span(
    context: CallContext,
    api: Api,
    request: dict[str, Any],
    response: dict[str, Any],
    capture: Capture,
    *,
    streamed: bool,
    started: float,
    translated: dict[str, Any] | None = None,
    span_id: str | None = None,
    ended: float | None = None,
) -> Span:
    """The ``agentgrad.llm.call`` span of one completed call.

    ``translated`` is the chat request a Responses call became: the token ids are of that one.
    ``ended``: when the call completed (default: now; the span may be built later, off the client's path).
    """
    ended = time.time() if ended is None else ended
    usage = capture.usage or {}
    input_tokens = usage.get("prompt_tokens", usage.get("input_tokens"))
    output_tokens = usage.get("completion_tokens", usage.get("output_tokens"))
    attributes: dict[str, Any] = {
        semconv.LLM_API: api,
        semconv.LLM_REQUEST: request,
        semconv.LLM_RESPONSE: response,
        semconv.LLM_STREAMED: streamed,
        semconv.LLM_LATENCY: ended - started,
        semconv.GEN_AI_SYSTEM: "openai",
        semconv.GEN_AI_OPERATION_NAME: "text_completion" if api == "completions" else "chat",
        semconv.GEN_AI_REQUEST_MODEL: request.get("model"),
        semconv.GEN_AI_RESPONSE_MODEL: capture.response_model,
        semconv.GEN_AI_USAGE_INPUT_TOKENS: (
            input_tokens if input_tokens is not None else len(capture.prompt_token_ids or ())
        ),
        semconv.GEN_AI_USAGE_OUTPUT_TOKENS: (
            output_tokens if output_tokens is not None else len(capture.completion_token_ids or ())
        ),
    }
    if translated is not None:
        attributes[semconv.LLM_UPSTREAM_REQUEST] = translated
    optional = {
        semconv.LLM_PROMPT_TOKEN_IDS: capture.prompt_token_ids,
        semconv.LLM_COMPLETION_TOKEN_IDS: capture.completion_token_ids,
        semconv.LLM_LOGPROBS: capture.logprobs,
        semconv.MODEL_VERSION: capture.model_version,
        semconv.AGENT_NAME: context.agent_name,
        semconv.LLM_FINISH_REASON: capture.finish_reason,
    }
    attributes.update({k: v for k, v in optional.items() if v is not None})
    fields: dict[str, Any] = {"span_id": span_id} if span_id else {}
    if context.trace_id:
        fields["trace_id"] = context.trace_id
    return Span(
        rollout_id=context.rollout_id,
        attempt_id=context.attempt_id,
        parent_id=context.parent_id,
        name=semconv.SPAN_LLM_CALL,
        start_time=started,
        end_time=ended,
        attributes=attributes,
        **fields,
    )

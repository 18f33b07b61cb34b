"""OpenAI-compatible HTTP API over an :class:`~agentgrad.inference.engine.Engine`.

Endpoints: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``, ``/health``, and the
weight-management endpoints ``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter`` (vLLM's names)
and ``/v1/update_weights``. Responses carry ``model_version``; with ``return_token_ids: true``
they carry ``prompt_token_ids`` and per-choice ``token_ids`` (vLLM's field names), in streams too.

Bad input gets HTTP 400 with an OpenAI-style body ``{"error": {"message", "type", "param",
"code"}}`` naming the field (:mod:`agentgrad.http.openai_errors`, the capture proxy's format too);
fields are typed strictly (``"stream": "yes"`` is refused, not read as true). An unknown ``model``
is served by the loaded model and echoed back (some frameworks switch APIs after a 404); a loaded
LoRA adapter's name selects that adapter.

Every request passes the gate of :mod:`agentgrad.http.guard` first (allowed ``Host``, the bearer
token when one is set, a JSON body within the size limit). Large bodies are parsed, and every
prompt is rendered and tokenized, in a worker thread, so ``/health`` and other requests are
answered meanwhile; a prompt far beyond the context length is refused after tokenizing a prefix
of it, not all of it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentgrad.http.guard import DEFAULT_MAX_BODY_BYTES, Guard, GuardMiddleware, HostCheck
from agentgrad.http.jsonbody import BadJson, parse_object
from agentgrad.http.openai_errors import OpenAIError, error_body, openai_refusal
from agentgrad.inference.engine import (
    Engine,
    EngineError,
    GenerationResult,
    RequestError,
    SamplingParams,
    TokenEvent,
    load_state_dict,
)
from agentgrad.inference.toolcalls import TOOL_CALL_OPEN, parse_tool_calls

MAX_N = 16
#: Bodies larger than this are parsed in a worker thread (smaller ones cost less than the hop).
INLINE_PARSE_BYTES = 64 * 1024
#: Characters tokenized per token of context before a long prompt is judged on that prefix alone.
_PROBE_CHARS_PER_TOKEN = 8
#: Tokens a prefix may have beyond the context before the prompt is refused on it (the cut may
#: split a word into more tokens than the whole text gives it).
_PROBE_MARGIN = 64
#: Temperatures below this sample greedily, as in vLLM: dividing the logits by 1e-209 gives
#: infinities, and the engine step (every request in the batch) would fail.
GREEDY_BELOW = 1e-5
#: ``torch.Generator.manual_seed`` takes 64 bits; choice ``i`` of ``n`` is sampled with ``seed + i``.
_SEED_RANGE = (-(2**63), 2**64 - 1 - MAX_N)


class _Sampling(BaseModel):
    """Fields shared by chat and text completions; unknown fields are ignored like OpenAI's, known
    ones are typed strictly (no string read as a boolean or a number)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1, le=2**31 - 1)
    max_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int = Field(default=1, ge=1, le=MAX_N)
    seed: int | None = Field(default=None, ge=_SEED_RANGE[0], le=_SEED_RANGE[1])
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    return_token_ids: bool = False
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        items = [value] if isinstance(value, str) else (value or [])
        if any(not s for s in items):
            raise ValueError("stop strings must be non-empty")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value: float | None) -> float | None:
        if value:
            raise ValueError("only 0 is supported (penalties would change the sampled distribution)")
        return value

    def sampling(self, logprobs: int | None) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.max_tokens,
            temperature=1.0
            if self.temperature is None
            else 0.0
            if self.temperature < GREEDY_BELOW
            else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=max(0, self.top_k or 0),
            stop=[self.stop] if isinstance(self.stop, str) else list(self.stop or []),
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            seed=self.seed,
            logprobs=logprobs,
        )


class ChatRequest(_Sampling):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    @field_validator("messages")
    @classmethod
    def _messages(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, m in enumerate(messages):
            if m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
                raise ValueError(f"messages[{i}].role must be system, user, assistant or tool")
        return messages

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if isinstance(value, str) and value not in ("none", "auto", "required"):
            raise ValueError("tool_choice must be 'none', 'auto', 'required' or a named function")
        return value


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None

    @field_validator("echo")
    @classmethod
    def _echo(cls, value: bool) -> bool:
        if value:
            raise ValueError("echo is not supported")
        return value


def _error_response(body: bytes, status: int) -> Response:
    return Response(body, status_code=status, media_type="application/json")


def _normalize_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI wire messages → what chat templates expect (text content, dict arguments)."""
    out = []
    for m in messages:
        m = dict(m)
        if m["role"] == "developer":
            m["role"] = "system"
        content = m.get("content")
        if isinstance(content, list):
            m["content"] = "".join(
                p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
            )
        if m.get("tool_calls"):
            calls = []
            for call in m["tool_calls"]:
                call = json.loads(json.dumps(call))
                fn = call.get("function", {})
                if isinstance(fn.get("arguments"), str):
                    try:
                        parsed = json.loads(fn["arguments"])
                        if isinstance(parsed, dict):
                            fn["arguments"] = parsed
                    except ValueError:
                        pass  # malformed arguments stay a string, rendered verbatim
                calls.append(call)
            m["tool_calls"] = calls
        out.append(m)
    return out


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte ↔ printable-character table used by byte-level BPE vocabularies."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars), strict=True))


class _Server:
    """Request handling shared by the routes; holds the engine and per-token display caches."""

    def __init__(self, engine: Engine, served_model_name: str) -> None:
        self.engine = engine
        self.name = served_model_name
        self.tokenizer = engine.tokenizer
        self._token_text: dict[int, tuple[str, list[int]]] = {}
        self._byte_decoder = {c: b for b, c in _bytes_to_unicode().items()}

    def token_info(self, token_id: int) -> tuple[str, list[int]]:
        """(display text, exact bytes) of one token; byte-level pieces keep their raw bytes."""
        cached = self._token_text.get(token_id)
        if cached is None:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            if token_id in self.tokenizer.all_special_ids or piece in self.tokenizer.get_added_vocab():
                raw = piece.encode()
            elif piece is not None and all(c in self._byte_decoder for c in piece):
                raw = bytes(self._byte_decoder[c] for c in piece)
            else:
                raw = self.tokenizer.decode([token_id]).encode()
            cached = (raw.decode("utf-8", errors="replace"), list(raw))
            self._token_text[token_id] = cached
        return cached

    def lora_for(self, model: str | None) -> str | None:
        return model if model in self.engine.loras else None

    def chat_logprobs(
        self, token_ids: list[int], logprobs: list[float], tops: list[list[tuple[int, float]]] | None
    ) -> dict[str, Any]:
        content = []
        for j, (tid, lp) in enumerate(zip(token_ids, logprobs, strict=True)):
            text, raw = self.token_info(tid)
            alternatives = []
            for alt_id, alt_lp in tops[j] if tops else []:
                alt_text, alt_raw = self.token_info(alt_id)
                alternatives.append({"token": alt_text, "logprob": alt_lp, "bytes": alt_raw})
            content.append({"token": text, "logprob": lp, "bytes": raw, "top_logprobs": alternatives})
        return {"content": content}

    def completion_logprobs(
        self, token_ids: list[int], logprobs: list[float], tops: list[list[tuple[int, float]]] | None
    ) -> dict[str, Any]:
        tokens = [self.token_info(t)[0] for t in token_ids]
        offsets, pos = [], 0
        for t in tokens:
            offsets.append(pos)
            pos += len(t)
        return {
            "tokens": tokens,
            "token_logprobs": logprobs,
            "text_offset": offsets,
            "top_logprobs": [{self.token_info(i)[0]: v for i, v in top} for top in tops] if tops else None,
        }

    # ------------------------------------------------------------ chat

    def chat_prompt(self, req: ChatRequest) -> list[int]:
        tools = req.tools or None
        if tools and not self.engine.renders_tools:
            raise OpenAIError(
                f"model {self.name!r} cannot take tools: its chat template has no tool section, so "
                "the model would never see them (use a model whose chat template renders `tools`)",
                param="tools",
            )
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise OpenAIError(
                f"model {self.name!r} has no chat template (tokenizer_config.json 'chat_template' "
                "or chat_template.jinja): use /v1/completions, or add a template",
                param="messages",
            )
        try:
            text = self.tokenizer.apply_chat_template(
                _normalize_messages(req.messages), tools=tools, add_generation_prompt=True, tokenize=False
            )
        except Exception as exc:  # jinja errors name the problem in the template's words
            raise OpenAIError(f"could not apply the chat template: {exc}", param="messages") from exc
        return self.encode_prompt(text, "messages")

    def encode_prompt(self, text: str, param: str) -> list[int]:
        """``text``'s token ids; a text far beyond the context is refused (400) on a prefix alone, so
        a huge request costs a bounded tokenization (the engine checks the exact length later)."""
        limit = self.engine.max_model_len
        probe = limit * _PROBE_CHARS_PER_TOKEN
        if len(text) > probe:
            head = self.tokenizer.encode(text[:probe], add_special_tokens=False)
            if len(head) > limit + _PROBE_MARGIN:
                raise OpenAIError(f"{param}: {self._too_long(f'more than {limit + _PROBE_MARGIN}')}", param=param)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _too_long(self, tokens: str) -> str:
        return (
            f"This model's maximum context length is {self.engine.max_model_len} tokens; the prompt has "
            f"{tokens} tokens."
        )

    async def chat(self, req: ChatRequest) -> Any:
        if req.max_completion_tokens is not None and req.max_tokens is None:
            req.max_tokens = req.max_completion_tokens
        prompt = await asyncio.to_thread(self.chat_prompt, req)  # rendering and tokenizing: off the loop
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        params = req.sampling(logprobs)
        parse_tools = bool(req.tools) and req.tool_choice != "none"
        model_name = req.model or self.name
        lora = self.lora_for(req.model)
        if req.stream:
            events = self._stream_n(prompt, params, req.n, lora, parse_tools)
            return self._chat_stream(req, prompt, events, parse_tools, model_name)
        results = await self._run_n(prompt, params, req.n, lora)
        choices = []
        for i, r in enumerate(results):
            content, calls = parse_tool_calls(r.text) if parse_tools else (r.text, [])
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
            choice: dict[str, Any] = {
                "index": i,
                "message": message,
                "logprobs": self.chat_logprobs(r.token_ids, r.logprobs, r.top_logprobs) if req.logprobs else None,
                "finish_reason": "tool_calls" if calls else r.finish_reason,
            }
            if req.return_token_ids:
                choice["token_ids"] = r.token_ids
            choices.append(choice)
        body: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": choices,
            "usage": self._usage(prompt, results),
            "model_version": results[0].model_version,
        }
        if req.return_token_ids:
            body["prompt_token_ids"] = prompt
        return body

    async def _chat_stream(
        self, req: ChatRequest, prompt: list[int], events_iter: AsyncIterator[Any], parse_tools: bool, model_name: str
    ) -> AsyncIterator[str]:
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        version = self.engine.model_version

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
            body = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model_name,
                "model_version": version,
                "choices": choices,
                **extra,
            }
            return f"data: {json.dumps(body)}\n\n"

        first: dict[str, Any] = {"prompt_token_ids": prompt} if req.return_token_ids else {}
        yield chunk(
            [
                {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                for i in range(req.n)
            ],
            **first,
        )
        results: list[GenerationResult | None] = [None] * req.n
        async for index, events, result, delta_text in events_iter:
            if result is not None:
                results[index] = result
                version = result.model_version
                content, calls = parse_tool_calls(result.text) if parse_tools else (result.text, [])
                delta: dict[str, Any] = {}
                if calls:
                    if delta_text:
                        delta["content"] = delta_text
                    delta["tool_calls"] = [{"index": k, **c} for k, c in enumerate(calls)]
                elif delta_text:
                    delta["content"] = delta_text
                ids = [e.token_id for e in events]
                choice = {
                    "index": index,
                    "delta": delta,
                    "logprobs": self._stream_logprobs(req, events),
                    "finish_reason": "tool_calls" if calls else result.finish_reason,
                }
                if req.return_token_ids:
                    choice["token_ids"] = ids
                yield chunk([choice])
            elif delta_text or req.return_token_ids or req.logprobs:
                choice = {
                    "index": index,
                    "delta": {"content": delta_text} if delta_text else {},
                    "logprobs": self._stream_logprobs(req, events),
                    "finish_reason": None,
                }
                if req.return_token_ids:
                    choice["token_ids"] = [e.token_id for e in events]
                yield chunk([choice])
        if (req.stream_options or {}).get("include_usage"):
            yield chunk([], usage=self._usage(prompt, [r for r in results if r is not None]))
        yield "data: [DONE]\n\n"

    def _stream_logprobs(self, req: ChatRequest, events: list[TokenEvent]) -> dict[str, Any] | None:
        if not req.logprobs or not events:
            return None
        return self.chat_logprobs(
            [e.token_id for e in events], [e.logprob for e in events], [e.top_logprobs or [] for e in events]
        )

    def _stream_n(
        self, prompt: list[int], params: SamplingParams, n: int, lora: str | None, hold_tools: bool
    ) -> AsyncIterator[tuple[int, list[TokenEvent], GenerationResult | None, str]]:
        """Submit ``n`` generations now (so bad requests fail before the stream starts) and return
        an iterator of (choice index, new token events, final result or None, new visible text).

        Text that may still turn into a stop string, an incomplete UTF-8 character, or (when tools
        are parsed) anything from ``<tool_call>`` on and trailing whitespace, is held back until it
        is settled.
        """
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[tuple[int, TokenEvent | GenerationResult | BaseException]] = asyncio.Queue()
        futures = []
        for i in range(n):
            p = self._choice_params(params, i)

            def on_token(event: TokenEvent, i: int = i) -> None:
                loop.call_soon_threadsafe(q.put_nowait, (i, event))

            def on_done(future: Future[GenerationResult], i: int = i) -> None:
                loop.call_soon_threadsafe(q.put_nowait, (i, future.exception() or future.result()))

            future = self.engine.submit(prompt, p, lora=lora, on_token=on_token)
            future.add_done_callback(on_done)
            futures.append(future)
        return self._stream_events(q, n, params, hold_tools)

    async def _stream_events(
        self, q: asyncio.Queue, n: int, params: SamplingParams, hold_tools: bool
    ) -> AsyncIterator[tuple[int, list[TokenEvent], GenerationResult | None, str]]:
        holdback = max((len(s) for s in params.stop), default=1) - 1
        ids: list[list[int]] = [[] for _ in range(n)]
        sent = [0] * n
        pending: list[list[TokenEvent]] = [[] for _ in range(n)]
        finished = 0
        while finished < n:
            index, item = await q.get()
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, GenerationResult):
                finished += 1
                text = item.text
                if hold_tools:
                    content, calls = parse_tool_calls(text)
                    text = (content or "") if calls else text
                rest = text[sent[index] :]
                yield index, pending[index], item, rest
                continue
            ids[index].append(item.token_id)
            pending[index].append(item)
            if item.finished:
                continue  # the result follows and settles the text
            text = self.tokenizer.decode(ids[index], skip_special_tokens=True)
            visible = len(text) - holdback
            while visible > 0 and text[visible - 1] == "\ufffd":
                visible -= 1
            if hold_tools:
                # Settled: the text before a tool-call tag, whole or still arriving; and, as a tool
                # call's content is stripped, without the whitespace that ends it.
                at = text.find(TOOL_CALL_OPEN)
                if at < 0:
                    partial = (k for k in range(len(TOOL_CALL_OPEN) - 1, 0, -1) if text.endswith(TOOL_CALL_OPEN[:k]))
                    at = len(text) - next(partial, 0)
                visible = min(visible, len(text[:at].rstrip()))
            delta = text[sent[index] : visible] if visible > sent[index] else ""
            sent[index] = max(sent[index], visible)
            yield index, pending[index], None, delta
            pending[index] = []

    @staticmethod
    def _choice_params(params: SamplingParams, i: int) -> SamplingParams:
        if params.seed is None or i == 0:
            return params
        from dataclasses import replace

        return replace(params, seed=params.seed + i)

    async def _run_n(
        self, prompt: list[int], params: SamplingParams, n: int, lora: str | None
    ) -> list[GenerationResult]:
        futures = [self.engine.submit(prompt, self._choice_params(params, i), lora=lora) for i in range(n)]
        return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futures)))

    @staticmethod
    def _usage(prompt: list[int], results: list[GenerationResult]) -> dict[str, int]:
        completion = sum(len(r.token_ids) for r in results)
        return {"prompt_tokens": len(prompt), "completion_tokens": completion, "total_tokens": len(prompt) + completion}

    # ------------------------------------------------------------ text completions

    async def completions(self, req: CompletionRequest) -> Any:
        prompts = await asyncio.to_thread(self._completion_prompts, req.prompt)
        params = req.sampling(req.logprobs)
        lora = self.lora_for(req.model)
        if req.stream:
            streams = [self._stream_n(p, params, req.n, lora, False) for p in prompts]
            return self._completion_stream(req, prompts, streams)
        choices, usage = [], {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        runs = [self._run_n(p, params, req.n, lora) for p in prompts]
        version = self.engine.model_version
        for p_index, (prompt, results) in enumerate(zip(prompts, await asyncio.gather(*runs), strict=True)):
            for i, r in enumerate(results):
                version = r.model_version
                choice: dict[str, Any] = {
                    "index": p_index * req.n + i,
                    "text": r.text,
                    "finish_reason": r.finish_reason,
                    "logprobs": self.completion_logprobs(r.token_ids, r.logprobs, r.top_logprobs)
                    if req.logprobs is not None
                    else None,
                }
                if req.return_token_ids:
                    choice["prompt_token_ids"] = prompt
                    choice["token_ids"] = r.token_ids
                choices.append(choice)
            u = self._usage(prompt, results)
            usage = {k: usage[k] + u[k] for k in usage}
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": req.model or self.name,
            "choices": choices,
            "usage": usage,
            "model_version": version,
        }

    def _completion_prompts(self, prompt: Any) -> list[list[int]]:
        if isinstance(prompt, str):
            prompt = [prompt]
        if prompt and all(isinstance(t, int) for t in prompt):
            prompt = [prompt]
        out = []
        for p in prompt:
            ids = self.encode_prompt(p, "prompt") if isinstance(p, str) else list(p)
            if not ids:
                raise OpenAIError("prompt must not be empty", param="prompt")
            if len(ids) >= self.engine.max_model_len:  # before the engine checks each id, on the loop
                raise OpenAIError(f"prompt: {self._too_long(str(len(ids)))}", param="prompt")
            out.append(ids)
        if not out:
            raise OpenAIError("prompt must not be empty", param="prompt")
        return out

    async def _completion_stream(
        self, req: CompletionRequest, prompts: list[list[int]], streams: list[AsyncIterator[Any]]
    ) -> AsyncIterator[str]:
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        model_name = req.model or self.name
        for p_index, (prompt, stream) in enumerate(zip(prompts, streams, strict=True)):
            first = True
            async for index, events, result, delta in stream:
                choice: dict[str, Any] = {
                    "index": p_index * req.n + index,
                    "text": delta,
                    "finish_reason": result.finish_reason if result else None,
                    "logprobs": self.completion_logprobs(
                        [e.token_id for e in events],
                        [e.logprob for e in events],
                        [e.top_logprobs or [] for e in events],
                    )
                    if req.logprobs is not None
                    else None,
                }
                if req.return_token_ids:
                    choice["token_ids"] = [e.token_id for e in events]
                    if first:
                        choice["prompt_token_ids"] = prompt
                first = False
                body = {
                    "id": cid,
                    "object": "text_completion",
                    "created": created,
                    "model": model_name,
                    "model_version": result.model_version if result else self.engine.model_version,
                    "choices": [choice],
                }
                yield f"data: {json.dumps(body)}\n\n"
        yield "data: [DONE]\n\n"


def _validated(raw: bytes, model: type[BaseModel]) -> Any:
    """The request body as ``model``; :class:`OpenAIError` naming the first bad field."""
    try:
        payload = parse_object(raw)
    except BadJson as exc:
        raise OpenAIError(str(exc), param="body") from None
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        raise OpenAIError(f"{param}: {err['msg']}", param=param) from None


def create_app(
    engine: Engine,
    *,
    served_model_name: str | None = None,
    token: str | None = None,
    allowed_hosts: HostCheck | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """The FastAPI application serving ``engine`` (OpenAI-compatible, see module doc).

    Args:
        token: when set, every route but ``/health`` needs ``Authorization: Bearer <token>``
            (an OpenAI client's ``api_key``).
        allowed_hosts: the ``Host`` names answered; None: any (:class:`ModelServer` always sets them).
        max_body_bytes: larger request bodies get 413 before they are read.
    """
    name = served_model_name or (engine.model_dir.name if engine.model_dir else "model")
    server = _Server(engine, name)
    app = FastAPI(title="AgentGrad model server")
    app.state.engine = engine
    app.state.served_model_name = name
    app.add_middleware(
        GuardMiddleware,
        guard=Guard(token=token, hosts=allowed_hosts, max_body_bytes=max_body_bytes),
        render=openai_refusal,
    )

    async def parse(request: Request, model: type[BaseModel]) -> Any:
        raw = await request.body()
        if len(raw) <= INLINE_PARSE_BYTES:
            return _validated(raw, model)
        return await asyncio.to_thread(_validated, raw, model)  # the loop keeps answering meanwhile

    async def respond(result: Any) -> Any:
        if isinstance(result, dict):
            return JSONResponse(result)
        # Pull the first chunk now so that errors surface as a 400, not a broken stream.
        iterator = result.__aiter__()
        first = await iterator.__anext__()

        async def body() -> AsyncIterator[str]:
            yield first
            try:
                async for item in iterator:
                    yield item
            except (RequestError, EngineError, OpenAIError) as exc:
                body = error_body(str(exc), kind="server_error", param=getattr(exc, "param", None))
                yield f"data: {body.decode()}\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    @app.exception_handler(OpenAIError)
    async def _refused(request: Request, exc: OpenAIError) -> Response:
        return _error_response(exc.body(), exc.status)

    @app.exception_handler(RequestError)
    async def _request_error(request: Request, exc: RequestError) -> Response:
        message = f"{exc.param}: {exc}" if exc.param else str(exc)
        return _error_response(error_body(message, param=exc.param), 400)

    @app.exception_handler(EngineError)
    async def _engine_error(request: Request, exc: EngineError) -> Response:
        return _error_response(error_body(str(exc), kind="server_error"), 503)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> Response:  # still JSON, as every other answer
        logging.getLogger(__name__).error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
        return _error_response(error_body(f"internal error: {type(exc).__name__}: {exc}", kind="server_error"), 500)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await respond(await server.chat(await parse(request, ChatRequest)))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await respond(await server.completions(await parse(request, CompletionRequest)))

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        created = int(time.time())
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "agentgrad",
                "max_model_len": engine.max_model_len,
                "model_version": engine.model_version,
            }
        ]
        data += [
            {
                "id": lora,
                "object": "model",
                "created": created,
                "owned_by": "agentgrad",
                "parent": name,
                "model_version": engine.model_version,
            }
            for lora in engine.loras
        ]
        return {"object": "list", "data": data}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "model_version": engine.model_version}

    @app.post("/v1/load_lora_adapter")
    async def load_lora(request: Request) -> dict[str, Any]:
        body = await parse(request, _LoraRequest)
        if not body.lora_path:
            raise OpenAIError("lora_path is required", param="lora_path")
        if not (Path(body.lora_path) / "adapter_config.json").is_file():
            raise OpenAIError(
                f"{body.lora_path} is not a LoRA adapter directory (no adapter_config.json)", param="lora_path"
            )
        try:
            await asyncio.to_thread(engine.load_lora, body.lora_name, body.lora_path)
        except EngineError:
            raise
        except Exception as exc:  # what peft says of an adapter it cannot load: the client named it
            raise OpenAIError(
                f"could not load the adapter at {body.lora_path}: {type(exc).__name__}: {exc}", param="lora_path"
            ) from exc
        return {"status": "ok", "lora_name": body.lora_name}

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora(request: Request) -> dict[str, Any]:
        body = await parse(request, _LoraRequest)
        try:
            await asyncio.to_thread(engine.unload_lora, body.lora_name)
        except KeyError as exc:
            raise OpenAIError(
                f"lora {body.lora_name!r} is not loaded", status=404, param="lora_name", kind="not_found_error"
            ) from exc
        return {"status": "ok", "lora_name": body.lora_name}

    @app.post("/v1/update_weights")
    async def update_weights(request: Request) -> dict[str, Any]:
        body = await parse(request, _UpdateRequest)
        try:  # read first: a file that is not weights is refused before the engine is touched
            state = await asyncio.to_thread(load_state_dict, body.path)
        except Exception as exc:  # what the loaders say of a file the client named (not a server fault)
            raise OpenAIError(
                f"could not read weights from {body.path}: {type(exc).__name__}: {exc}", param="path"
            ) from exc
        try:  # unknown names or shapes are refused before anything changes
            version = await asyncio.to_thread(engine.update_weights, state, body.version)
        except ValueError as exc:
            raise OpenAIError(str(exc), param="path") from exc
        return {"status": "ok", "model_version": version}

    return app


class _LoraRequest(BaseModel):
    model_config = ConfigDict(strict=True)

    lora_name: str = Field(min_length=1, max_length=256)
    lora_path: str | None = None


class _UpdateRequest(BaseModel):
    model_config = ConfigDict(strict=True)

    path: str = Field(min_length=1)
    version: str | None = Field(default=None, max_length=256)

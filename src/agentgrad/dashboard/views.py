"""View models: store records turned into what the templates show.

Pure Python (no FastAPI, no Jinja) so each piece is easy to test on its own. Everything here
returns plain data; escaping is the templates' job (Jinja autoescape is always on).
"""

from __future__ import annotations

import difflib
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

from agentgrad import semconv
from agentgrad.adapters.calls import LLMCall, content_text, extract_calls
from agentgrad.adapters.timeline import done_at
from agentgrad.dashboard.frameworks import FrameworkIO, framework_io
from agentgrad.dashboard.tokens import TokenDecoder, surprisal_level
from agentgrad.rewards import reward_number
from agentgrad.store.protocol import Store
from agentgrad.types import LLM, Attempt, JsonResource, PromptTemplate, Resource, Rollout, Span

# ---- formatting -----------------------------------------------------------------------------


def fmt_seconds(seconds: float | None) -> str:
    """A duration for people: ``850 ms``, ``3.42 s``, ``2 m 05 s``, ``1 h 02 m``."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} m {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} m"


def fmt_time(timestamp: float | None) -> str:
    """An epoch timestamp as local ``YYYY-MM-DD HH:MM:SS``."""
    if timestamp is None:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def fmt_number(value: float | None) -> str:
    """A metric or reward value, short: ``0.5``, ``1.23e-05``, ``—`` for None."""
    return "—" if value is None else f"{value:.4g}"


def pretty_json(value: Any) -> str:
    """Indented JSON, or ``repr`` for anything JSON cannot show."""
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)
    except (TypeError, ValueError):
        return repr(value)


def _maybe_json(value: Any) -> Any:
    """Span attributes may hold JSON as a string (OpenTelemetry attributes are flat)."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


# ---- rollouts -------------------------------------------------------------------------------


def rollout_duration(rollout: Rollout, now: float) -> float | None:
    """Seconds from start to end (to now while running); None before it starts."""
    if rollout.start_time is None:
        return None
    return (rollout.end_time or now) - rollout.start_time


def lacks_llm_calls(rollout: Rollout) -> bool:
    """A finished rollout with no captured LLM call: no training data, which must be loud
    (docs/architecture.md, "Rules of the road")."""
    return rollout.status.is_terminal and rollout.llm_calls == 0


@dataclass
class RolloutRow:
    """A row of the rollouts table: the rollout and what is read off it for its columns."""

    rollout: Rollout
    duration: float | None
    no_llm: bool
    task: str
    run: str | None
    step: int | None
    agents: list[str]


# ---- time bars ------------------------------------------------------------------------------


@dataclass
class Window:
    """A time range mapped onto 0–100 % of a bar's width."""

    start: float
    end: float

    @classmethod
    def around(cls, intervals: list[tuple[float, float | None]], now: float) -> Window:
        starts = [s for s, _ in intervals]
        ends = [e if e is not None else now for _, e in intervals]
        start = min(starts, default=now)
        return cls(start, max(max(ends, default=start), start))

    def place(self, start: float, end: float | None, now: float) -> tuple[float, float]:
        """(offset %, width %) of an interval; at least a sliver wide so it stays visible."""
        span = self.end - self.start or 1.0
        offset = (start - self.start) / span * 100
        width = ((end if end is not None else now) - start) / span * 100
        offset = min(max(offset, 0.0), 99.5)
        return round(offset, 3), round(max(min(width, 100 - offset), 0.5), 3)


@dataclass
class AttemptRow:
    """One attempt with its bar on the rollout's attempt timeline."""

    attempt: Attempt
    duration: float | None
    offset: float
    width: float


def attempt_rows(attempts: list[Attempt], now: float) -> list[AttemptRow]:
    """Attempts, oldest first, placed on one shared timeline."""
    window = Window.around([(a.start_time, a.end_time) for a in attempts], now)
    rows = []
    for attempt in attempts:
        offset, width = window.place(attempt.start_time, attempt.end_time, now)
        rows.append(AttemptRow(attempt, (attempt.end_time or now) - attempt.start_time, offset, width))
    return rows


# ---- spans ----------------------------------------------------------------------------------

_KINDS = {
    semconv.SPAN_LLM_CALL: "llm",
    semconv.SPAN_REWARD: "reward",
    semconv.SPAN_AGENT: "agent",
    semconv.SPAN_OPERATION: "operation",
    semconv.SPAN_MESSAGE: "message",
    semconv.SPAN_OBJECT: "object",
    semconv.SPAN_EXCEPTION: "exception",
}


@dataclass
class SpanRow:
    """A span in the flattened tree: depth for indentation, offset/width for its waterfall bar."""

    span: Span
    depth: int
    kind: str
    label: str
    duration: float | None
    offset: float
    width: float
    #: Anchor of the LLM call's detail card, for LLM-call spans.
    llm_anchor: str | None = None
    #: Inputs and outputs of a span another framework wrote (OpenInference, GenAI).
    io: FrameworkIO | None = None


def _label(span: Span) -> str:
    attrs = span.attributes
    kind = _KINDS.get(span.name)
    if kind == "llm":
        model = attrs.get(semconv.GEN_AI_RESPONSE_MODEL) or attrs.get(semconv.GEN_AI_REQUEST_MODEL) or ""
        return str(model)
    if kind == "reward":
        return f"reward = {fmt_number(reward_number(attrs.get(semconv.REWARD_VALUE)))}"
    if kind == "agent":
        return str(attrs.get(semconv.AGENT_NAME, ""))
    if kind == "operation":
        return str(attrs.get(semconv.OPERATION_NAME, ""))
    if kind == "message":
        return str(attrs.get(semconv.MESSAGE_BODY, ""))[:200]
    if kind == "object":
        return str(attrs.get(semconv.OBJECT_TYPE, ""))
    if kind == "exception":
        return f"{attrs.get(semconv.EXCEPTION_TYPE, '')}: {attrs.get(semconv.EXCEPTION_MESSAGE, '')}"
    return ""


def span_rows(spans: list[Span], now: float) -> list[SpanRow]:
    """Spans as a depth-first list of their tree (by ``parent_id``), siblings by start time.

    A span whose parent is not among ``spans`` is a root, so partial traces still show.
    """
    by_id = {s.span_id: s for s in spans}
    children: dict[str | None, list[Span]] = {}
    for span in spans:
        parent = span.parent_id if span.parent_id in by_id and span.parent_id != span.span_id else None
        children.setdefault(parent, []).append(span)
    for group in children.values():
        group.sort(key=lambda s: (s.start_time, s.sequence_id or 0))
    window = Window.around([(s.start_time, s.end_time) for s in spans], now)
    rows: list[SpanRow] = []
    seen: set[str] = set()
    llm_index = 0

    def visit(span: Span, depth: int) -> None:
        nonlocal llm_index
        if span.span_id in seen:  # a cycle in parent ids must not loop forever
            return
        seen.add(span.span_id)
        offset, width = window.place(span.start_time, span.end_time, now)
        kind = _KINDS.get(span.name, "other")
        io = framework_io(span.attributes) if kind == "other" else None
        label = _label(span)
        if io is not None:
            kind = "framework"
            label = " · ".join(part for part in (io.kind, io.name, io.summary) if part)
        anchor = None
        if kind == "llm":
            llm_index += 1
            anchor = f"llm-call-{llm_index}"
        # Clocks of different writers may disagree by a hair; a duration is never negative.
        duration = max(0.0, span.end_time - span.start_time) if span.end_time is not None else None
        rows.append(SpanRow(span, depth, kind, label, duration, offset, width, anchor, io))
        for child in children.get(span.span_id, []):
            visit(child, depth + 1)

    for root in children.get(None, []):
        visit(root, 0)
    return rows


# ---- LLM calls ------------------------------------------------------------------------------


@dataclass
class ToolCall:
    name: str
    arguments: str
    call_id: str | None = None


@dataclass
class ChatMessage:
    role: str
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    #: ``tool_call_id`` of a tool result, or the message's ``name``.
    note: str | None = None


@dataclass
class Token:
    """One completion token, coloured by its surprisal (``level`` 0–9, see :mod:`.tokens`)."""

    text: str
    token_id: int | None
    logprob: float | None

    @property
    def probability(self) -> float | None:
        return None if self.logprob is None else math.exp(self.logprob)

    @property
    def level(self) -> int | None:
        return None if self.logprob is None else surprisal_level(self.logprob)


@dataclass
class CallView:
    """An ``agentgrad.llm.call`` span laid out for display.

    What the call *is* comes from :class:`agentgrad.adapters.calls.LLMCall`, the reader training
    uses too, so the dashboard's "cannot be trained on" is exactly the trainer's; this class only
    adds what a page needs (its anchor, the conversation as messages, colored tokens).
    """

    anchor: str
    call: LLMCall
    span: Span
    duration: float | None
    messages: list[ChatMessage]
    tools: list[str]
    response: list[ChatMessage]
    finish_reason: str | None
    tokens: list[Token]
    mean_logprob: float | None

    @property
    def model(self) -> str | None:
        return self.call.model

    @property
    def model_version(self) -> str | None:
        return self.call.model_version

    @property
    def agent_name(self) -> str | None:
        return self.call.agent_name

    @property
    def prompt_tokens(self) -> int | None:
        return self.call.prompt_tokens

    @property
    def completion_tokens(self) -> int | None:
        return self.call.completion_tokens

    @property
    def missing_token_ids(self) -> bool:
        """True when the call cannot be trained on: ``not LLMCall.has_token_ids``."""
        return not self.call.has_token_ids

    @property
    def problems(self) -> list[str]:
        """Attributes present but malformed (read as absent), so a bad span says why it is flagged."""
        return self.call.problems


def _text(content: Any) -> str:
    """Message content as text (:func:`~agentgrad.adapters.calls.content_text`); any other shape
    as indented JSON."""
    text = content_text(content)
    return pretty_json(content) if text is None else text


def _tool_calls(raw: Any) -> list[ToolCall]:
    calls = []
    for call in raw if isinstance(raw, list) else []:
        if not isinstance(call, dict):
            continue
        function: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else call
        arguments = function.get("arguments", "")
        calls.append(
            ToolCall(
                str(function.get("name", "?")),
                arguments if isinstance(arguments, str) else pretty_json(arguments),
                call.get("id"),
            )
        )
    return calls


def _message(raw: Any) -> ChatMessage:
    if not isinstance(raw, dict):
        return ChatMessage("?", _text(raw))
    note = raw.get("tool_call_id") or raw.get("name")
    return ChatMessage(
        str(raw.get("role", "?")),
        _text(raw.get("content")),
        _tool_calls(raw.get("tool_calls")),
        str(note) if note else None,
    )


def _request_messages(request: Any) -> tuple[list[ChatMessage], list[str]]:
    if not isinstance(request, dict):
        return ([ChatMessage("request", _text(request))] if request else []), []
    tools = []
    for tool in request.get("tools") or []:
        if isinstance(tool, dict):
            function: dict[str, Any] = tool["function"] if isinstance(tool.get("function"), dict) else tool
            tools.append(str(function.get("name", "?")))
    if isinstance(request.get("messages"), list):  # chat completions
        return [_message(m) for m in request["messages"]], tools
    if "prompt" in request:  # completions
        return [ChatMessage("prompt", _text(request["prompt"]))], tools
    if "input" in request:  # responses API
        raw = request["input"]
        messages = [_message(m) for m in raw] if isinstance(raw, list) else [ChatMessage("user", _text(raw))]
        if request.get("instructions"):
            messages.insert(0, ChatMessage("system", _text(request["instructions"])))
        return messages, tools
    return [ChatMessage("request", pretty_json(request))], tools


def _response_messages(response: Any) -> tuple[list[ChatMessage], str | None, list[Any]]:
    """(messages, finish reason, OpenAI ``logprobs.content`` entries) of a response body."""
    if not isinstance(response, dict):
        return ([ChatMessage("response", _text(response))] if response else []), None, []
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        choice = choices[0]
        logprobs = choice.get("logprobs")
        content = logprobs.get("content") if isinstance(logprobs, dict) else None
        entries = content if isinstance(content, list) else []
        if isinstance(choice.get("message"), dict):  # chat completions
            return [_message(choice["message"])], choice.get("finish_reason"), entries
        return [ChatMessage("completion", _text(choice.get("text")))], choice.get("finish_reason"), entries
    if isinstance(response.get("output"), list):  # responses API
        messages = []
        for item in response["output"]:
            if isinstance(item, dict) and item.get("type") == "function_call":
                messages.append(
                    ChatMessage(
                        "assistant",
                        "",
                        [ToolCall(str(item.get("name", "?")), str(item.get("arguments", "")), item.get("call_id"))],
                    )
                )
            elif isinstance(item, dict):
                messages.append(ChatMessage(str(item.get("role", item.get("type", "?"))), _text(item.get("content"))))
        return messages, response.get("status"), []
    return [ChatMessage("response", pretty_json(response))], None, []


#: A number fit to show or plot: the reward rule (finite, never a bool), which suits every
#: number the dashboard draws (logprobs, metric values) as well as rewards.
_finite = reward_number


def _tokens(
    ids: list[int] | None, logprobs: list[float] | None, entries: list[Any], decoded: list[str] | None = None
) -> list[Token]:
    """Completion tokens: ids and logprobs from the span; token text from the model's tokenizer
    (``decoded``), else from the response when it has it, else the id."""
    lps = [_finite(v) for v in logprobs] if logprobs is not None else []  # NaN: the upstream gave none
    texts: list[Any] = (
        decoded if decoded is not None else [e.get("token") if isinstance(e, dict) else None for e in entries]
    )
    count = len(ids) if ids is not None else len(texts)
    tokens = []
    for i in range(count):
        token_id = ids[i] if ids is not None else None
        text = texts[i] if i < len(texts) and isinstance(texts[i], str) else None
        logprob = lps[i] if i < len(lps) else None
        if logprob is None and i < len(entries) and isinstance(entries[i], dict):
            logprob = _finite(entries[i].get("logprob"))
        tokens.append(Token(text if text is not None else f"⟨{token_id}⟩", token_id, logprob))
    return tokens


def _shown(parsed: dict[str, Any], raw: Any) -> Any:
    """The body as :class:`LLMCall` read it, else the raw attribute: a body that is not a JSON
    object is not usable for training, but a person should still see what was recorded."""
    return parsed if parsed else _maybe_json(raw)


def llm_calls(rows: list[SpanRow], decoder: TokenDecoder | None = None) -> list[CallView]:
    """Every LLM-call span of the tree, in tree order, with its conversation and tokens (their
    text from ``decoder`` when it knows the model)."""
    read = {call.span_id: call for call in extract_calls([row.span for row in rows])}
    views = []
    for row in rows:
        if row.kind != "llm" or row.llm_anchor is None:
            continue
        call, attrs = read[row.span.span_id], row.span.attributes
        messages, tools = _request_messages(_shown(call.request, attrs.get(semconv.LLM_REQUEST)))
        response, finish, entries = _response_messages(_shown(call.response, attrs.get(semconv.LLM_RESPONSE)))
        decoded = decoder.decode(call.model, call.completion_ids) if decoder and call.completion_ids else None
        tokens = _tokens(call.completion_ids, call.logprobs, entries, decoded)
        known = [t.logprob for t in tokens if t.logprob is not None]
        views.append(
            CallView(
                anchor=row.llm_anchor,
                call=call,
                span=row.span,
                duration=row.duration,
                messages=messages,
                tools=tools,
                response=response,
                finish_reason=finish or call.finish_reason,
                tokens=tokens,
                mean_logprob=sum(known) / len(known) if known else None,
            )
        )
    return views


@dataclass
class RewardRow:
    span: Span
    value: float | None
    primary: str | None
    #: Extra named dimensions (``agentgrad.reward.<name>``).
    dimensions: dict[str, float]


def reward_rows(spans: list[Span]) -> list[RewardRow]:
    """Reward spans in store order, with their named dimensions."""
    rows = []
    for span in spans:
        if span.name != semconv.SPAN_REWARD:
            continue
        attrs = span.attributes
        special = {semconv.REWARD_VALUE, semconv.REWARD_PRIMARY}
        dims = {
            k[len(semconv.REWARD_PREFIX) :]: number
            for k, v in attrs.items()
            if k.startswith(semconv.REWARD_PREFIX) and k not in special and (number := reward_number(v)) is not None
        }
        primary = attrs.get(semconv.REWARD_PRIMARY)
        rows.append(
            RewardRow(span, reward_number(attrs.get(semconv.REWARD_VALUE)), str(primary) if primary else None, dims)
        )
    return rows


# ---- resources ------------------------------------------------------------------------------


def resource_kind(item: Resource) -> str:
    return {"llm": "LLM", "prompt_template": "prompt", "json": "JSON"}[item.resource_type]


def resource_text(item: Resource) -> str:
    """What a resource item looks like as text, for display and diffing (API keys hidden)."""
    if isinstance(item, PromptTemplate):
        header = "" if item.engine == "f-string" else f"[engine: {item.engine}]\n"
        return header + item.template
    if isinstance(item, LLM):
        data = item.model_dump(exclude={"resource_type"})
        if data.get("api_key"):
            data["api_key"] = "•••"
        return pretty_json(data)
    if isinstance(item, JsonResource):
        return pretty_json(item.value)
    return pretty_json(item.model_dump())


@dataclass
class ItemDiff:
    name: str
    state: str  # added | removed | changed | same
    #: (css class, line) pairs of a unified diff: add, del, hunk, ctx.
    lines: list[tuple[str, str]]


def diff_items(old: dict[str, Resource], new: dict[str, Resource]) -> list[ItemDiff]:
    """Per-item unified diffs between two resource snapshots, changed items first."""
    diffs = []
    for name in sorted(set(old) | set(new)):
        before = resource_text(old[name]).splitlines() if name in old else []
        after = resource_text(new[name]).splitlines() if name in new else []
        state = (
            "added" if name not in old else "removed" if name not in new else "same" if before == after else "changed"
        )
        lines = []
        for line in difflib.unified_diff(before, after, lineterm="", n=3):
            if line.startswith(("---", "+++")):
                continue
            css = {"+": "add", "-": "del", "@": "hunk"}.get(line[:1], "ctx")
            lines.append((css, line))
        diffs.append(ItemDiff(name, state, lines))
    order = {"changed": 0, "added": 1, "removed": 2, "same": 3}
    return sorted(diffs, key=lambda d: order[d.state])


# ---- replay ---------------------------------------------------------------------------------


@dataclass
class ReplaySteps:
    """An attempt's LLM calls in the order they started (what replay steps through), and its
    reward spans; ``truncated`` when it had more calls than were read."""

    calls: list[LLMCall]
    spans: dict[str, Span]
    rewards: list[Span]
    truncated: bool


def replay_steps(store: Store, rollout_id: str, attempt_id: str, most: int) -> ReplaySteps:
    """Read an attempt's LLM-call and reward spans only (by name), at most ``most`` of each, so a
    rollout with a huge span tree replays as fast as a small one."""
    llm = store.query_spans(rollout_id, attempt_id, name=semconv.SPAN_LLM_CALL, limit=most + 1)
    rewards = store.query_spans(rollout_id, attempt_id, name=semconv.SPAN_REWARD, limit=most)
    truncated = len(llm) > most
    del llm[most:]
    return ReplaySteps(extract_calls(llm), {s.span_id: s for s in llm}, rewards, truncated)


@dataclass
class ReplayStep:
    """Call ``number`` (from 1) of a replay: the call, the request messages that are new since
    the previous call (``seen`` earlier ones are folded away), and the rewards emitted between
    its end and the next call's end (before the first call's end, for the first call)."""

    number: int
    call: CallView
    seen: int
    new_messages: list[ChatMessage]
    rewards: list[RewardRow]


def replay_step(steps: ReplaySteps, number: int, decoder: TokenDecoder | None, now: float) -> ReplayStep:
    calls = steps.calls
    call = calls[number - 1]
    view = llm_calls(span_rows([steps.spans[call.span_id]], now), decoder)[0]
    previous = calls[number - 2] if number > 1 else None
    seen = 0
    if previous is not None and call.request_messages[: len(previous.request_messages)] == previous.request_messages:
        seen = min(len(view.messages), len(previous.request_messages) + 1)  # + the previous answer
    low = call.end_time if number > 1 else -math.inf
    high = calls[number].end_time if number < len(calls) else math.inf
    rewards = reward_rows(sorted((s for s in steps.rewards if low <= done_at(s) < high), key=done_at))
    return ReplayStep(number, view, seen, view.messages[seen:], rewards)

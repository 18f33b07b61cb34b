"""A rollout as a person reads it in a terminal: the header, the span tree, and each LLM call's
conversation — the text view of the dashboard's rollout page (``agentgrad rollouts show``).

It lays out the dashboard's view models (:mod:`agentgrad.dashboard.views`), so a call that the
dashboard flags as not trainable is flagged here for the same reason. A conversation that goes on
from the call before it shows only its new messages: a ten-call rollout does not print its system
prompt ten times.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence

from agentgrad.adapters.calls import CUT_AT_TOKEN_LIMIT
from agentgrad.dashboard import views
from agentgrad.types import Attempt, Rollout, Span


def transcript(rollout: Rollout, attempts: Sequence[Attempt], spans: Sequence[Span]) -> Iterator[str]:
    """The lines of ``rollout``'s transcript: its latest attempt's spans (``spans`` are that attempt's)."""
    now = time.time()
    duration = views.fmt_seconds(views.rollout_duration(rollout, now))
    reward = "—" if rollout.reward is None else views.fmt_number(rollout.reward)
    yield (
        f"rollout {rollout.rollout_id} · {rollout.status.value} · {rollout.mode} · reward {reward} · "
        f"{len(attempts)} attempt(s) · {rollout.llm_calls} LLM call(s) · {duration}"
    )
    yield f"input: {_compact(rollout.input)}"
    if attempts:
        latest = attempts[-1]
        error = f" — {latest.error.type}: {latest.error.message}" if latest.error else ""
        yield f"attempt {latest.sequence_id} ({latest.attempt_id}) {latest.status.value} on {latest.worker_id}{error}"
    rows = views.span_rows(list(spans), now)
    if not rows:
        yield "no spans"
        return
    yield ""
    yield "spans:"
    for row in rows:
        label = f" {row.label}" if row.label else ""
        yield f"  {'  ' * row.depth}{row.span.name}{label} · {views.fmt_seconds(row.duration)}"
    earlier: list[tuple[str, str]] = []  # the previous call's conversation, its reply included
    for number, call in enumerate(views.llm_calls(rows), start=1):
        yield ""
        yield _call_header(number, call)
        messages = [(m.role, _message_text(m)) for m in call.messages]
        shared = _shared_prefix(earlier, messages)
        if shared:
            yield f"  … {shared} message(s) as in the call above"
        yield from (f"  {role}: {_indented(text)}" for role, text in messages[shared:])
        replies = [(m.role, _message_text(m)) for m in call.response]
        yield "  ── reply ──"
        yield from (f"  {role}: {_indented(text)}" for role, text in replies) if replies else ["  (none)"]
        earlier = messages + replies
    for reward_row in views.reward_rows(list(spans)):
        dimensions = "".join(f", {name} {views.fmt_number(value)}" for name, value in reward_row.dimensions.items())
        yield ""
        yield f"reward {views.fmt_number(reward_row.value)}{dimensions}"


def _call_header(number: int, call: views.CallView) -> str:
    parts = [f"LLM call {number}"]
    if call.agent_name:
        parts.append(f"agent {call.agent_name}")
    if call.model:
        parts.append(call.model)
    parts.append(
        f"{call.prompt_tokens if call.prompt_tokens is not None else '?'} → "
        f"{call.completion_tokens if call.completion_tokens is not None else '?'} tokens"
    )
    if call.finish_reason:
        cut = " (cut at the token limit)" if call.finish_reason == CUT_AT_TOKEN_LIMIT else ""
        parts.append(f"finish: {call.finish_reason}{cut}")
    if call.tools:
        parts.append("tools: " + ", ".join(call.tools))
    if call.missing_token_ids:
        parts.append("no token ids: not trainable")
    return " · ".join(parts) + "".join(f"\n  problem: {problem}" for problem in call.problems)


def _message_text(message: views.ChatMessage) -> str:
    text = message.content
    if message.note:
        text = f"[{message.note}] {text}"
    calls = [f"→ {call.name}({call.arguments})" for call in message.tool_calls]
    return "\n".join(part for part in (text, *calls) if part)


def _shared_prefix(earlier: list[tuple[str, str]], messages: list[tuple[str, str]]) -> int:
    """How many of ``messages`` repeat the previous call's conversation, from its start."""
    shared = 0
    for old, new in zip(earlier, messages, strict=False):
        if old != new:
            break
        shared += 1
    return shared


def _indented(text: str) -> str:
    return text.replace("\n", "\n    ")


def _compact(value: object, width: int = 500) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= width else text[: width - 1] + "…"

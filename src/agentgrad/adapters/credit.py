"""Credit assignment: how a rollout's rewards reach each of its LLM calls.

A rule is anything with ``assign(trace) -> list[float]`` (one reward per call of
``trace.calls``). The built-ins are described, with worked examples, in
``docs/credit-assignment.md``; keep the two in step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from agentgrad import semconv
from agentgrad.adapters.calls import LLMCall
from agentgrad.adapters.timeline import done_at
from agentgrad.rewards import reward_number
from agentgrad.types import Span

TOOL_CALL_MARK = "<tool_call>"


@dataclass
class RolloutTrace:
    """What a credit rule sees: the calls of one attempt, its reward spans and its final reward.

    ``calls`` are *all* the attempt's calls (trainable or not), in the order they started, so
    position-dependent rules (discounting, "follows" links) are the same whichever agents are
    being trained. ``reward_spans`` may come in any order: a rule reads their times.
    """

    rollout_id: str
    calls: list[LLMCall]
    reward_spans: list[Span] = field(default_factory=list)
    final_reward: float | None = None


@runtime_checkable
class CreditRule(Protocol):
    """Turns a rollout's rewards into one reward per LLM call."""

    name: str

    def assign(self, trace: RolloutTrace) -> list[float]:
        """Rewards for ``trace.calls``, in order (same length)."""
        ...


def _final(trace: RolloutTrace) -> float:
    if trace.final_reward is None:
        raise ValueError(f"rollout {trace.rollout_id} has no final reward")
    return trace.final_reward


class FinalReward:
    """The trajectory's final reward on every call (the default; GRPO's usual choice)."""

    name = "final"

    def assign(self, trace: RolloutTrace) -> list[float]:
        return [_final(trace)] * len(trace.calls)


class Discounted:
    """Call ``i`` of ``n`` gets ``gamma ** (n - 1 - i) * final``: later calls, closer to the
    outcome, get more of it."""

    name = "discounted"

    def __init__(self, gamma: float = 0.9) -> None:
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma}")
        self.gamma = gamma

    def assign(self, trace: RolloutTrace) -> list[float]:
        final, n = _final(trace), len(trace.calls)
        return [final * self.gamma ** (n - 1 - i) for i in range(n)]


def reward_value(span: Span) -> float | None:
    """A reward span's value; None when it is not a reward number (such a span counts as absent)."""
    return reward_number(span.attributes.get(semconv.REWARD_VALUE))


class Emitted:
    """Each reward span goes to the LLM call it follows: the last call that finished before the
    reward was emitted, by the spans' own times (:mod:`agentgrad.adapters.timeline`), never by
    the order the store received them. A call gets the sum of its rewards, 0 if none. Rewards
    emitted before any call finished go to the first call. When no reward span exists at all,
    every call gets the final reward (so an agent that only returns a number still trains)."""

    name = "emitted"

    def assign(self, trace: RolloutTrace) -> list[float]:
        rewards = [(done_at(s), reward_value(s)) for s in trace.reward_spans]
        rewards = [(at, value) for at, value in rewards if value is not None]
        calls = trace.calls
        if not rewards or not calls:
            return FinalReward().assign(trace)
        out = [0.0] * len(calls)
        for at, value in rewards:
            before = [i for i, c in enumerate(calls) if c.end_time <= at]
            # Of overlapping calls (parallel tools), the one that finished last (a tie: the later-started).
            follows = max(before, key=lambda i: (calls[i].end_time, i)) if before else 0
            out[follows] += float(value)  # type: ignore[arg-type]
        return out


class AIR:
    """Automatic intermediate rewards: the final reward on every call, plus penalties from
    system signals the agent never had to emit:

    * ``unparsable_tool_call``: the assistant text contains ``<tool_call>`` but the response has
      no parsed ``tool_calls`` (malformed JSON) — charged to that call;
    * ``tool_error``: a ``tool`` message starting with ``"Error"`` in the next call's request —
      charged to the call that made the tool call (tool errors after the last call are invisible:
      no later request shows them);
    * ``repeated_call``: a call whose completion token ids equal an earlier call's — charged to
      the repeat.
    """

    name = "air"

    def __init__(
        self, unparsable_tool_call: float = -0.5, tool_error: float = -0.25, repeated_call: float = -0.25
    ) -> None:
        self.penalties = {
            "unparsable_tool_call": unparsable_tool_call,
            "tool_error": tool_error,
            "repeated_call": repeated_call,
        }

    def signals(self, trace: RolloutTrace) -> list[list[str]]:
        """The signal names that fired for each call (for metrics and debugging)."""
        calls = trace.calls
        fired: list[list[str]] = [[] for _ in calls]
        seen: list[tuple[int, ...]] = []
        for i, call in enumerate(calls):
            if TOOL_CALL_MARK in call.assistant_text and not call.tool_calls:
                fired[i].append("unparsable_tool_call")
            completion = tuple(call.completion_ids or ())
            if completion and completion in seen:
                fired[i].append("repeated_call")
            seen.append(completion)
            if i > 0 and _trailing_tool_error(call.request_messages):
                fired[i - 1].append("tool_error")
        return fired

    def assign(self, trace: RolloutTrace) -> list[float]:
        final = _final(trace)
        return [final + sum(self.penalties[s] for s in names) for names in self.signals(trace)]


def _trailing_tool_error(messages: Sequence[dict]) -> bool:
    """Whether the tool results at the end of a request (after the last assistant turn) hold an
    error: those are the results of the previous call's tool calls."""
    for message in reversed(messages):
        role = message.get("role")
        if role == "assistant":
            return False
        if role == "tool" and str(message.get("content") or "").lstrip().startswith("Error"):
            return True
    return False


def credit_rule(spec: str | CreditRule) -> CreditRule:
    """A rule from its name (``final``, ``discounted``, ``discounted:0.8``, ``emitted``, ``air``)
    or a rule object (returned as is)."""
    if not isinstance(spec, str):
        if not isinstance(spec, CreditRule):
            raise TypeError(f"credit must be a rule name or have assign(trace), got {type(spec).__name__}")
        return spec
    name, _, arg = spec.partition(":")
    if name == "final":
        return FinalReward()
    if name == "discounted":
        return Discounted(float(arg)) if arg else Discounted()
    if name == "emitted":
        return Emitted()
    if name == "air":
        return AIR()
    raise ValueError(f"unknown credit rule {spec!r}: use final, discounted[:gamma], emitted or air")

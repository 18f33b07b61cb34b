"""When spans happened: the order that credit, call numbering and traces use — not the store's.

The store numbers a rollout's spans (``sequence_id``) in the order it *receives* them, and that is
not the order they happened: the capture proxy stores LLM call spans behind its answers (write-
behind, in batches; :mod:`agentgrad.proxy.writer`), while the emitters store a reward or a message
the moment the agent emits it. A reward emitted right after a call therefore usually reaches the
store *before* that call, and "the last call with a smaller ``sequence_id``" is the wrong call.
So every reader that needs before/after uses the spans' own times, with ``sequence_id`` only
breaking exact ties.

Clocks. An LLM call's times are the proxy's: ``start_time`` when the request arrived,
``end_time`` when the answer was complete (taken before the last bytes go to the agent, so the
agent can never act on an answer "before" it ended). A reward's or message's time is the agent's
(the runner process). On one host that is one clock and the order is exact. Across hosts (a
proxy on the trainer's machine, runners elsewhere) it is as good as the clocks agree: a reward
lands on the wrong call only if the skew is larger than the time between that call's end and the
reward (for the reward of a returned value, that time includes the runner's flush round trip to
the proxy). Keep such hosts on NTP/chrony, which holds skew to about a millisecond or less.
"""

from __future__ import annotations

from agentgrad.types import Span


def done_at(span: Span) -> float:
    """When the span's event was complete: a call answered, a reward or message emitted (its end
    time; its start when it has none, or an end before its start, which no finished span has)."""
    return max(span.start_time, span.end_time) if span.end_time is not None else span.start_time


def by_start(span: Span) -> tuple[float, int]:
    """Sort key: when the span began (LLM calls are numbered so), then the store's order."""
    return span.start_time, span.sequence_id or 0


def by_done(span: Span) -> tuple[float, int]:
    """Sort key: when the span was complete, then the store's order — the order a store would hold
    the spans in if every writer had stored each one at once (a flat log of what happened)."""
    return done_at(span), span.sequence_id or 0

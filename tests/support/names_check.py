"""Shared by the framework suites: a two-agent program's calls carry the right agent names.

:func:`run_and_check_names` runs the program like training does (``capture_check.run_and_check``:
real engine, capture proxy, every call stored with faithful token ids), then checks the agent
name stored on every call and that ``agent_match`` — through the adapter training uses — keeps
the calls of exactly one of the two agents.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from capture_check import Capture, run_and_check

from agentgrad import semconv
from agentgrad.adapters.transitions import TransitionAdapter


def run_and_check_names(
    capture: Capture,
    agent: Callable[..., Any],
    *,
    names: list[str] | None = None,
    agents: set[str],
    match: str,
    selected: str,
    **kwargs: Any,
) -> list[Any]:
    """Run ``agent``; each rollout's calls must be named ``names`` in order (when given), use
    exactly the names ``agents``, and ``agent_match=match`` must keep only ``selected``'s calls."""
    spans = run_and_check(capture, agent, min_calls=2, **kwargs)
    by_rollout: dict[str, list[Any]] = {}
    for span in sorted(spans, key=lambda s: s.sequence_id or 0):
        by_rollout.setdefault(span.rollout_id, []).append(span)
    for rollout_id, calls in by_rollout.items():
        got = [span.attributes.get(semconv.AGENT_NAME) for span in calls]
        if names is not None:
            assert got == names, (rollout_id, got)
        assert set(got) == agents, (rollout_id, got)
    rollouts = [capture.store.get_rollout(rollout_id) for rollout_id in by_rollout]
    transitions, stats = TransitionAdapter(agent_match=match, merge=False).adapt(capture.store, rollouts)
    own = sum(span.attributes.get(semconv.AGENT_NAME) == selected for span in spans)
    assert [t.agent_name for t in transitions] == [selected] * own, [t.agent_name for t in transitions]
    assert stats.calls_other_agents == len(spans) - own and stats.other_agents == agents - {selected}, stats
    return spans

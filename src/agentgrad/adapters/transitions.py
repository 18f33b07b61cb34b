"""LLM calls → training transitions.

Pipeline per finished rollout (latest attempt only — the one that drove the rollout):
spans → :func:`extract_calls` → credit rule (one reward per call) → ``agent_match`` filter →
prefix merging → :class:`~agentgrad.types.Transition`. Then
:func:`agentgrad.adapters.advantages.group_advantages` turns rewards into advantages within each
task group.

Every drop is counted in :class:`AdaptStats`, never silent: calls without token ids (reported
by rollout id and call index), calls of other agents, rollouts without a reward or without calls.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from agentgrad import semconv
from agentgrad.adapters.calls import LLMCall, extract_calls, matches_agent
from agentgrad.adapters.credit import CreditRule, RolloutTrace, credit_rule, reward_value
from agentgrad.adapters.timeline import by_done
from agentgrad.store.protocol import Store
from agentgrad.types import Rollout, RolloutStatus, Transition

log = logging.getLogger(__name__)


@dataclass
class AdaptStats:
    """What happened to every rollout and call on the way to transitions."""

    rollouts: int = 0
    rollouts_used: int = 0
    rollouts_not_succeeded: int = 0
    rollouts_without_reward: int = 0
    rollouts_without_calls: int = 0
    calls: int = 0
    calls_other_agents: int = 0
    #: The agent names of the calls ``agent_match`` left out, so an empty batch can say what it saw.
    other_agents: set[str] = field(default_factory=set)
    #: (rollout_id, call index) of trainable calls that had no token ids: excluded, never re-tokenized.
    calls_without_token_ids: list[tuple[str, int]] = field(default_factory=list)
    #: Calls appended to the previous call's sequence (prompt extended prompt + completion exactly).
    merged_calls: int = 0
    #: Transitions produced (each started by one call that could not be merged into the previous).
    transitions: int = 0

    def as_metrics(self) -> dict[str, float]:
        return {
            "adapter/rollouts": self.rollouts,
            "adapter/rollouts_used": self.rollouts_used,
            "adapter/rollouts_without_calls": self.rollouts_without_calls,
            "adapter/rollouts_without_reward": self.rollouts_without_reward,
            "adapter/calls": self.calls,
            "adapter/calls_other_agents": self.calls_other_agents,
            "adapter/calls_without_token_ids": len(self.calls_without_token_ids),
            "adapter/merged_calls": self.merged_calls,
            "adapter/transitions": self.transitions,
        }


class TransitionAdapter:
    """Reads rollouts from a store and returns transitions with rewards (advantages unset).

    Args:
        credit: a :class:`CreditRule` or its name (``final`` by default).
        agent_match: regex; only calls whose agent name matches (``re.search``) are trained.
        merge: merge multi-turn calls that extend each other into one masked sequence.
    """

    def __init__(self, credit: str | CreditRule = "final", agent_match: str | None = None, merge: bool = True) -> None:
        self.credit = credit_rule(credit)
        self.agent_match = re.compile(agent_match) if agent_match else None
        self.merge = merge

    def adapt(self, store: Store, rollouts: Iterable[Rollout]) -> tuple[list[Transition], AdaptStats]:
        stats = AdaptStats()
        transitions: list[Transition] = []
        for rollout in rollouts:
            stats.rollouts += 1
            if rollout.status != RolloutStatus.SUCCEEDED:
                stats.rollouts_not_succeeded += 1
                continue
            transitions.extend(self.adapt_rollout(rollout, store.query_spans(rollout.rollout_id, "latest"), stats))
        if stats.calls_without_token_ids:
            log.warning(
                "%d trainable LLM call(s) had no token ids and were excluded (rollout, call): %s",
                len(stats.calls_without_token_ids),
                stats.calls_without_token_ids[:10],
            )
        return transitions, stats

    def adapt_rollout(self, rollout: Rollout, spans: Sequence, stats: AdaptStats) -> list[Transition]:
        """Transitions of one rollout from its latest attempt's spans."""
        calls = extract_calls(spans)
        stats.calls += len(calls)
        if not calls:
            stats.rollouts_without_calls += 1
            log.warning("rollout %s has no captured LLM call: no training data", rollout.rollout_id)
            return []
        reward_spans = [s for s in spans if s.name == semconv.SPAN_REWARD]
        final = rollout.reward
        if final is None:
            values = [v for v in map(reward_value, sorted(reward_spans, key=by_done)) if v is not None]
            final = values[-1] if values else None
        trace = RolloutTrace(rollout.rollout_id, calls, reward_spans, final)
        if final is None and not any(reward_value(s) is not None for s in reward_spans):
            stats.rollouts_without_reward += 1
            return []
        rewards = self.credit.assign(trace)
        if len(rewards) != len(calls):
            raise ValueError(f"credit rule {self.credit.name!r} returned {len(rewards)} rewards for {len(calls)} calls")
        chosen: list[tuple[LLMCall, float]] = []
        for call, reward in zip(calls, rewards, strict=True):
            if not matches_agent(call, self.agent_match):
                stats.calls_other_agents += 1
                stats.other_agents.add(call.agent_name or "(no name)")
            elif not call.has_token_ids:
                stats.calls_without_token_ids.append((call.rollout_id, call.index))
            else:
                chosen.append((call, float(reward)))
        out = self._sequences(rollout, chosen, stats)
        if out:
            stats.rollouts_used += 1
        return out

    def _sequences(self, rollout: Rollout, chosen: list[tuple[LLMCall, float]], stats: AdaptStats) -> list[Transition]:
        out: list[Transition] = []
        for call, reward in chosen:
            last = out[-1] if out else None
            if (
                self.merge
                and last is not None
                and last.reward == reward
                and last.agent_name == call.agent_name
                and _extends(last, call)
            ):
                inserted = call.prompt_ids[len(last.prompt_ids) + len(last.response_ids) :]  # type: ignore[index]
                completion = call.completion_ids or []
                last.response_ids += inserted + completion
                last.response_mask += [0] * len(inserted) + [1] * len(completion)  # type: ignore[operator]
                last.response_logprobs += [0.0] * len(inserted) + _logprobs(call)  # type: ignore[operator]
                last.metadata["calls"].append(call.index)
                last.metadata["model_versions"].append(call.model_version)
                stats.merged_calls += 1
                continue
            completion = list(call.completion_ids or [])
            out.append(
                Transition(
                    rollout_id=call.rollout_id,
                    attempt_id=call.attempt_id,
                    group_id=rollout.group_id,
                    index=len(out),
                    agent_name=call.agent_name,
                    prompt_ids=list(call.prompt_ids or []),
                    response_ids=completion,
                    response_logprobs=_logprobs(call),
                    response_mask=[1] * len(completion),
                    reward=reward,
                    model_version=call.model_version,
                    metadata={"calls": [call.index], "model_versions": [call.model_version]},
                )
            )
            stats.transitions += 1
        return out


def _logprobs(call: LLMCall) -> list[float]:
    """Sampled logprobs, aligned with the completion; missing ones are NaN (the trainer then
    uses the current policy's own logprobs as the old ones for those tokens: ratio 1)."""
    n = len(call.completion_ids or [])
    lp = call.logprobs or []
    return [float(v) for v in lp[:n]] + [float("nan")] * max(0, n - len(lp))


def _extends(last: Transition, call: LLMCall) -> bool:
    full = last.prompt_ids + last.response_ids
    prompt = call.prompt_ids or []
    return len(prompt) >= len(full) and prompt[: len(full)] == full

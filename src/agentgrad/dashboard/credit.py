"""Reward debugging: the credit each LLM call gets and the advantages of a group, computed by
the very code training runs (:mod:`agentgrad.adapters`), so what the page shows is what the
trainer would do with the same rule."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentgrad import semconv
from agentgrad.adapters import AdaptStats, TransitionAdapter, group_advantages
from agentgrad.adapters.calls import LLMCall, extract_calls
from agentgrad.adapters.credit import AIR, CreditRule, RolloutTrace, credit_rule
from agentgrad.store.protocol import Store
from agentgrad.types import Rollout, RolloutStatus, Span, Transition

#: The rules a page can apply (``?credit=``); the first is the default (as in GRPO).
RULES = ("final", "discounted", "emitted", "air")
#: LLM calls and reward spans read for credit: a rollout with more is not credited on the page.
CALLS_MAX = 200
REWARDS_MAX = 1000


def rule_name(value: str | None) -> str:
    """A rule from a query parameter; anything unknown is the default."""
    return value if value in RULES else RULES[0]


@dataclass
class CallCredit:
    """What one call (by index in start order) gets: its reward, or why it gets none."""

    index: int
    span_id: str
    reward: float | None
    why_none: str | None = None
    signals: list[str] = field(default_factory=list)


@dataclass
class Credit:
    """Per-call credit of one attempt under one rule (``note``: why there is none at all)."""

    rule: str
    explanation: str
    calls: list[CallCredit]
    note: str | None = None

    def of(self, span_id: str) -> CallCredit | None:
        return next((c for c in self.calls if c.span_id == span_id), None)


def _explanation(rule: object) -> str:
    doc = (type(rule).__doc__ or "").strip()
    return " ".join(doc.split("\n\n")[0].split())


@dataclass
class _Adapted:
    """An attempt's calls and reward spans, and the transitions training would make of them."""

    calls: list[LLMCall]
    reward_spans: list[Span]
    transitions: list[Transition]
    stats: AdaptStats


def _adapt(store: Store, rollout: Rollout, attempt_id: str, rule: CreditRule) -> _Adapted | None:
    """``TransitionAdapter.adapt_rollout`` without merging (each call one transition, so the
    rewards are exactly the trainer's) over only the attempt's LLM-call and reward spans, read
    by name and bounded; None when the attempt has more than CALLS_MAX calls."""
    llm_spans = store.query_spans(rollout.rollout_id, attempt_id, name=semconv.SPAN_LLM_CALL, limit=CALLS_MAX + 1)
    if len(llm_spans) > CALLS_MAX:
        return None
    if not llm_spans:
        return _Adapted([], [], [], AdaptStats())
    reward_spans = store.query_spans(rollout.rollout_id, attempt_id, name=semconv.SPAN_REWARD, limit=REWARDS_MAX)
    stats = AdaptStats()
    transitions = TransitionAdapter(rule, merge=False).adapt_rollout(rollout, llm_spans + reward_spans, stats)
    return _Adapted(extract_calls(llm_spans), reward_spans, transitions, stats)


def attempt_credit(store: Store, rollout: Rollout, attempt_id: str, rule: str, *, latest: bool = False) -> Credit:
    """Credit for every LLM call of one attempt under ``rule`` (one of :data:`RULES`); a call
    that becomes no transition says why. For the ``latest`` attempt the rollout's own count of
    LLM calls tells, without a read, when there are too many."""
    credit = credit_rule(rule)
    explanation = _explanation(credit)
    adapted = None if latest and rollout.llm_calls > CALLS_MAX else _adapt(store, rollout, attempt_id, credit)
    if adapted is None:
        return Credit(rule, explanation, [], f"more than {CALLS_MAX} LLM calls: credit is not computed here")
    rewards = {t.metadata["calls"][0]: t.reward for t in adapted.transitions}
    signals = (
        AIR().signals(RolloutTrace(rollout.rollout_id, adapted.calls, adapted.reward_spans)) if rule == "air" else None
    )
    rows = []
    for call in adapted.calls:
        why = (
            None
            if call.index in rewards
            else ("no token ids: not trainable" if not call.has_token_ids else "the rollout has no reward")
        )
        rows.append(
            CallCredit(call.index, call.span_id, rewards.get(call.index), why, signals[call.index] if signals else [])
        )
    note = None
    if adapted.stats.rollouts_without_reward:
        note = "no final reward and no reward span: training skips this rollout"
    elif rollout.status != RolloutStatus.SUCCEEDED:
        note = f"the rollout is {rollout.status.value}: training uses only succeeded rollouts"
    return Credit(rule, explanation, rows, note)


@dataclass
class Member:
    """One rollout of a group, with its advantage(s) under the page's rule."""

    rollout: Rollout
    credits: list[float]
    advantages: list[float]
    why_none: str | None


@dataclass
class GroupView:
    members: list[Member]
    rule: str
    #: Set when every reward of the group is equal: GRPO drops such a group (no signal).
    zero_variance: bool


def group_view(store: Store, rollouts: list[Rollout], rule: str) -> GroupView:
    """Rewards and GRPO advantages (``group_advantages``, std-normalised) of one group's rollouts,
    from each one's latest attempt, as training adapts only succeeded rollouts."""
    credit = credit_rule(rule)
    transitions: list[Transition] = []
    why: dict[str, str] = {}
    for rollout in rollouts:
        attempt = store.get_latest_attempt(rollout.rollout_id) if rollout.status == RolloutStatus.SUCCEEDED else None
        adapted = _adapt(store, rollout, attempt.attempt_id, credit) if attempt is not None else None
        if adapted is None:
            why[rollout.rollout_id] = "did not succeed" if attempt is None else f"more than {CALLS_MAX} calls"
        elif not adapted.transitions:
            why[rollout.rollout_id] = "no trainable call or reward"
        else:
            transitions += adapted.transitions
    kept, stats = group_advantages(transitions)
    members = []
    for rollout in rollouts:
        own = [t for t in transitions if t.rollout_id == rollout.rollout_id]
        members.append(
            Member(
                rollout, [t.reward for t in own], [t.advantage for t in own if t in kept], why.get(rollout.rollout_id)
            )
        )
    return GroupView(members, rule, stats.zero_variance_groups > 0)

"""Rewards → advantages (or preference pairs) within task groups: every estimator in one place.

A *group* is the transitions sharing a ``group_id`` (GRPO gives the ``group_size`` rollouts of
one task the same id; a transition without one is its own group). With *r* a group's rewards,
*μ* their mean, *σ* their population standard deviation and *G* its size:

=============== ==========================================================================
``grpo``        ``(r − μ) / (σ + eps)`` — GRPO (Shao et al. 2024, arXiv:2402.03300)
``rloo``        ``r_i − mean_{j≠i} r_j`` = ``G/(G−1) · (r_i − μ)`` — REINFORCE leave-one-out
                (Kool et al. 2019; Ahmadian et al. 2024, arXiv:2402.14740)
``reinforce++`` ``Ã = r − μ``, then ``(Ã − mean(Ã)) / (std(Ã) + eps)`` over the whole batch —
                REINFORCE++ with baseline (Hu et al. 2025, arXiv:2501.03262, "global advantage
                normalization": the group mean is the baseline, the *batch* sets the scale)
``dr_grpo``     ``r − μ`` — Dr. GRPO (Liu et al. 2025, arXiv:2503.20783): no division by σ,
                which up-weights groups that nearly agree; its other half, a loss normalised by
                a constant instead of token counts, is the trainer's (``ppo_step(tokens_per_sample=)``)
=============== ==========================================================================

Groups whose rewards are all equal carry no signal under any of them (every advantage is 0) and
are dropped, counted in :class:`GroupStats`. :func:`preference_pairs` turns the same groups into
DPO pairs instead (best vs worst of a group).

Statistics are over **transitions**: a rollout that gave two unmerged transitions counts twice.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from agentgrad.types import Transition

#: The advantage estimators :func:`group_advantages` knows.
Estimator = Literal["grpo", "rloo", "reinforce++", "dr_grpo"]
ESTIMATORS: tuple[str, ...] = get_args(Estimator)


@dataclass
class GroupStats:
    groups: int = 0
    zero_variance_groups: int = 0
    dropped_transitions: int = 0

    def as_metrics(self) -> dict[str, float]:
        return {
            "grpo/groups": self.groups,
            "grpo/zero_variance_groups": self.zero_variance_groups,
            "grpo/dropped_transitions": self.dropped_transitions,
        }


def groups_of(transitions: Sequence[Transition]) -> list[list[Transition]]:
    """Transitions by ``group_id`` in first-seen order (one without an id is its rollout's group)."""
    groups: dict[str, list[Transition]] = defaultdict(list)
    for t in transitions:
        groups[t.group_id or f"rollout:{t.rollout_id}"].append(t)
    return list(groups.values())


def group_advantages(
    transitions: Sequence[Transition], estimator: Estimator = "grpo", eps: float = 1e-6
) -> tuple[list[Transition], GroupStats]:
    """Set each transition's ``advantage`` by ``estimator`` (see the module's table) and return
    those of groups with reward variance, with the group counts. A group of one is dropped
    (it has σ = 0, and RLOO has no other member to compare with)."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {', '.join(map(repr, ESTIMATORS))}, got {estimator!r}")
    groups = groups_of(transitions)
    stats = GroupStats(groups=len(groups))
    kept: list[Transition] = []
    centered: list[float] = []  # r − μ of every transition of the batch (reinforce++'s scale)
    for members in groups:
        rewards = [t.reward for t in members]
        mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
        centered += [r - mean for r in rewards]
        if std <= eps:
            stats.zero_variance_groups += 1
            stats.dropped_transitions += len(members)
            continue
        size = len(members)
        for t in members:
            if estimator == "grpo":
                t.advantage = (t.reward - mean) / (std + eps)
            elif estimator == "rloo":
                t.advantage = (t.reward - mean) * size / (size - 1)
            else:  # dr_grpo, and reinforce++'s centred reward before the batch scale below
                t.advantage = t.reward - mean
            kept.append(t)
    if estimator == "reinforce++" and kept:
        # The batch's statistics include the groups that all agree (their Ã is 0), as the paper's
        # global batch does; μ_batch of group-centred rewards is 0 up to rounding.
        mu, sigma = statistics.fmean(centered), statistics.pstdev(centered)
        for t in kept:
            t.advantage = (t.advantage - mu) / (sigma + eps)
    return kept, stats


def preference_pairs(transitions: Sequence[Transition]) -> tuple[list[tuple[Transition, Transition]], GroupStats]:
    """One DPO pair per group: (chosen, rejected) = its highest- and lowest-reward transition.

    Only each rollout's first sequence (``index == 0``) takes part: the rollouts of a group answer
    the same task, so their first sequences continue the same prompt — DPO compares two
    completions of one prompt. (With merging on, as by default, a single-agent rollout's calls are
    usually that one sequence.) Ties keep the earliest transition. A group whose best and worst
    rewards are equal has no preference: it is skipped and counted as a zero-variance group; every
    transition left out of a pair counts as dropped.
    """
    firsts = [t for t in transitions if t.index == 0]
    groups = groups_of(firsts)
    stats = GroupStats(groups=len(groups))
    pairs: list[tuple[Transition, Transition]] = []
    for members in groups:
        best = max(members, key=lambda t: t.reward)
        worst = min(members, key=lambda t: t.reward)
        if best.reward == worst.reward:
            stats.zero_variance_groups += 1
        else:
            pairs.append((best, worst))
    stats.dropped_transitions = len(transitions) - 2 * len(pairs)
    return pairs, stats

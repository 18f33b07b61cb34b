"""Adapters: spans → LLM calls → training transitions (credit assignment, agent_match, merging) →
advantages or preference pairs within task groups.

Pure Python (no torch): algorithms call them on rollouts read back from the store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentgrad._lazy import lazy_exports

if TYPE_CHECKING:
    from agentgrad.adapters.advantages import ESTIMATORS as ESTIMATORS
    from agentgrad.adapters.advantages import GroupStats as GroupStats
    from agentgrad.adapters.advantages import group_advantages as group_advantages
    from agentgrad.adapters.advantages import preference_pairs as preference_pairs
    from agentgrad.adapters.calls import LLMCall as LLMCall
    from agentgrad.adapters.calls import agent_name_of as agent_name_of
    from agentgrad.adapters.calls import extract_calls as extract_calls
    from agentgrad.adapters.credit import AIR as AIR
    from agentgrad.adapters.credit import CreditRule as CreditRule
    from agentgrad.adapters.credit import Discounted as Discounted
    from agentgrad.adapters.credit import Emitted as Emitted
    from agentgrad.adapters.credit import FinalReward as FinalReward
    from agentgrad.adapters.credit import RolloutTrace as RolloutTrace
    from agentgrad.adapters.credit import credit_rule as credit_rule
    from agentgrad.adapters.transitions import AdaptStats as AdaptStats
    from agentgrad.adapters.transitions import TransitionAdapter as TransitionAdapter

_EXPORTS = {
    "LLMCall": "agentgrad.adapters.calls",
    "agent_name_of": "agentgrad.adapters.calls",
    "extract_calls": "agentgrad.adapters.calls",
    "AIR": "agentgrad.adapters.credit",
    "CreditRule": "agentgrad.adapters.credit",
    "Discounted": "agentgrad.adapters.credit",
    "Emitted": "agentgrad.adapters.credit",
    "FinalReward": "agentgrad.adapters.credit",
    "RolloutTrace": "agentgrad.adapters.credit",
    "credit_rule": "agentgrad.adapters.credit",
    "ESTIMATORS": "agentgrad.adapters.advantages",
    "GroupStats": "agentgrad.adapters.advantages",
    "group_advantages": "agentgrad.adapters.advantages",
    "preference_pairs": "agentgrad.adapters.advantages",
    "AdaptStats": "agentgrad.adapters.transitions",
    "TransitionAdapter": "agentgrad.adapters.transitions",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

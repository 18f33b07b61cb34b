"""Adapters: spans → LLM calls → training transitions (credit assignment, agent_match, merging).

Pure Python (no torch): algorithms call them on rollouts read back from the store.
"""

from agentgrad.adapters.calls import LLMCall, agent_name_of, extract_calls
from agentgrad.adapters.credit import AIR, CreditRule, Discounted, Emitted, FinalReward, RolloutTrace, credit_rule
from agentgrad.adapters.transitions import AdaptStats, GroupStats, TransitionAdapter, group_advantages

__all__ = [
    "AIR", "AdaptStats", "CreditRule", "Discounted", "Emitted", "FinalReward", "GroupStats", "LLMCall",
    "RolloutTrace", "TransitionAdapter", "agent_name_of", "credit_rule", "extract_calls", "group_advantages",
]

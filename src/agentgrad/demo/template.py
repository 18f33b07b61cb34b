"""The chat template of the embedded tiny model: the ChatML tool-calling template every ChatML
model AgentGrad serves shares (its home is ``models/chatml.py``), with Qwen2.5's default system
prompt."""

from agentgrad.models.chatml import CHAT_TEMPLATE, DEFAULT_SYSTEM

__all__ = ["CHAT_TEMPLATE", "DEFAULT_SYSTEM"]

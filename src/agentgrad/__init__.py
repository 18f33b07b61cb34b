"""AgentGrad: make any LLM agent better from its own experience.

Importing the package is cheap: heavy parts (torch, transformers, FastAPI, agent frameworks) are
imported only by the modules that need them.
"""

from __future__ import annotations

from typing import Any

from agentgrad._version import __version__

_LAZY = {
    # data model
    "Rollout": "agentgrad.types", "Attempt": "agentgrad.types", "Span": "agentgrad.types",
    "Resources": "agentgrad.types", "LLM": "agentgrad.types", "PromptTemplate": "agentgrad.types",
    "RolloutConfig": "agentgrad.types", "Transition": "agentgrad.types",
    "RolloutStatus": "agentgrad.types", "AttemptStatus": "agentgrad.types",
    # stores
    "Store": "agentgrad.store", "open_store": "agentgrad.store",
    "MemoryStore": "agentgrad.store", "SqliteStore": "agentgrad.store",
    # agents and emitters
    "Agent": "agentgrad.agents", "rollout": "agentgrad.agents",
    "emit_reward": "agentgrad.emit", "emit_message": "agentgrad.emit",
    "emit_object": "agentgrad.emit", "emit_exception": "agentgrad.emit",
    "operation": "agentgrad.emit", "agent": "agentgrad.emit",
    # running
    "Runner": "agentgrad.runner", "RunnerPool": "agentgrad.runner",
    "Trainer": "agentgrad.trainer",
    "instrument": "agentgrad.tracing",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'agentgrad' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value

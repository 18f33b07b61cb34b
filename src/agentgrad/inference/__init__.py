"""Local inference: an OpenAI-compatible server over Hugging Face transformers, and vLLM.

``Engine`` batches concurrent requests in one background thread and returns the exact token ids
and logprobs it sampled, tagged with the weights' version; ``create_app`` serves it over HTTP;
``ModelServer`` runs that app in a thread. Importing this package is light: torch, transformers
and FastAPI load when an engine or app is created.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "Engine": "agentgrad.inference.engine", "SamplingParams": "agentgrad.inference.engine",
    "GenerationResult": "agentgrad.inference.engine", "TokenEvent": "agentgrad.inference.engine",
    "EngineError": "agentgrad.inference.engine", "RequestError": "agentgrad.inference.engine",
    "create_app": "agentgrad.inference.app", "ModelServer": "agentgrad.inference.server",
    "parse_tool_calls": "agentgrad.inference.toolcalls", "launch_vllm": "agentgrad.inference.vllm",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'agentgrad.inference' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value

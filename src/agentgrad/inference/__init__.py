"""Local inference: an OpenAI-compatible server over Hugging Face transformers, and vLLM.

``Engine`` batches concurrent requests in one background thread and returns the exact token ids
and logprobs it sampled, tagged with the weights' version; ``create_app`` serves it over HTTP;
``ModelServer`` runs that app in a thread. Importing this package is light: torch, transformers
and FastAPI load when an engine or app is created.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentgrad._lazy import lazy_exports

if TYPE_CHECKING:
    from agentgrad.inference.app import create_app as create_app
    from agentgrad.inference.engine import Engine as Engine
    from agentgrad.inference.engine import EngineError as EngineError
    from agentgrad.inference.engine import GenerationResult as GenerationResult
    from agentgrad.inference.engine import RequestError as RequestError
    from agentgrad.inference.engine import SamplingParams as SamplingParams
    from agentgrad.inference.engine import TokenEvent as TokenEvent
    from agentgrad.inference.server import ModelServer as ModelServer
    from agentgrad.inference.toolcalls import parse_tool_calls as parse_tool_calls
    from agentgrad.inference.vllm import launch_vllm as launch_vllm

_EXPORTS = {
    "Engine": "agentgrad.inference.engine",
    "SamplingParams": "agentgrad.inference.engine",
    "GenerationResult": "agentgrad.inference.engine",
    "TokenEvent": "agentgrad.inference.engine",
    "EngineError": "agentgrad.inference.engine",
    "RequestError": "agentgrad.inference.engine",
    "create_app": "agentgrad.inference.app",
    "ModelServer": "agentgrad.inference.server",
    "parse_tool_calls": "agentgrad.inference.toolcalls",
    "launch_vllm": "agentgrad.inference.vllm",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

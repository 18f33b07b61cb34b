"""AgentGrad: make any LLM agent better from its own experience.

Importing the package is cheap: every name below is imported on first use (see ``_lazy.py``),
and heavy parts (torch, transformers, FastAPI, agent frameworks) only by the modules that need
them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentgrad._lazy import lazy_exports

if TYPE_CHECKING:
    from agentgrad._version import __version__ as __version__
    from agentgrad.agents import Agent as Agent
    from agentgrad.agents import load_agent as load_agent
    from agentgrad.agents import rollout as rollout
    from agentgrad.algorithms.apo import APO as APO
    from agentgrad.algorithms.baseline import Evaluate as Evaluate
    from agentgrad.algorithms.grpo import GRPO as GRPO
    from agentgrad.algorithms.grpo import GRPOConfig as GRPOConfig
    from agentgrad.algorithms.sft import SFT as SFT
    from agentgrad.emit import agent as agent
    from agentgrad.emit import emit_exception as emit_exception
    from agentgrad.emit import emit_message as emit_message
    from agentgrad.emit import emit_object as emit_object
    from agentgrad.emit import emit_reward as emit_reward
    from agentgrad.emit import operation as operation
    from agentgrad.errors import AgentGradError as AgentGradError
    from agentgrad.inference.engine import Engine as Engine
    from agentgrad.inference.server import ModelServer as ModelServer
    from agentgrad.proxy.server import LLMProxy as LLMProxy
    from agentgrad.runner import Runner as Runner
    from agentgrad.runner import RunnerPool as RunnerPool
    from agentgrad.store import open_store as open_store
    from agentgrad.store.memory import MemoryStore as MemoryStore
    from agentgrad.store.protocol import Store as Store
    from agentgrad.store.sqlite import SqliteStore as SqliteStore
    from agentgrad.tasks import read_tasks as read_tasks
    from agentgrad.tracing.instrument import instrument as instrument
    from agentgrad.trainer import Trainer as Trainer
    from agentgrad.training.local import LocalPolicy as LocalPolicy
    from agentgrad.training.policy import TrainConfig as TrainConfig
    from agentgrad.types import LLM as LLM
    from agentgrad.types import Attempt as Attempt
    from agentgrad.types import AttemptStatus as AttemptStatus
    from agentgrad.types import PromptTemplate as PromptTemplate
    from agentgrad.types import Resources as Resources
    from agentgrad.types import Rollout as Rollout
    from agentgrad.types import RolloutConfig as RolloutConfig
    from agentgrad.types import RolloutStatus as RolloutStatus
    from agentgrad.types import Span as Span
    from agentgrad.types import Transition as Transition

_EXPORTS = {
    "__version__": "agentgrad._version",
    # data model
    "Rollout": "agentgrad.types",
    "Attempt": "agentgrad.types",
    "Span": "agentgrad.types",
    "Resources": "agentgrad.types",
    "LLM": "agentgrad.types",
    "PromptTemplate": "agentgrad.types",
    "RolloutConfig": "agentgrad.types",
    "Transition": "agentgrad.types",
    "RolloutStatus": "agentgrad.types",
    "AttemptStatus": "agentgrad.types",
    "AgentGradError": "agentgrad.errors",
    # stores
    "Store": "agentgrad.store.protocol",
    "open_store": "agentgrad.store",
    "MemoryStore": "agentgrad.store.memory",
    "SqliteStore": "agentgrad.store.sqlite",
    # agents, tasks and emitters
    "Agent": "agentgrad.agents",
    "rollout": "agentgrad.agents",
    "load_agent": "agentgrad.agents",
    "read_tasks": "agentgrad.tasks",
    "emit_reward": "agentgrad.emit",
    "emit_message": "agentgrad.emit",
    "emit_object": "agentgrad.emit",
    "emit_exception": "agentgrad.emit",
    "operation": "agentgrad.emit",
    "agent": "agentgrad.emit",
    # running
    "Runner": "agentgrad.runner",
    "RunnerPool": "agentgrad.runner",
    "Trainer": "agentgrad.trainer",
    "instrument": "agentgrad.tracing.instrument",
    # training: algorithms, the policy trainer's settings, the proxy and a local model
    "GRPO": "agentgrad.algorithms.grpo",
    "GRPOConfig": "agentgrad.algorithms.grpo",
    "APO": "agentgrad.algorithms.apo",
    "SFT": "agentgrad.algorithms.sft",
    "Evaluate": "agentgrad.algorithms.baseline",
    "TrainConfig": "agentgrad.training.policy",
    "LocalPolicy": "agentgrad.training.local",
    "LLMProxy": "agentgrad.proxy.server",
    "Engine": "agentgrad.inference.engine",
    "ModelServer": "agentgrad.inference.server",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

"""Algorithms: what learns from the store (evaluation, GRPO, APO, SFT)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentgrad._lazy import lazy_exports

if TYPE_CHECKING:
    from agentgrad.algorithms.apo import APO as APO
    from agentgrad.algorithms.base import Algorithm as Algorithm
    from agentgrad.algorithms.base import AlgorithmContext as AlgorithmContext
    from agentgrad.algorithms.baseline import Evaluate as Evaluate
    from agentgrad.algorithms.baseline import EvaluationReport as EvaluationReport
    from agentgrad.algorithms.grpo import GRPO as GRPO
    from agentgrad.algorithms.grpo import GRPOConfig as GRPOConfig
    from agentgrad.algorithms.sft import SFT as SFT
    from agentgrad.algorithms.trackers import MLflowTracker as MLflowTracker
    from agentgrad.algorithms.trackers import TensorBoardTracker as TensorBoardTracker
    from agentgrad.algorithms.trackers import WandbTracker as WandbTracker
    from agentgrad.algorithms.trackers import make_trackers as make_trackers

_EXPORTS = {
    "Algorithm": "agentgrad.algorithms.base",
    "AlgorithmContext": "agentgrad.algorithms.base",
    "Evaluate": "agentgrad.algorithms.baseline",
    "EvaluationReport": "agentgrad.algorithms.baseline",
    "GRPO": "agentgrad.algorithms.grpo",
    "GRPOConfig": "agentgrad.algorithms.grpo",
    "TensorBoardTracker": "agentgrad.algorithms.trackers",
    "WandbTracker": "agentgrad.algorithms.trackers",
    "MLflowTracker": "agentgrad.algorithms.trackers",
    "make_trackers": "agentgrad.algorithms.trackers",
    "APO": "agentgrad.algorithms.apo",
    "SFT": "agentgrad.algorithms.sft",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

"""Algorithms: what learns from the store (evaluation, GRPO, APO, SFT)."""

from agentgrad.algorithms.base import Algorithm, AlgorithmContext
from agentgrad.algorithms.baseline import Evaluate, EvaluationReport

__all__ = ["Algorithm", "AlgorithmContext", "Evaluate", "EvaluationReport"]

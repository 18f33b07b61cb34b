"""Models the project builds itself: the embedded tiny model and its calculator task.

Importing this package is light; torch/transformers load only when a model is built.
"""

from agentgrad.demo.tiny import build_tiny_model, default_model_dir, ensure_tiny_model, random_tiny_model

__all__ = ["build_tiny_model", "default_model_dir", "ensure_tiny_model", "random_tiny_model"]

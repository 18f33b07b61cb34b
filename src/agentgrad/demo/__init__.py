"""Models the project builds itself: the embedded tiny model and its calculator task.

Importing this package is light; torch/transformers load only when a model is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentgrad._lazy import lazy_exports

if TYPE_CHECKING:
    from agentgrad.demo.tiny import build_tiny_model as build_tiny_model
    from agentgrad.demo.tiny import default_model_dir as default_model_dir
    from agentgrad.demo.tiny import ensure_tiny_model as ensure_tiny_model
    from agentgrad.demo.tiny import random_tiny_model as random_tiny_model

_EXPORTS = {
    "build_tiny_model": "agentgrad.demo.tiny",
    "default_model_dir": "agentgrad.demo.tiny",
    "ensure_tiny_model": "agentgrad.demo.tiny",
    "random_tiny_model": "agentgrad.demo.tiny",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

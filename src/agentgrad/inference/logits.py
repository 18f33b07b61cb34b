"""A causal LM's forward pass with logits only where they are used.

A forward pass makes logits at every position — the vocabulary projection, a (rows × positions ×
vocabulary) tensor — and a training step uses those of the positions that predict a trained token:
a reply of 40 tokens after a prompt of 400, a response after a system turn. transformers' models
take ``logits_to_keep`` (the last *k* positions, or a tensor of positions) and project only
those; :func:`forward_keeping` passes it where the model's forward takes it and otherwise selects
the same positions from the whole logits, so every caller gets the same shapes from any model.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_TAKES_IT: dict[type, bool] = {}


def takes_logits_to_keep(model: Any) -> bool:
    """Whether ``model``'s forward (its base model's, under a peft wrapper) has ``logits_to_keep``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    kind = type(base)
    if kind not in _TAKES_IT:
        _TAKES_IT[kind] = "logits_to_keep" in inspect.signature(base.forward).parameters
    return _TAKES_IT[kind]


def forward_keeping(model: Any, keep: int | torch.Tensor, **inputs: Any) -> Any:
    """``model(**inputs)`` whose ``logits`` are those of the positions ``keep`` names: the last
    ``keep`` positions (an int ≥ 1), or the positions in a 1-D tensor, in its order."""
    if takes_logits_to_keep(model):
        out = model(**inputs, logits_to_keep=keep)
        if out.logits.shape[1] == (keep if isinstance(keep, int) else len(keep)):
            return out
    else:
        out = model(**inputs)
    out.logits = out.logits[:, -keep:] if isinstance(keep, int) else out.logits[:, keep]
    return out

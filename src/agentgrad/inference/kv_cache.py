"""A model's key-value cache under the name the installed transformers gives it.

transformers 5 renamed ``past_key_values`` to ``cache`` (the forward argument and the output
field) and warns on every process that still uses the old name; transformers 4 knows only the
old one. The engine, the trainer's logits and the warm-up builds pass and read the cache through
here, so they run quietly on every supported version (``transformers>=4.56,<6``).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from agentgrad.inference.logits import forward_keeping


@cache
def cache_name() -> str:
    """``cache`` where the installed transformers' model outputs have that field, else ``past_key_values``."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def cache_kwargs(kv_cache: Any) -> dict[str, Any]:
    """The forward keyword argument that hands a model ``kv_cache``."""
    return {cache_name(): kv_cache}


def prefix_cache(model: Any, prefix_ids: Any, rows: int) -> Any:
    """The cache of a prefix every row of a batch shares: run once, repeated ``rows`` times.

    A warm-up's or a group's rows often start with the same system turn; running it once instead
    of once per row is what makes long shared prompts cheap to train on. (Its logits are not
    used: only the last position's are made.)"""
    kv_cache = getattr(forward_keeping(model, 1, input_ids=prefix_ids, use_cache=True), cache_name())
    kv_cache.batch_repeat_interleave(rows)
    return kv_cache

"""The engine's key-value cache: each layer's states at the front of a buffer with room to grow.

Why: transformers' ``DynamicLayer`` adds a decode step's token with ``torch.cat``, which copies
the whole cache — every row, every position, every layer — at every step, so a reply of n tokens
copies its batch's cache n times. On the tiny models' shapes (128 rows of 400 positions, 4
layers) that copy was half of a decode step (``torch.profiler``: ``aten::cat`` 55 % of the CPU
time). A :class:`GrowingLayer` keeps its states in a larger buffer and writes each new token in
place; it copies only when the buffer is full (and then leaves :data:`HEADROOM` positions free)
or when the engine changes the batch's rows, which copies anyway.

Only the engine thread touches these caches. The module imports transformers: import it lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

if TYPE_CHECKING:
    import torch

    from agentgrad.inference.prefix_cache import Layers

#: Free positions a buffer keeps after its states when it is (re)allocated: that many decode steps
#: write in place before the next copy.
HEADROOM = 64


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose ``keys``/``values`` are views of the front of larger buffers.

    Code that assigns ``keys`` and ``values`` directly (as transformers' own cache methods do)
    still works: the next update sees the states are no longer its buffers' and copies them into
    new ones, once."""

    def __init__(self) -> None:
        super().__init__()
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        self._view: torch.Tensor | None = None  # the ``keys`` this layer last set

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:  # keys and values are None until now (and after a reset)
            self.device, self.is_initialized = key_states.device, True
        length = self.get_seq_length()
        end = length + key_states.shape[-2]
        if self._room() < end:
            self._reserve(key_states, value_states, length, end)
        assert self._buffers is not None
        keys, values = self._buffers
        keys[:, :, length:end] = key_states
        values[:, :, length:end] = value_states
        return self._show(end)

    def get_seq_length(self) -> int:
        return 0 if self.keys is None or self.keys.numel() == 0 else int(self.keys.shape[-2])

    def keep(self, rows: torch.Tensor, start: int) -> None:
        """Only the rows ``rows`` (an index tensor), from position ``start`` on: one gather, which
        keeps the free positions the buffers had."""
        length = self.get_seq_length()
        keys, values = self._buffers if self._buffers is not None and self._room() else self._current()
        rows = rows.to(keys.device)
        self._buffers = (keys[rows, :, start:], values[rows, :, start:])
        self._show(length - start)

    def stack(self, other: GrowingLayer, width: int) -> None:
        """These rows, then ``other``'s, each left-padded with zeros to ``width`` positions (a
        padded position's states must be finite: the mask gives it no weight, and 0 × NaN is NaN)."""
        parts = [self._current(), other._current()]
        first = parts[0][0]
        heads, head_dim = first.shape[1], first.shape[3]
        count = sum(keys.shape[0] for keys, _ in parts)
        buffers = tuple(first.new_empty((count, heads, width + HEADROOM, head_dim)) for _ in range(2))
        row = 0
        for part in parts:
            n, length = part[0].shape[0], part[0].shape[2]
            for buffer, tensor in zip(buffers, part, strict=True):
                buffer[row : row + n, :, : width - length] = 0
                buffer[row : row + n, :, width - length : width] = tensor
            row += n
        self._buffers = (buffers[0], buffers[1])
        self._show(width)

    def states(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values as tensors of their own (a prefix kept for later must not hold a
        buffer's free positions, nor count fewer bytes than it keeps alive)."""
        keys, values = self._current()
        return keys.contiguous(), values.contiguous()

    def _room(self) -> int:
        """Positions the buffers hold in all (0 when ``keys`` are not this layer's view)."""
        if self._buffers is None or self.keys is None or self.keys is not self._view:
            return 0
        return int(self._buffers[0].shape[-2])

    def _reserve(self, key_states: torch.Tensor, value_states: torch.Tensor, length: int, end: int) -> None:
        """New buffers for ``end`` positions and :data:`HEADROOM` more, holding the first ``length``."""
        shape = (key_states.shape[0], key_states.shape[1], end + HEADROOM, key_states.shape[3])
        keys, values = key_states.new_empty(shape), value_states.new_empty(shape[:3] + (value_states.shape[3],))
        if length:
            keys[:, :, :length], values[:, :, :length] = self._current()
        self._buffers = (keys, values)

    def _current(self) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.keys is not None and self.values is not None
        return self.keys, self.values

    def _show(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Point ``keys`` and ``values`` at the first ``length`` positions of the buffers."""
        assert self._buffers is not None
        keys, values = self._buffers[0][:, :, :length], self._buffers[1][:, :, :length]
        self.keys, self.values, self._view = keys, values, keys
        return keys, values


def batch_cache(layers: Layers, rows: int) -> DynamicCache:
    """A cache of growing layers (one per model layer, added as the model first updates it)
    holding the states ``layers`` (one row's, or none) for each of ``rows`` rows."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = GrowingLayer
    for index, (keys, values) in enumerate(layers):
        cache.update(keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1), index)
    return cache


def states(cache: DynamicCache) -> Layers:
    """Every layer's states as tensors of their own (see :meth:`GrowingLayer.states`)."""
    layers = []
    for layer in cache.layers:
        if not isinstance(layer, GrowingLayer):
            raise TypeError(f"not a batch cache: a layer is a {type(layer).__name__}")
        layers.append(layer.states())
    return layers

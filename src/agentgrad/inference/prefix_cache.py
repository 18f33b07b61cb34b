"""The engine's memory of prompt prefixes: key-value states it computed once and reuses.

Why: an agent's prompts repeat most of their tokens. Every request of a run starts with the same
system turn and tool schemas, a GRPO group sends the same prompt several times, and each turn of
a conversation starts with the turn before it. On a CPU, prefill is compute-bound: SmolLM2 on 2
cores sampled a GRPO step's first turn (128 calculator prompts of about 230 tokens, 16
different) in 60–80 s with every prompt prefilled whole and in 22–28 s with the repeated tokens
run once (``bench/bench_prefix_cache.py``, four rounds). vLLM does this on a GPU (``--enable-prefix-caching``); this
is the same idea for the in-process engine, kept simple: whole prefixes per adapter, found a
block of tokens at a time, least recently used first out, under a byte budget.

Only the engine thread touches a :class:`PrefixCache`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: Key and value states of every layer for one row: ``(1, kv_heads, tokens, head_dim)`` each.
Layers = list[tuple["torch.Tensor", "torch.Tensor"]]


def common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share (slice comparisons run in C: a bisection
    over them costs microseconds for prompts of thousands of tokens)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    same, differ = 0, n  # a[:same] == b[:same]; a[:differ] != b[:differ]
    while differ - same > 1:
        middle = (same + differ) // 2
        if a[:middle] == b[:middle]:
            same = middle
        else:
            differ = middle
    return same


#: The default budget of an engine's prefix states, in megabytes (``Engine(prefix_cache_mb=)``,
#: ``serve-model --prefix-cache-mb``).
DEFAULT_CACHE_MB = 256.0


def check_cache_mb(megabytes: float) -> float:
    """A prefix-cache budget in megabytes, checked: 0 or more (nan refused); raises ValueError.
    The engine, ``LocalPolicy`` (before it starts anything) and the ``--prefix-cache-mb`` flags
    all check it here."""
    if not megabytes >= 0:
        raise ValueError(f"prefix_cache_mb must be 0 or more, not {megabytes}")
    return megabytes


#: Tokens per block of the lookup index: a prefix is found a block at a time, then token by token.
BLOCK = 16


def block_hashes(tokens: Sequence[int]) -> list[int]:
    """A hash of each whole block's prefix: ``tokens[:16]``, ``tokens[:32]``, … (each from the one
    before and its block, so a prompt's are computed in one pass)."""
    hashes, chained = [], 0
    for end in range(BLOCK, len(tokens) + 1, BLOCK):
        chained = hash((chained, tuple(tokens[end - BLOCK : end])))
        hashes.append(chained)
    return hashes


@dataclass(eq=False)
class _Entry:
    lora: str | None
    tokens: list[int]
    hashes: list[int]
    layers: Layers
    nbytes: int


class PrefixCache:
    """Key-value states of prompt prefixes, by adapter (None: the base weights).

    A stored prefix serves any prompt that starts with part of it: a lookup returns the entry
    sharing the most leading tokens with the prompt, and the caller crops its states to them.
    Storing a prefix drops the entries it extends (a conversation's turns collapse into one), and
    the least recently used entries go once the states exceed ``max_bytes``.

    Lookups cost one pass over the prompt, however many entries there are (a runner's lone
    requests each leave one): an index maps the hash of every whole block's prefix (of
    :data:`BLOCK` tokens) to an entry that holds it; the deepest block found gives the entry, and
    comparing its tokens gives the exact length (so a hash collision cannot serve wrong states).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: dict[_Entry, None] = {}  # least recently used first
        self._index: dict[tuple[str | None, int], _Entry] = {}
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def longest(self, lora: str | None, tokens: Sequence[int], limit: int) -> tuple[Layers, int]:
        """The states of the stored prefix sharing the most leading tokens with ``tokens`` (at
        most ``limit``), cropped to them, and their count; ``([], 0)`` when none shares a whole
        block."""
        best = None
        for hashed in block_hashes(tokens[: max(limit, 0)]):
            entry = self._index.get((lora, hashed))
            if entry is None:
                break
            best = entry
        if best is None:
            return [], 0
        length = min(common_length(best.tokens, tokens), limit)
        if length == 0:
            return [], 0
        del self._entries[best]
        self._entries[best] = None
        return [(k[:, :, :length], v[:, :, :length]) for k, v in best.layers], length

    def add(self, lora: str | None, tokens: Sequence[int], layers: Layers) -> None:
        """Keep ``layers``, the states of ``tokens`` under adapter ``lora``; a prefix larger than
        the whole budget, or shorter than a block, is not kept."""
        nbytes = sum(k.nbytes + v.nbytes for k, v in layers)
        if nbytes > self.max_bytes or len(tokens) < BLOCK:
            return
        entry = _Entry(lora, list(tokens), block_hashes(tokens), layers, nbytes)
        held = {old for hashed in entry.hashes if (old := self._index.get((lora, hashed))) is not None}
        for old in held:
            if entry.tokens[: len(old.tokens)] == old.tokens:  # ``entry`` extends it
                self._drop(old)
        for hashed in entry.hashes:
            self._index[(lora, hashed)] = entry
        self._entries[entry] = None
        self.nbytes += nbytes
        while self.nbytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def clear(self) -> None:
        """Forget every prefix: the base weights changed, and every adapter sits on them."""
        self._entries.clear()
        self._index.clear()
        self.nbytes = 0

    def forget(self, lora: str) -> None:
        """Forget adapter ``lora``'s prefixes: it was reloaded or unloaded."""
        for entry in [e for e in self._entries if e.lora == lora]:
            self._drop(entry)

    def _drop(self, entry: _Entry) -> None:
        """Remove ``entry``; a block it indexed is indexed again by another entry holding it."""
        del self._entries[entry]
        self.nbytes -= entry.nbytes
        for block, hashed in enumerate(entry.hashes):
            key = (entry.lora, hashed)
            if self._index.get(key) is entry:
                holder = next(
                    (e for e in self._entries if e.lora == entry.lora and e.hashes[block : block + 1] == [hashed]), None
                )
                if holder is None:
                    del self._index[key]
                else:
                    self._index[key] = holder

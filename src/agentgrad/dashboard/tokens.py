"""Completion tokens for people: text from the model's tokenizer, colour from the logprob.

Colour is by *surprisal* ``-log p`` on a log scale, not by ``p``: a converged policy samples
almost every token with p > 0.9, and the differences that matter then are between 0.99 and
0.9999, which a linear scale paints one green. Level 0 is ``-log p > 10^0.5`` (p < 0.042);
each level above is half a decade less surprised, up to level 9, ``-log p <= 10^-3.5``
(p >= 0.99968).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: Colour levels; the legend labels each with the smallest p it holds.
LEVELS = 10


def surprisal_level(logprob: float) -> int:
    """0 (surprised) … 9 (certain) from ``-logprob`` on a log scale (see the module doc)."""
    surprisal = max(-logprob, 1e-12)
    return min(LEVELS - 1, max(0, math.floor((0.5 - math.log10(surprisal)) / 0.5) + 1))


def level_floor(level: int) -> float:
    """The smallest probability a level holds (level 0: 0)."""
    return 0.0 if level == 0 else math.exp(-(10 ** (1.0 - 0.5 * level)))


def legend() -> list[tuple[int, str]]:
    """(level, label) for the colour legend: ``p < 0.042``, ``≥ 0.042``, … ``≥ 0.99968``."""
    return [
        (level, f"p < {_short(level_floor(1))}" if level == 0 else f"≥ {_short(level_floor(level))}")
        for level in range(LEVELS)
    ]


def _short(p: float) -> str:
    """A probability with as many nines as it needs: 0.9, 0.99, 0.9997."""
    digits = max(1, -math.floor(math.log10(max(1 - p, 1e-12))) + 1)
    return f"{math.floor(p * 10**digits) / 10**digits:.{digits}f}".rstrip("0").rstrip(".")


@functools.lru_cache(maxsize=8)
def _load(path: str) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


class TokenDecoder:
    """Turns completion token ids into text with the tokenizer of the model that made them.

    ``tokenizers`` maps a model name (as the LLM-call span names it) to a tokenizer: a
    ``tokenizer.json`` or a model directory holding one; the key ``"*"`` serves any model.
    Only the paths configured here are ever opened (never one a span names). Without the
    ``tokenizers`` package or a matching entry, :meth:`decode` returns None and the page uses
    the token text the span recorded.
    """

    def __init__(self, tokenizers: Mapping[str, str | Path] | None = None) -> None:
        self.paths: dict[str, str] = {}
        for model, where in (tokenizers or {}).items():
            path = Path(where).expanduser()
            path = path / "tokenizer.json" if path.is_dir() else path
            if not path.is_file():
                raise ValueError(
                    f"no tokenizer for model {model!r} at {where} (need tokenizer.json or a directory holding one)"
                )
            self.paths[model] = str(path)

    def decode(self, model: str | None, ids: list[int]) -> list[str] | None:
        """Each id's text, or None when no tokenizer is configured for ``model``."""
        path = self.paths.get(model or "") or self.paths.get("*")
        if path is None:
            return None
        try:
            tokenizer = _load(path)
        except Exception:  # noqa: BLE001 - the ``tokenizers`` package missing or a bad file: fall back
            log.warning("cannot load the tokenizer %s", path, exc_info=True)
            return None
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        if any(not 0 <= i < size for i in ids):
            return None  # not this model's ids: show what the span recorded instead
        return tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False)

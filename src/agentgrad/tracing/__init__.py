"""Client-side capture helpers: tag openai requests with their rollout, and optional OTel trees.

:func:`instrument` is called by the runner; users never need to. See docs/capture.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentgrad._lazy import lazy_exports

if TYPE_CHECKING:
    from agentgrad.tracing.instrument import instrument as instrument
    from agentgrad.tracing.instrument import rollout_headers as rollout_headers

_EXPORTS = {
    "instrument": "agentgrad.tracing.instrument",
    "rollout_headers": "agentgrad.tracing.instrument",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

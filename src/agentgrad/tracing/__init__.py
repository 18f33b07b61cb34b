"""Client-side capture helpers: tag openai requests with their rollout, and optional OTel trees.

:func:`instrument` is called by the runner; users never need to. See docs/capture.md.
"""

from __future__ import annotations

from agentgrad.tracing.instrument import instrument, rollout_headers

__all__ = ["instrument", "rollout_headers"]

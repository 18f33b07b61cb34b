"""The web dashboard: runs compared, rollouts and groups, spans and LLM calls (credit, replay),
APO prompts, resources and runners.

``create_router(store, token)`` gives a FastAPI router that the store service mounts; the
``agentgrad dashboard`` command serves it alone for a local store file. FastAPI and Jinja2 are
imported only when one of these is used, so ``import agentgrad.dashboard`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentgrad._lazy import lazy_exports

if TYPE_CHECKING:
    from agentgrad.dashboard.app import create_app as create_app
    from agentgrad.dashboard.router import create_router as create_router

_EXPORTS = {"create_router": "agentgrad.dashboard.router", "create_app": "agentgrad.dashboard.app"}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

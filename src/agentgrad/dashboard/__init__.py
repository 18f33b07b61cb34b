"""The web dashboard: rollouts, spans and LLM calls, training curves, resources and runners.

``create_router(store, token)`` gives a FastAPI router that the store service mounts; the
``agentgrad dashboard`` command serves it alone for a local store file. FastAPI and Jinja2 are
imported only when one of these is used, so ``import agentgrad.dashboard`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentgrad.dashboard.app import create_app
    from agentgrad.dashboard.router import create_router

__all__ = ["create_router", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_router":
        from agentgrad.dashboard.router import create_router

        return create_router
    if name == "create_app":
        from agentgrad.dashboard.app import create_app

        return create_app
    raise AttributeError(f"module 'agentgrad.dashboard' has no attribute {name!r}")

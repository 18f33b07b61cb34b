"""The OpenAI-compatible capture proxy (see docs/capture.md).

``LLMProxy(store, upstream_url).start()`` serves it in-process; ``agentgrad proxy --store URL
--upstream URL`` serves it from the command line; :func:`create_proxy_app` gives the ASGI app.
Exports are lazy so that importing the runner (which names :class:`ProxyResourcesHook`) does
not import Starlette and httpx.
"""

from __future__ import annotations

from typing import Any

from agentgrad.proxy.hooks import ProxyResourcesHook, rollout_endpoint

__all__ = ["LLMProxy", "ProxyResourcesHook", "create_proxy_app", "rollout_endpoint"]


def __getattr__(name: str) -> Any:
    if name == "LLMProxy":
        from agentgrad.proxy.server import LLMProxy

        return LLMProxy
    if name == "create_proxy_app":
        from agentgrad.proxy.app import create_proxy_app

        return create_proxy_app
    raise AttributeError(name)

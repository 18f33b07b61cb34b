"""The OpenAI-compatible capture proxy (see docs/capture.md).

``LLMProxy(store, upstream_url).start()`` serves it in-process; ``agentgrad proxy --store URL
--upstream URL`` serves it from the command line; :func:`create_proxy_app` gives the ASGI app.
Exports are lazy so that importing the runner (which names :class:`ProxyResourcesHook`) does
not import Starlette and httpx.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentgrad._lazy import lazy_exports

if TYPE_CHECKING:
    from agentgrad.proxy.app import create_proxy_app as create_proxy_app
    from agentgrad.proxy.hooks import ProxyResourcesHook as ProxyResourcesHook
    from agentgrad.proxy.hooks import rollout_endpoint as rollout_endpoint
    from agentgrad.proxy.server import LLMProxy as LLMProxy

_EXPORTS = {
    "LLMProxy": "agentgrad.proxy.server",
    "create_proxy_app": "agentgrad.proxy.app",
    "ProxyResourcesHook": "agentgrad.proxy.hooks",
    "rollout_endpoint": "agentgrad.proxy.hooks",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

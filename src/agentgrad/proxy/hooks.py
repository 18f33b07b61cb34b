"""Pointing each rollout's LLM resource at the proxy, with the rollout in the URL.

This is the ``resources_hook`` the runner applies to the resources of every attempt. It is a
class (not a closure) so that runner processes started with ``spawn`` can receive it pickled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentgrad.http.guard import PROXY_TOKEN_ENV, env_token
from agentgrad.types import LLM

if TYPE_CHECKING:
    from agentgrad.types import AttemptedRollout, Resources


def rollout_endpoint(proxy_url: str, rollout_id: str, attempt_id: str) -> str:
    """``{proxy}/rollout/{rid}/attempt/{aid}/v1``; ``proxy_url`` may end in ``/v1`` or not."""
    root = proxy_url.rstrip("/")
    root = root[:-3] if root.endswith("/v1") else root
    return f"{root}/rollout/{rollout_id}/attempt/{attempt_id}/v1"


class ProxyResourcesHook:
    """Rewrites every :class:`LLM` resource's endpoint to the proxy URL of the running attempt.

    Resources without an LLM get one named ``llm_resource`` (default ``llm``; model
    ``default_model``: the proxy maps any name to the served model), so an agent always has an
    endpoint whose calls are captured.

    With a proxy ``token`` (default ``$AGENTGRAD_PROXY_TOKEN``), it becomes each rewritten LLM's
    ``api_key``, so the agent's OpenAI client sends it (``Authorization: Bearer <token>``); the
    proxy then uses its own upstream key, never the client's.
    """

    def __init__(
        self, proxy_url: str, default_model: str = "default", llm_resource: str = "llm", token: str | None = None
    ) -> None:
        if not llm_resource:
            raise ValueError("llm_resource must be a non-empty name")
        self.proxy_url = proxy_url
        self.default_model = default_model
        self.llm_resource = llm_resource
        self.token = token or env_token(PROXY_TOKEN_ENV)

    def __call__(self, resources: Resources, claimed: AttemptedRollout) -> Resources:
        endpoint = rollout_endpoint(self.proxy_url, claimed.rollout.rollout_id, claimed.attempt.attempt_id)
        update = {"endpoint": endpoint, **({"api_key": self.token} if self.token else {})}
        items = {
            name: item.model_copy(update=update) if isinstance(item, LLM) else item
            for name, item in resources.items.items()
        }
        if not any(isinstance(item, LLM) for item in items.values()):
            items[self.llm_resource] = LLM(endpoint=endpoint, model=self.default_model, api_key=self.token)
        return resources.model_copy(update={"items": items})

    def __repr__(self) -> str:
        return f"ProxyResourcesHook({self.proxy_url!r})"

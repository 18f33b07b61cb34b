"""The LLM API requests as the handlers read them, straight off the ASGI scope.

The API routes are on every LLM call, so the proxy serves them before Starlette's middleware,
router and ``Request`` (which re-decodes the header list on every lookup): together ~25 µs a call
on the project machine, against a budget of 0.5 ms for the proxy's whole overhead. The runner's
flush (:data:`FLUSH_PATH`) comes once a rollout, and is served the same way: through Starlette
it was a tenth of the proxy's time with four async runner slots (py-spy). Every other route, and
any other method on these paths, is Starlette's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from agentgrad.http.openai_errors import OpenAIError
from agentgrad.proxy.capture import Api

#: The API routes, each also under :data:`ROLLOUT_PREFIX`.
API_ROUTES: dict[str, Api] = {
    "/v1/chat/completions": "chat",
    "/v1/responses": "responses",
    "/v1/completions": "completions",
}
ROLLOUT_PREFIX = "/rollout/{rollout_id}/attempt/{attempt_id}"
#: The flush barrier's route (``POST``).
FLUSH_PATH = "/agentgrad/flush"
_API_PATH = re.compile(r"(?:/rollout/([^/]+)/attempt/([^/]+))?(/v1/(?:chat/completions|responses|completions))")


class Incoming:
    """One API request: its headers (lowercase names), the rollout and attempt of its URL, its body."""

    __slots__ = ("headers", "rollout_id", "attempt_id", "_receive")

    def __init__(
        self, scope: Mapping[str, Any], receive: Any, rollout_id: str | None = None, attempt_id: str | None = None
    ) -> None:
        self.headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        self.rollout_id, self.attempt_id = rollout_id, attempt_id
        self._receive = receive

    async def body(self) -> bytes:
        """The whole body (its size is bounded by the gate in front, :mod:`agentgrad.http.guard`)."""
        chunks = []
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":  # nobody to answer: the error response goes nowhere
                raise OpenAIError("the client disconnected before sending its whole request", status=499)
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def api_route(scope: dict[str, Any]) -> tuple[Api, str | None, str | None] | None:
    """``(api, rollout_id, attempt_id)`` of a POST to an API route (ids None without the rollout prefix)."""
    path = _post_path(scope)
    match = None if path is None else _API_PATH.fullmatch(path)
    return (API_ROUTES[match[3]], match[1], match[2]) if match else None


def is_flush(scope: dict[str, Any]) -> bool:
    """Whether the request is a POST to :data:`FLUSH_PATH`."""
    return _post_path(scope) == FLUSH_PATH


def _post_path(scope: dict[str, Any]) -> str | None:
    """The path of a POST, below the app's mount point; None for anything else."""
    if scope["type"] != "http" or scope["method"] != "POST":
        return None
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):  # mounted under a prefix
        path = path[len(root) :]
    return path

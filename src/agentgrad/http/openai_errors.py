"""OpenAI-style error bodies, ``{"error": {"message", "type", "param", "code"}}``: the one format of
the capture proxy's and the model server's refusals, so every client SDK surfaces them as it would
the API's. (The store service answers in its own format, :mod:`agentgrad.store.service.responses`.)"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentgrad.http.guard import Refusal


class OpenAIError(Exception):
    """A request refused with an OpenAI-style body (:meth:`body`) and HTTP ``status``."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.status, self.param, self.kind, self.code = message, status, param, kind, code

    def body(self) -> bytes:
        return error_body(self.message, kind=self.kind, param=self.param, code=self.code)


def error_body(
    message: str, *, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}}).encode()


def openai_refusal(refusal: Refusal) -> bytes:
    """A gate's :class:`~agentgrad.http.guard.Refusal` as an OpenAI-style body (its code as ``code``)."""
    kind = "authentication_error" if refusal.status == 401 else "invalid_request_error"
    return error_body(refusal.message, kind=kind, code=refusal.code)

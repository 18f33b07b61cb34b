"""OpenAI-style error bodies, so every client SDK surfaces the proxy's refusals as it would the API's."""

from __future__ import annotations

import json


class ProxyError(Exception):
    """A request the proxy refuses; becomes ``{"error": {...}}`` with ``status``."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 kind: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.param, self.kind, self.code = message, status, param, kind, code

    def body(self) -> bytes:
        return error_body(self.message, kind=self.kind, param=self.param, code=self.code)


def error_body(message: str, *, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}}).encode()

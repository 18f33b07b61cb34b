"""The dashboard's token gate.

With a token configured, a request sees data only if it proves it knows the token:

* ``Authorization: Bearer <token>`` (scripts, ``curl``), or
* a session cookie set by the ``?token=<token>`` login (browsers). The login answers with a
  redirect to the same URL without the token, so it leaves no trace in the address bar or in
  the history. The cookie holds an HMAC of the token, never the token itself, and is HttpOnly.

Every comparison uses :func:`hmac.compare_digest`.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import TYPE_CHECKING
from urllib.parse import urlencode

if TYPE_CHECKING:
    from starlette.requests import Request

COOKIE_NAME = "agentgrad_dashboard"


class TokenGate:
    """Decides whether a request may see data; ``token=None`` lets everyone in."""

    def __init__(self, token: str | None) -> None:
        self._bearer = f"Bearer {token}".encode() if token else None
        self._session = (
            hmac.new(token.encode(), b"agentgrad-dashboard-session", hashlib.sha256).hexdigest() if token else None
        )

    @property
    def enabled(self) -> bool:
        return self._bearer is not None

    @property
    def session_value(self) -> str | None:
        """The cookie value a successful login sets."""
        return self._session

    def allows(self, request: Request) -> bool:
        """True when no token is set, or the request carries it (header or login cookie)."""
        if self._bearer is None or self._session is None:
            return True
        header = request.headers.get("authorization", "").encode()
        if header and hmac.compare_digest(header, self._bearer):
            return True
        cookie = request.cookies.get(COOKIE_NAME, "").encode()
        return bool(cookie) and hmac.compare_digest(cookie, self._session.encode())

    def login_attempt(self, request: Request) -> bool | None:
        """None without a ``?token=`` parameter, else whether it is the right token."""
        given = request.query_params.get("token")
        if given is None or self._bearer is None:
            return None
        return hmac.compare_digest(f"Bearer {given}".encode(), self._bearer)


def url_without_token(request: Request) -> str:
    """The request's path and query, minus the ``token`` parameter."""
    query = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
    return request.url.path + (f"?{urlencode(query)}" if query else "")

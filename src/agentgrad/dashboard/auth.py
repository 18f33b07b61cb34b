"""The dashboard's token gate.

With a token configured, a request sees data only if it proves it knows the token:

* ``Authorization: Bearer <token>`` (scripts, ``curl``), or
* a session cookie set by the ``?token=<token>`` login (browsers). The login answers with a
  redirect to the same URL without the token, so it leaves no trace in the address bar or in
  the history. The cookie holds an HMAC of the token, never the token itself, and is HttpOnly.

Every comparison is constant-time (:func:`hmac.compare_digest`; the bearer header through
:func:`agentgrad.http.guard.bearer_matches`, the one check of every server's token). The ``Host``
check, the body limit and the warning on a token-less public bind are the gate's
(:mod:`agentgrad.http.guard`), in front of the dashboard wherever it is served.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from agentgrad.http.guard import bearer_matches

if TYPE_CHECKING:
    from starlette.requests import Request

COOKIE_NAME = "agentgrad_dashboard"


class TokenGate:
    """Decides whether a request may see data; ``token=None`` lets everyone in."""

    def __init__(self, token: str | None) -> None:
        self._token = token or None
        self._session = (
            hmac.new(token.encode(), b"agentgrad-dashboard-session", hashlib.sha256).hexdigest() if token else None
        )

    @property
    def enabled(self) -> bool:
        return self._token is not None

    @property
    def session_value(self) -> str | None:
        """The cookie value a successful login sets."""
        return self._session

    def allows(self, request: Request) -> bool:
        """True when no token is set, or the request carries it (header or login cookie)."""
        if self._token is None or self._session is None:
            return True
        header = request.headers.get("authorization", "").encode()
        if header and bearer_matches(header, self._token):
            return True
        cookie = request.cookies.get(COOKIE_NAME, "").encode()
        return bool(cookie) and hmac.compare_digest(cookie, self._session.encode())

    def login_attempt(self, request: Request) -> bool | None:
        """None without a ``?token=`` parameter, else whether it is the right token."""
        given = request.query_params.get("token")
        if given is None or self._token is None:
            return None
        return hmac.compare_digest(given.encode(), self._token.encode())


def url_without_token(request: Request) -> str:
    """The request's path and query, minus the ``token`` parameter."""
    query = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
    return request.url.path + (f"?{urlencode(query)}" if query else "")

"""The store service's answers: JSON bodies, and every error as ``{error, message, fields}``.

Shared by the ``/v1`` store API (:mod:`agentgrad.store.service.api`) and the FastAPI side of the service
(auth gate, OTLP, framework errors), so a client sees one error format whichever answered.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from starlette.responses import Response

from agentgrad.errors import AgentGradError
from agentgrad.store import wire

log = logging.getLogger(__name__)

JSON = "application/json"

#: Error kinds of the framework's own HTTP errors, by status.
HTTP_KINDS = {401: "unauthorized", 404: "no_such_endpoint", 405: "method_not_allowed", 413: "payload_too_large"}


def json_response(body: bytes | str, status: int = 200) -> Response:
    return Response(body, status, media_type=JSON)


def error_response(
    status: int, kind: str, message: str, fields: dict[str, Any] | None = None, headers: dict[str, str] | None = None
) -> Response:
    body = wire.ErrorBody(error=kind, message=message, fields=fields or {})
    return Response(body.model_dump_json(), status, headers=headers, media_type=JSON)


def store_error(exc: AgentGradError) -> Response:
    """A store exception as the status and body the client turns back into the same exception."""
    kind = next((wire.KIND_OF_ERROR[cls] for cls in type(exc).__mro__ if cls in wire.KIND_OF_ERROR), None)
    if kind is None:  # StoreFileError and friends: the server's problem, not the caller's
        log.error("store error: %s", exc)
        return error_response(500, "store_error", f"{type(exc).__name__}: {exc}")
    fields = {k: v for k, v in vars(exc).items() if isinstance(v, (str, int, float, bool, type(None)))}
    return error_response(wire.ERROR_KINDS[kind][0], kind, str(exc), fields)


def validation_error(errors: Sequence[Any], where: str) -> Response:
    """422 naming the first few offending fields (pydantic error dicts), e.g. ``rollouts.0.mode``."""
    parts = []
    for error in errors[:5]:
        location = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
        message = plain_message(error)
        parts.append(f"{location}: {message}" if location else message)
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return error_response(
        422, "validation_error", f"invalid {where}: " + "; ".join(parts) + more, {"errors": len(errors)}
    )


def plain_message(error: Any) -> str:
    """A pydantic error's message (an item of ``ValidationError.errors()``), in words where
    pydantic's would show a regular expression."""
    message = error.get("msg", "invalid")
    if error.get("type") == "string_pattern_mismatch" and "\\x00" in message:  # types.Key, types.Name
        return "must not contain a NUL character (\\u0000)"
    return message

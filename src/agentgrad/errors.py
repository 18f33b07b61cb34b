"""Exceptions with messages that name what went wrong, so users can act on them."""

from __future__ import annotations

from collections.abc import Iterable


class AgentGradError(Exception):
    """Base class of every error AgentGrad raises on purpose."""


class NotFoundError(AgentGradError, KeyError):
    """An id (rollout, attempt, resources…) that the store does not know."""

    def __init__(self, kind: str, ident: str, where: str = "") -> None:
        self.kind, self.ident = kind, ident
        super().__init__(f"{kind} {ident!r}{where} not found")

    def __str__(self) -> str:  # KeyError would quote the whole message
        return self.args[0]


class InvalidTransitionError(AgentGradError, ValueError):
    """A status change that the state machine forbids; names both states."""

    def __init__(self, kind: str, ident: str, current: str, requested: str) -> None:
        self.current, self.requested = current, requested
        super().__init__(f"{kind} {ident!r} cannot go from {current!r} to {requested!r}")


class InvalidInputError(AgentGradError, ValueError):
    """Input refused before anything was stored (e.g. a task that is not JSON)."""


class AgentImportError(InvalidInputError):
    """An agent's module could not be imported here (it, or a framework it imports, is missing):
    a trainer whose runners run elsewhere can go on without it."""


class IdempotencyKeyReusedError(InvalidInputError):
    """An idempotency key sent again with a different request: a key names one request, and
    only an exact retry may repeat it (``key`` and ``operation`` name the two)."""

    def __init__(self, message: str, *, key: str, operation: str) -> None:
        self.key, self.operation = key, operation
        super().__init__(message)


class AlreadyExistsError(AgentGradError, ValueError):
    """An id that must be unique is taken (rollout ids, resources ids)."""


class StoreFileError(AgentGradError):
    """A store file that is corrupt, or belongs to something else."""


class NoRolloutContextError(AgentGradError, RuntimeError):
    """An emitter was called outside a running rollout."""


class TemplateError(InvalidInputError):
    """A prompt template that cannot be used: a syntax error, or variables nobody supplies.

    ``missing`` holds variables the template reads but nobody supplies; ``dropped`` holds
    required variables it no longer reads (both empty for syntax errors).
    """

    def __init__(self, message: str, missing: Iterable[str] = (), dropped: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.missing = sorted(missing)
        self.dropped = sorted(dropped)

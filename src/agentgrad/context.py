"""The rollout an agent is running in, carried by a context variable.

The runner sets it around each rollout; emitters, the openai-client instrumentation and the
``agent("name")`` scope read it. A context variable (not a global) keeps concurrent rollouts in
one process — async tasks or threads — apart.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from agentgrad.errors import NoRolloutContextError

if TYPE_CHECKING:
    from agentgrad.store.protocol import Store
    from agentgrad.types import Attempt, Rollout


@dataclass(frozen=True)
class RolloutContext:
    """Where spans of the running code belong."""

    store: Store
    rollout: Rollout
    attempt: Attempt
    #: Innermost ``agent("name")`` scope, else the rollout's agent name; tagged onto spans and
    #: LLM calls.
    agent_name: str | None = None
    #: True inside an ``agent("name")`` scope: the user's name then wins over the one inferred
    #: from an agent framework (:mod:`agentgrad.tracing.agent_names`), the rollout's does not.
    agent_scoped: bool = False
    #: The span id of the innermost ``operation``/``agent`` scope, parent of new spans.
    parent_span_id: str | None = None
    #: A per-rollout trace id so all spans of an attempt form one trace.
    trace_id: str = field(default="")

    @property
    def rollout_id(self) -> str:
        return self.rollout.rollout_id

    @property
    def attempt_id(self) -> str:
        return self.attempt.attempt_id


_current: contextvars.ContextVar[RolloutContext | None] = contextvars.ContextVar("agentgrad_rollout", default=None)


def current_context() -> RolloutContext | None:
    """The running rollout's context, or None outside a rollout."""
    return _current.get()


def require_context(what: str) -> RolloutContext:
    """The running rollout's context; raises a message naming the caller outside a rollout."""
    context = _current.get()
    if context is None:
        raise NoRolloutContextError(
            f"{what}() was called outside a rollout: call it from an agent that a runner, "
            "Trainer.dev() or Trainer.fit() is running"
        )
    return context


@contextlib.contextmanager
def use_context(context: RolloutContext) -> Iterator[RolloutContext]:
    """Run a block inside ``context`` (the runner wraps each rollout in this)."""
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)


@contextlib.contextmanager
def scoped(**changes: object) -> Iterator[RolloutContext]:
    """Run a block with some fields of the current context changed (agent name, parent span)."""
    context = require_context("scoped")
    with use_context(replace(context, **changes)) as inner:  # type: ignore[arg-type]
        yield inner

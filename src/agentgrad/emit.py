"""Emitters: what an agent can record about its own run, as spans of the current attempt.

They write straight to the store of the running rollout (see :mod:`agentgrad.context`), so a
crash right after an emit loses nothing, and every span doubles as a heartbeat. Calling one
outside a rollout raises :class:`~agentgrad.errors.NoRolloutContextError` — except the
``agent()`` scope, which is then a no-op so that instrumented agent code runs in production.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import json
import logging
import traceback
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from agentgrad import semconv
from agentgrad.context import RolloutContext, current_context, require_context, scoped
from agentgrad.rewards import reward_number
from agentgrad.types import Span, SpanStatus, new_id, now

log = logging.getLogger(__name__)


def _span(context: RolloutContext, name: str, attributes: dict[str, Any], **fields: Any) -> Span:
    if context.agent_name is not None:
        attributes.setdefault(semconv.AGENT_NAME, context.agent_name)
    fields.setdefault("end_time", now())
    return Span(
        rollout_id=context.rollout_id,
        attempt_id=context.attempt_id,
        trace_id=context.trace_id or context.attempt_id.replace("-", "").ljust(32, "0")[:32],
        parent_id=context.parent_span_id,
        name=name,
        attributes=attributes,
        **fields,
    )


def _write(context: RolloutContext, span: Span) -> Span:
    return context.store.add_span(span)


def _reward_number(value: Any, what: str) -> float:
    """The rule is :func:`agentgrad.rewards.reward_number`; an emitter raises on a refused value."""
    number = reward_number(value)
    if number is None:
        raise TypeError(
            f"{what} must be a finite number (an int or float, not a bool), got {value!r} ({type(value).__name__})"
        )
    return number


#: Dimension names whose attribute keys would collide with the reward value / primary keys.
_RESERVED_DIMENSIONS = frozenset(
    {
        semconv.REWARD_VALUE[len(semconv.REWARD_PREFIX) :],
        semconv.REWARD_PRIMARY[len(semconv.REWARD_PREFIX) :],
    }
)


def emit_reward(value: float | Mapping[str, float], *, primary: str | None = None) -> Span:
    """Record a reward for the current attempt.

    ``value`` is a number, or named dimensions (``{"correct": 1.0, "short": 0.2}``) of which
    ``primary`` is the one training optimizes (required when there is more than one). The last
    reward emitted is the rollout's reward.
    """
    context = require_context("emit_reward")
    return _write(context, _reward_span(context, value, primary))


def reward_span(value: float | Mapping[str, float], *, primary: str | None = None) -> Span:
    """The span :func:`emit_reward` writes, built but not written: for a writer that stores it
    with something else in one transaction (the runner: with the attempt's success)."""
    return _reward_span(require_context("reward_span"), value, primary)


def _reward_span(context: RolloutContext, value: float | Mapping[str, float], primary: str | None) -> Span:
    attributes: dict[str, Any] = {}
    if isinstance(value, Mapping):
        dims = {str(k): _reward_number(v, f"reward dimension {k!r}") for k, v in value.items()}
        if not dims:
            raise ValueError("emit_reward() got no reward dimensions")
        reserved = sorted(set(dims) & _RESERVED_DIMENSIONS)
        if reserved:
            raise ValueError(
                f"reward dimension name(s) {reserved} are reserved (they would overwrite "
                f"{semconv.REWARD_VALUE} / {semconv.REWARD_PRIMARY}): rename them"
            )
        if primary is None:
            if len(dims) > 1:
                raise ValueError(f"emit_reward() got dimensions {sorted(dims)}: say which is primary=")
            primary = next(iter(dims))
        if primary not in dims:
            raise ValueError(f"primary reward {primary!r} is not among the dimensions {sorted(dims)}")
        attributes.update({semconv.REWARD_PREFIX + k: v for k, v in dims.items()})
        attributes[semconv.REWARD_PRIMARY] = primary
        attributes[semconv.REWARD_VALUE] = dims[primary]
    else:
        attributes[semconv.REWARD_VALUE] = _reward_number(value, "reward")
    return _span(context, semconv.SPAN_REWARD, attributes)


def emit_message(message: str, **attributes: Any) -> Span:
    """Record a free-form log line (shown in the dashboard's span tree)."""
    context = require_context("emit_message")
    return _write(context, _span(context, semconv.SPAN_MESSAGE, {semconv.MESSAGE_BODY: str(message), **attributes}))


def emit_object(obj: Any, **attributes: Any) -> Span:
    """Record any JSON-serializable value (pydantic models are dumped first)."""
    context = require_context("emit_object")
    payload = obj.model_dump(mode="json") if hasattr(obj, "model_dump") else obj
    try:
        text = json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"emit_object() needs a JSON-serializable value, got {type(obj).__name__}: {exc}") from None
    attrs = {semconv.OBJECT_JSON: text, semconv.OBJECT_TYPE: type(obj).__name__, **attributes}
    return _write(context, _span(context, semconv.SPAN_OBJECT, attrs))


def emit_exception(exc: BaseException, **attributes: Any) -> Span:
    """Record an exception the agent handled (unhandled ones fail the attempt anyway)."""
    context = require_context("emit_exception")
    attrs = {
        semconv.EXCEPTION_TYPE: type(exc).__name__,
        semconv.EXCEPTION_MESSAGE: str(exc),
        semconv.EXCEPTION_STACKTRACE: "".join(traceback.format_exception(exc)),
        **attributes,
    }
    status = SpanStatus(status_code="ERROR", description=str(exc))
    return _write(context, _span(context, semconv.SPAN_EXCEPTION, attrs, status=status))


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value, allow_nan=False)
        return value
    except (TypeError, ValueError):
        return repr(value)


class _Scope:
    """A span that covers a block: opened on enter, written on exit with its outcome."""

    def __init__(self, what: str, span_name: str, attributes: dict[str, Any], **context_changes: Any) -> None:
        self._what, self._span_name, self._attributes = what, span_name, attributes
        self._changes = context_changes
        self._output: Any = None
        self._has_output = False

    def set_output(self, value: Any) -> None:
        """Attach the block's result to the span."""
        self._output, self._has_output = value, True

    @contextlib.contextmanager
    def _run(self) -> Iterator[_Scope]:
        context = require_context(self._what)
        span_id = new_id("sp")
        started = now()
        status = SpanStatus(status_code="OK")
        try:
            with scoped(parent_span_id=span_id, **self._changes):
                yield self
        except BaseException as exc:
            status = SpanStatus(status_code="ERROR", description=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            attributes = dict(self._attributes)
            if self._has_output:
                attributes[semconv.OPERATION_OUTPUT] = _jsonable(self._output)
            inner = dataclasses.replace(context, **self._changes)
            _write(
                context, _span(inner, self._span_name, attributes, span_id=span_id, start_time=started, status=status)
            )


class operation:  # noqa: N801 - used like a function: @operation / with operation("name")
    """Record a block or a function call as a span (inputs, output, duration, error).

    Use as ``@operation``, ``@operation("name")`` or ``with operation("name", **inputs) as op:``
    (then ``op.set_output(value)``). Spans emitted inside become its children.
    """

    def __init__(self, name: str | Callable[..., Any] | None = None, /, **inputs: Any) -> None:
        # Positional-only: recorded inputs may themselves be called ``name`` or ``self``.
        self._func: Callable[..., Any] | None = None
        if callable(name):
            self._func, name = name, getattr(name, "__qualname__", None)
            functools.update_wrapper(self, self._func)
        self.name = name or "operation"
        self.inputs = inputs
        self._open: list[contextlib.AbstractContextManager[_Scope]] = []

    def __enter__(self) -> _Scope:
        attributes: dict[str, Any] = {semconv.OPERATION_NAME: self.name}
        if self.inputs:
            attributes[semconv.OPERATION_INPUT] = _jsonable(self.inputs)
        manager = _Scope("operation", semconv.SPAN_OPERATION, attributes)._run()
        self._open.append(manager)
        return manager.__enter__()

    def __exit__(self, *exc: Any) -> bool | None:
        return self._open.pop().__exit__(*exc)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._func is None:  # @operation("name"): this call receives the function
            (func,) = args
            wrapped = operation(func)
            wrapped.name = self.name
            return wrapped
        return _call_recorded(self.name, self._func, args, kwargs)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        # Decorated methods: bind like a function would.
        return self if instance is None else functools.partial(self.__call__, instance)


def _call_recorded(name: str, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    try:
        bound = inspect.signature(func).bind_partial(*args, **kwargs)
        inputs = {k: v for k, v in bound.arguments.items() if k not in ("self", "cls")}
    except (TypeError, ValueError):
        inputs = {"args": args, "kwargs": kwargs}
    op = operation(name, **inputs)
    if inspect.iscoroutinefunction(func):

        async def run_async() -> Any:
            with op as scope:
                result = await func(*args, **kwargs)
                scope.set_output(result)
                return result

        return run_async()
    with op as scope:
        result = func(*args, **kwargs)
        scope.set_output(result)
        return result


@contextlib.contextmanager
def agent(name: str) -> Iterator[None]:
    """Tag everything inside — spans, emitted rewards and LLM calls — with an agent name.

    In a multi-agent system this is what lets training pick the agents to improve
    (``agent_match``). Scopes nest; the innermost name wins, and a scope's name wins over the
    one inferred from an agent framework (docs/multi-agent.md). Most agents need no scope: the
    framework's own agent names are found without one.

    Outside a rollout (the agent running in production, or in a unit test) it does nothing but
    log at debug level, so code instrumented with it runs anywhere.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"agent() needs a non-empty name, got {name!r}")
    if current_context() is None:
        log.debug("agentgrad.agent(%r) outside a rollout: nothing is recorded", name)
        yield
        return
    scope = _Scope("agent", semconv.SPAN_AGENT, {semconv.AGENT_NAME: name}, agent_name=name, agent_scoped=True)
    with scope._run():
        yield

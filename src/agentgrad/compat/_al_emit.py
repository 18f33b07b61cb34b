"""Agent Lightning's emitters, reward helpers and ``setup_logging`` over AgentGrad's.

Every emitter writes a span into the running rollout's store at once (AgentGrad's
:mod:`agentgrad.emit`); the Agent Lightning keywords that have no AgentGrad meaning are refused,
naming what to use, never dropped.
"""

from __future__ import annotations

import functools
import inspect
import logging
import logging.config
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from agentgrad import emit, semconv
from agentgrad.adapters.credit import reward_value
from agentgrad.compat._al_types import UnsupportedError
from agentgrad.types import Span

F = TypeVar("F", bound=Callable[..., Any])


def _check_propagate(name: str, propagate: bool) -> None:
    if not propagate:
        raise UnsupportedError(
            f"{name}(propagate=False) is not supported: AgentGrad writes every emitted span into "
            "the rollout's store at once; build the value yourself if you do not want it recorded"
        )


def emit_reward(
    reward: float | Mapping[str, float],
    *,
    primary_key: str | None = None,
    attributes: Mapping[str, Any] | None = None,
    propagate: bool = True,
) -> Span:
    """``agl.emit_reward``: a number, or named dimensions with ``primary_key`` (AgentGrad's
    ``primary=``). ``attributes`` are refused (record them with ``agl.emit_object``); a bool is
    refused as a reward (AgentGrad's rule: ``1.0 if ok else 0.0`` says what is meant)."""
    _check_propagate("emit_reward", propagate)
    if attributes:
        raise UnsupportedError(
            "emit_reward(attributes=...) is not supported: AgentGrad links a reward to the LLM "
            "call it follows by order; record extra data with agl.emit_object(...)"
        )
    if isinstance(reward, Mapping) and primary_key is None:
        raise ValueError("emit_reward() of a dict needs primary_key= (the dimension training optimizes)")
    return emit.emit_reward(reward, primary=primary_key)


def emit_message(message: str, attributes: Mapping[str, Any] | None = None, propagate: bool = True) -> Span:
    """``agl.emit_message``: a log line as a span of the rollout."""
    _check_propagate("emit_message", propagate)
    return emit.emit_message(message, **dict(attributes or {}))


def emit_object(object: Any, attributes: Mapping[str, Any] | None = None, propagate: bool = True) -> Span:
    """``agl.emit_object``: a JSON value as a span of the rollout."""
    _check_propagate("emit_object", propagate)
    return emit.emit_object(object, **dict(attributes or {}))


def emit_exception(
    exception: BaseException, attributes: Mapping[str, Any] | None = None, propagate: bool = True
) -> Span:
    """``agl.emit_exception``: a handled exception as a span of the rollout."""
    _check_propagate("emit_exception", propagate)
    return emit.emit_exception(exception, **dict(attributes or {}))


def reward(fn: F) -> F:
    """``@agl.reward``: the function's result (a number) is emitted as a reward, and returned."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def wrapper_async(*args: Any, **kwargs: Any) -> Any:
            result = await fn(*args, **kwargs)
            emit_reward(result)
            return result

        return wrapper_async  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        emit_reward(result)
        return result

    return wrapper  # type: ignore[return-value]


def get_reward_value(span: Span) -> float | None:
    """The reward a span records (its primary dimension), or None when it is no reward span."""
    return reward_value(span) if span.name == semconv.SPAN_REWARD else None


def is_reward_span(span: Span) -> bool:
    return get_reward_value(span) is not None


def find_reward_spans(spans: Sequence[Span]) -> list[Span]:
    return [span for span in spans if is_reward_span(span)]


def find_final_reward(spans: Sequence[Span]) -> float | None:
    """The last reward among ``spans`` (in the order given: the store's), or None."""
    for span in reversed(spans):
        value = get_reward_value(span)
        if value is not None:
            return value
    return None


def setup_logging(
    level: int | str = "INFO",
    *,
    console: bool = True,
    color: bool | Mapping[str, Any] = True,
    propagate: bool = False,
    disable_existing_loggers: bool = False,
    capture_warnings: bool = False,
    submodule_levels: Mapping[str, int | str] | None = None,
    extra_handlers: Sequence[logging.Handler] | None = None,
    formatter: logging.Formatter | None = None,
    apply_to: Sequence[str] | None = None,
    files: str | Mapping[str, str] | None = None,
) -> None:
    """``agl.setup_logging``: configure the ``agentlightning`` logger and the ``apply_to`` ones at
    ``level``, to the console (rich when ``color``) and/or ``files``, as Agent Lightning does,
    without touching the root logger. AgentGrad's own ``agentgrad`` loggers are left as they are
    (``agentgrad -v``, or ``logging.getLogger("agentgrad")``)."""
    if disable_existing_loggers:
        logging.config.dictConfig({"version": 1, "disable_existing_loggers": True})
    handlers: list[logging.Handler] = list(extra_handlers or [])
    if console:
        if color:
            from rich.logging import RichHandler

            handlers.append(RichHandler(rich_tracebacks=False))
        else:
            handlers.append(logging.StreamHandler())
    targets = ["agentlightning", *(apply_to or [])]
    file_for: dict[str, str] = {}
    if isinstance(files, str):
        file_for = dict.fromkeys(targets, files)
    elif files:
        file_for = dict(files)
    for name in targets:
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.propagate = propagate
        for handler in handlers + ([logging.FileHandler(file_for[name])] if name in file_for else []):
            if formatter is not None:
                handler.setFormatter(formatter)
            if handler not in logger.handlers:
                logger.addHandler(handler)
    for name, sub_level in (submodule_levels or {}).items():
        logging.getLogger(name).setLevel(sub_level)
    logging.captureWarnings(capture_warnings)

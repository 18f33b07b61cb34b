"""Refuse values that cannot be stored as JSON, naming the exact field that is wrong, and
normalize the rest to what a JSON round trip gives; parse JSON bodies with bounded nesting.

Nesting is bounded twice, so that whatever is stored can always be read back: a request body
may nest at most :data:`MAX_BODY_DEPTH` levels (the limit of pydantic's JSON parser, which reads
every store record and every answer of the service), and a stored JSON value (a task input,
metadata, span attributes, a resource) at most :data:`MAX_VALUE_DEPTH`, far enough below it that
the records and answers that wrap it stay readable too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import pydantic_core
from pydantic import BaseModel

from agentgrad.errors import InvalidInputError
from agentgrad.types import Span

#: Exact types that JSON hands back unchanged. Subclasses (enums, ``OrderedDict``…) are not
#: here on purpose: JSON turns them into their base type, so they take the conversion path.
_UNCHANGED = frozenset({str, int, bool, type(None)})
#: Exact types of a flat list of numbers (token ids, logprobs): checked without a Python loop.
_NUMBERS = frozenset({int, float, bool})
#: Containers shorter than this are walked directly: below it the C check costs more than it saves.
_FLAT_CHECK_MIN = 16
#: The deepest nesting a request body may have: pydantic's JSON parser refuses deeper documents
#: (and :func:`loads` applies the same limit to bodies parsed without a model).
MAX_BODY_DEPTH = 200
#: The deepest nesting a stored JSON value may have (refused beyond, naming the field; a cycle is
#: refused the same way).
MAX_VALUE_DEPTH = 100


class _NotJson(Exception):
    """Raised inside the walk; :func:`normalize_json` turns it into a named-field error."""


def normalize_json(value: Any, field: str, where: str = "") -> Any:
    """``value`` as JSON would return it (tuples → lists, int keys → strings), or
    :class:`InvalidInputError` naming the first field that is not JSON.

    Normalizing once at the edge makes every backend return exactly the same data. Values that
    are already plain JSON (the usual case) come back as the same object, checked in one walk
    with no copy; only the parts that JSON would change are converted (through ``json`` itself,
    so the result is exactly what a round trip gives). Storing a private copy is the backend's
    job. Only a failure walks the value again to name the offending path
    (``input.steps[2].tool``).
    """
    try:
        return _normalized(value, 0)
    except (_NotJson, TypeError, ValueError, RecursionError):
        pass
    path, problem = _first_problem(value, field)
    if len(path) > 120:  # a deep path: its start says where, its end how it continues
        path = f"{path[:80]}…{path[-30:]}"
    raise InvalidInputError(f"{where}field {path!r} is not JSON-serializable: {problem}")


def loads(body: bytes | str) -> Any:
    """Parse a JSON request body that no pydantic model reads (OTLP/JSON), with the same
    bounds as the service's models: at most :data:`MAX_BODY_DEPTH` levels of nesting, numbers
    of at most 4,300 digits, no lone surrogate in a string. :class:`InvalidInputError` otherwise,
    never a ``RecursionError``."""
    try:
        return pydantic_core.from_json(body)
    except ValueError as exc:
        raise InvalidInputError(f"body is not valid JSON: {exc}") from None


def normalize_field(model: BaseModel, field: str, label: str, where: str = "") -> Any:
    """Normalize one JSON field of ``model`` in place (see :func:`normalize_json`).

    Assigns only when normalizing changed the value: pydantic's ``__setattr__`` costs more
    than the check, on every span.
    """
    value = getattr(model, field)
    normalized = normalize_json(value, label, where)
    if normalized is not value:
        setattr(model, field, normalized)
    return normalized


def normalize_span(span: Span, index: int | None) -> None:
    """Normalize a span's JSON fields in place and refuse non-finite times; ``index`` is its
    place in a batch, for the error message.

    Every store runs this on the spans it is given, and the HTTP client runs it before sending:
    a normalized span is exactly what its JSON round trip would be, so the client can answer
    with its own span and the service need not send the span back.

    A NaN or infinite time would be stored as JSON ``null``, which no longer reads back as a
    span; refusing it here keeps one bad span from poisoning every later read of its rollout.
    """
    try:
        normalize_field(span, "attributes", "attributes")
        if span.resource:  # the usual empty default needs no walk
            normalize_field(span, "resource", "resource")
        if not (math.isfinite(span.start_time) and (span.end_time is None or math.isfinite(span.end_time))):
            _check_finite(span.start_time, "start_time")
            _check_finite(span.end_time, "end_time")
        for number, event in enumerate(span.events):
            normalize_field(event, "attributes", f"events[{number}].attributes")
            _check_finite(event.timestamp, f"events[{number}].timestamp")
    except InvalidInputError as exc:  # name the span only when something is wrong
        where = f"span {index} ({span.name}): " if index is not None else f"span {span.name!r}: "
        raise InvalidInputError(f"{where}{exc}") from None


def normalized_spans(spans: Sequence[Span | dict[str, Any]]) -> list[Span]:
    """Spans as given (models or their dicts), parsed and each normalized (:func:`normalize_span`),
    a batch's error naming the span's place in it."""
    parsed = [s if isinstance(s, Span) else Span.model_validate(s) for s in spans]
    for index, span in enumerate(parsed):
        normalize_span(span, index if len(parsed) > 1 else None)
    return parsed


def _check_finite(value: float | None, field: str) -> None:
    if value is not None and not math.isfinite(value):
        raise InvalidInputError(f"field {field!r} must be a finite number, got {value}")


def _normalized(value: Any, depth: int) -> Any:
    """``value`` itself when JSON hands it back unchanged, else a converted copy of the parts
    that change; raises on values JSON refuses."""
    kind = type(value)
    if kind in _UNCHANGED:
        return value
    if kind is float:
        if math.isfinite(value):
            return value
        raise _NotJson
    if kind is dict or kind is list:
        if depth >= MAX_VALUE_DEPTH:
            raise _NotJson
        if (
            len(value) >= _FLAT_CHECK_MIN
            and _is_flat_json(value if kind is list else value.values())
            and (kind is list or _has_str_keys(value))
        ):
            return value
        copy: Any = None
        for key, item in value.items() if kind is dict else enumerate(value):
            if kind is dict and type(key) is not str:
                break  # JSON's own key conversions, below
            if type(item) in _UNCHANGED:
                continue
            normalized = _normalized(item, depth + 1)
            if normalized is not item:
                if copy is None:
                    copy = kind(value)
                copy[key] = normalized
        else:
            return value if copy is None else copy
    # JSON's own conversions (tuples, non-string keys, subclasses), then the walk over the plain
    # result, which bounds its nesting.
    return _normalized(json.loads(json.dumps(value, allow_nan=False)), depth)


def _is_flat_json(items: Any) -> bool:
    """Whether ``items`` are all scalars JSON hands back unchanged, checked in C: long flat lists
    (token ids, logprobs) are what spans of LLM calls carry, and a Python loop over them was a
    large share of the store service's time per span. False only means "walk it"."""
    kinds = set(map(type, items))
    if kinds <= _UNCHANGED:
        return True
    if kinds <= _NUMBERS:
        # A sum of finite floats is finite or raises OverflowError; any NaN or infinity makes
        # it non-finite (or raises ValueError for inf - inf).
        try:
            return math.isfinite(math.fsum(items))
        except (OverflowError, ValueError):
            return False
    return False


def _has_str_keys(value: dict[Any, Any]) -> bool:
    return set(map(type, value)) <= {str}


def _first_problem(value: Any, path: str, depth: int = 0) -> tuple[str, str]:
    if depth >= MAX_VALUE_DEPTH and isinstance(value, (dict, list, tuple)):
        return path, f"nested too deeply (more than {MAX_VALUE_DEPTH} levels, or circular)"
    if value is None or isinstance(value, (str, bool, int)):
        return path, "ok"
    if isinstance(value, float):
        return (path, "ok") if math.isfinite(value) else (path, f"non-finite number {value}")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                return f"{path}.{key!r}", f"key of type {type(key).__name__}"
            found = _first_problem(item, f"{path}.{key}", depth + 1)
            if found[1] != "ok":
                return found
        return path, "ok"
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = _first_problem(item, f"{path}[{index}]", depth + 1)
            if found[1] != "ok":
                return found
        return path, "ok"
    return path, f"value of type {type(value).__name__}"

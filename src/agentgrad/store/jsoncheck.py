"""Refuse values that cannot be stored as JSON, naming the exact field that is wrong."""

from __future__ import annotations

import json
import math
from typing import Any

from agentgrad.errors import InvalidInputError

#: Exact types that JSON hands back unchanged. Subclasses (enums, ``OrderedDict``…) are not
#: here on purpose: JSON turns them into their base type, so they take the conversion path.
_UNCHANGED = frozenset({str, int, bool, type(None)})
#: Below this depth the walk recurses in Python; deeper values (or cycles) are left to the C
#: encoder, which checks circularity and recursion limits itself.
_MAX_WALK_DEPTH = 100


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
    raise InvalidInputError(f"{where}field {path!r} is not JSON-serializable: {problem}")


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
    if depth < _MAX_WALK_DEPTH and (kind is dict or kind is list):
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
    return json.loads(json.dumps(value, allow_nan=False))


def _first_problem(value: Any, path: str, depth: int = 0) -> tuple[str, str]:
    if depth > 200:
        return path, "nested too deeply (or circular)"
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

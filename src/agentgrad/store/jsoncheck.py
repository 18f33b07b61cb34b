"""Refuse values that cannot be stored as JSON, naming the exact field that is wrong."""

from __future__ import annotations

import json
import math
from typing import Any

from agentgrad.errors import InvalidInputError


def normalize_json(value: Any, field: str, where: str = "") -> Any:
    """``value`` as JSON would return it (tuples → lists, int keys → strings), or
    :class:`InvalidInputError` naming the first field that is not JSON.

    Normalizing once at the edge makes every backend return exactly the same data. The fast
    path is C-level ``json.dumps``/``loads``; only a failure walks the value to find the
    offending path (``input.steps[2].tool``).
    """
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError):
        pass
    path, problem = _first_problem(value, field)
    raise InvalidInputError(f"{where}field {path!r} is not JSON-serializable: {problem}")


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

"""JSON in and out of the proxy's hot path: orjson when installed (several times faster), else json."""

from __future__ import annotations

import json
from typing import Any

try:  # optional: not a dependency of the proxy
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None


def loads(raw: bytes) -> Any:
    """``json.loads``, via orjson when installed (falling back for what it refuses: NaN, huge ints)."""
    if _orjson is not None:
        try:
            return _orjson.loads(raw)
        except _orjson.JSONDecodeError:
            pass
    return json.loads(raw)


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON, via orjson when installed."""
    if _orjson is not None:
        try:
            return _orjson.dumps(obj)
        except TypeError:
            pass
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()

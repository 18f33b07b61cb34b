"""JSON request bodies in and out of the proxy and the model server: fast (orjson when installed)
and safe to hand to any code after it.

:func:`parse_object` refuses, with :class:`BadJson` (a 400 for the server), what parses but breaks
later code with a 500: nesting beyond :data:`MAX_DEPTH` (recursive code — the JSON encoder, a
chat template, the store's serializer — would hit Python's recursion limit) and a lone UTF-16
surrogate in a string (``"\\ud800"`` is valid JSON, but no UTF-8 encoder takes it: tokenizers and
span writers would fail); and ``NaN``/``Infinity``, which Python's parser takes but JSON does not
have: the store refuses such a value, so a call made with ``temperature: NaN`` would be answered
and then lost from the trace.
"""

from __future__ import annotations

import json
import re
from typing import Any

try:  # optional: not a dependency of the package
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None  # type: ignore[assignment]

#: The deepest nesting of arrays and objects a request body may have (tool JSON schemas use ~10).
MAX_DEPTH = 128
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class BadJson(ValueError):
    """A request body that is not a JSON object any later code can take; the message says why."""


def loads(raw: bytes | str, *, strict: bool = False) -> Any:
    """``json.loads``, via orjson when installed (falling back for what it refuses: huge ints, and
    NaN/Infinity — which ``strict`` refuses too, with :class:`BadJson`, as JSON has no such number)."""
    if _orjson is not None:
        try:
            return _orjson.loads(raw)
        except _orjson.JSONDecodeError:
            pass
    return json.loads(raw, parse_constant=_refuse_constant) if strict else json.loads(raw)


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON, via orjson when installed."""
    if _orjson is not None:
        try:
            return _orjson.dumps(obj)
        except TypeError:
            pass
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def parse_object(raw: bytes, *, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """The JSON object in ``raw``; :class:`BadJson` for anything else (see the module doc)."""
    try:
        body = loads(raw, strict=True)
    except RecursionError:
        raise BadJson(f"request body is nested too deeply (more than {max_depth} levels)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadJson(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadJson(f"request body must be a JSON object, got {type(body).__name__}")
    # Cheap tests first: fewer brackets than the limit cannot nest deeper than it, and a lone
    # surrogate can only arrive as a \uD8xx-\uDFxx escape (raw surrogate bytes are not UTF-8).
    deep = raw.count(b"[") + raw.count(b"{") > max_depth
    surrogates = _SURROGATE_ESCAPE.search(raw) is not None
    if deep or surrogates:
        _check(body, max_depth if deep else None, surrogates)
    return body


def _refuse_constant(name: str) -> Any:
    raise BadJson(f"request body has {name}, which is not a JSON number: send a finite number")


def _check(body: Any, max_depth: int | None, surrogates: bool) -> None:
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if max_depth is not None and depth > max_depth:
            raise BadJson(f"request body is nested too deeply (more than {max_depth} levels)")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if surrogates:
                for text in (key, item):
                    if isinstance(text, str) and not _encodable(text):
                        raise BadJson(
                            "request body has a string with a lone UTF-16 surrogate "
                            "(\\ud800-\\udfff without its pair): not valid Unicode"
                        )
            if isinstance(item, (dict, list)):
                stack.append((item, depth + 1))


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True

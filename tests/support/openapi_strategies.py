"""Hypothesis strategies for requests built from an OpenAPI document (the store service's own
``/openapi.json``), for the schema-driven fuzz tests.

Values follow each operation's JSON schema, and stray from it on purpose: every field may be any
JSON instead, integers probe their bounds and 64 bits (``2**63``, ``2**70``), numbers include
``NaN`` and ``Infinity`` (sent as the bare literals Python's encoder writes), strings include NUL
characters, lone surrogates and over-long values, and objects get unknown keys. Bodies are
encoded here (``encode``), so hostile JSON reaches the server exactly as drawn.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

#: Integers at and around the edges every backend must agree on.
EDGE_INTEGERS = (0, -1, 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, 2**70, -(2**70))
#: Strings that have broken one backend or another.
HOSTILE_TEXT = (
    "",
    "\x00",
    "a\x00b",
    "\ud800",
    "\udfff x",
    "../../etc",
    "%00",
    "x" * 300,
    "\U0001f600" * 300,
    "latest",
    "null",
)

SCALAR = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from(EDGE_INTEGERS)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
    | st.sampled_from(HOSTILE_TEXT)
)
JSON = st.recursive(
    SCALAR,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def encode(value: Any) -> bytes:
    """JSON as Python writes it: ``NaN``/``Infinity`` literals, lone surrogates as escapes."""
    return json.dumps(value, allow_nan=True).encode()


def nested(depth: int, leaf: Any = 1) -> bytes:
    """A JSON array nested ``depth`` levels, built as text (no Python recursion)."""
    return b"[" * depth + json.dumps(leaf).encode() + b"]" * depth


def resolve(schema: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def _integers(schema: dict[str, Any]) -> st.SearchStrategy[int]:
    low = schema.get("minimum", schema.get("exclusiveMinimum", -5))
    high = schema.get("maximum", schema.get("exclusiveMaximum", 5))
    near = [low - 1, low, low + 1, high - 1, high, high + 1]
    return st.integers(-5, 5) | st.sampled_from(near) | st.sampled_from(EDGE_INTEGERS)


def _texts(schema: dict[str, Any], known: tuple[str, ...]) -> st.SearchStrategy[str]:
    longest = schema.get("maxLength")
    options = [st.text(max_size=10), st.sampled_from(HOSTILE_TEXT)]
    if known:
        options.append(st.sampled_from(known))
    if longest is not None:
        options.append(st.sampled_from(["y" * longest, "y" * (longest + 1)]))
    return st.one_of(options)


def from_schema(
    schema: dict[str, Any],
    spec: dict[str, Any],
    known: tuple[str, ...] = (),
    depth: int = 0,
) -> st.SearchStrategy[Any]:
    """Values shaped like ``schema``, often wrong on purpose; ``known``: strings to use often
    (ids the store holds, so that requests also reach records, not only 404s)."""
    schema = resolve(schema, spec)
    if depth > 4:
        return JSON
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        return st.one_of([from_schema(o, spec, known, depth + 1) for o in options])
    if "enum" in schema:
        return st.sampled_from(schema["enum"]) | st.sampled_from(HOSTILE_TEXT)
    if "const" in schema:
        return st.just(schema["const"])
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        fields = {name: from_schema(sub, spec, known, depth + 1) for name, sub in props.items()}
        required = set(schema.get("required", []))
        shaped = st.fixed_dictionaries(
            {k: v for k, v in fields.items() if k in required},
            optional={k: v for k, v in fields.items() if k not in required},
        )
        extra = st.dictionaries(st.text(max_size=4), JSON, max_size=1)
        return shaped | st.builds(lambda d, e: {**d, **e}, shaped, extra)
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {}), spec, known, depth + 1), max_size=3)
    leaf = {
        "string": _texts(schema, known),
        "integer": _integers(schema),
        "number": st.floats(-1e3, 1e3) | st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308]),
        "boolean": st.booleans(),
        "null": st.none(),
    }.get(kind)
    return (leaf | JSON) if leaf is not None else JSON


def operations(spec: dict[str, Any], prefix: str = "/v1/") -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path, operation) of every operation under ``prefix``."""
    return [
        (method.upper(), path, op)
        for path, methods in spec["paths"].items()
        if path.startswith(prefix)
        for method, op in methods.items()
    ]


def query_params(operation: dict[str, Any], spec: dict[str, Any], known: tuple[str, ...]) -> st.SearchStrategy[Any]:
    """Query parameters of ``operation``: its declared ones (as the strings a URL carries),
    required ones sometimes left out."""
    params = operation.get("parameters", [])
    if not params:
        return st.just({})
    values = {p["name"]: from_schema(p["schema"], spec, known).map(_as_param) for p in params}
    return st.fixed_dictionaries({}, optional=values)


def _as_param(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, allow_nan=True) if not isinstance(value, bool) else str(value).lower()

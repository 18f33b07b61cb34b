"""Bounded property-based fuzzing of the store service, driven by its own OpenAPI schema.

Hypothesis builds request bodies from each operation's JSON schema (well-typed ones, near misses
with wrong types, extra keys and arbitrary JSON); every answer must be < 500, and every refused
request must leave the stored data exactly as it was.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from agentgrad.store.memory import MemoryStore  # noqa: E402
from agentgrad.store.service.server import create_app  # noqa: E402

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def _resolve(schema: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def from_schema(schema: dict[str, Any], spec: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values shaped like ``schema``, sometimes wrong on purpose (any JSON instead)."""
    schema = _resolve(schema, spec)
    if depth > 4:
        return JSON
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        return st.one_of([from_schema(o, spec, depth + 1) for o in options])
    if "enum" in schema:
        return st.sampled_from(schema["enum"]) | st.text(max_size=5)
    if "const" in schema:
        return st.just(schema["const"])
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        fields = {name: from_schema(sub, spec, depth + 1) for name, sub in props.items()}
        required = set(schema.get("required", []))
        shaped = st.fixed_dictionaries(
            {k: v for k, v in fields.items() if k in required},
            optional={k: v for k, v in fields.items() if k not in required},
        )
        return shaped | st.builds(lambda d, extra: {**d, **extra}, shaped, st.dictionaries(st.text(max_size=4), JSON,
                                                                                             max_size=1))
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {}), spec, depth + 1), max_size=3)
    leaf = {"string": st.text(max_size=10), "integer": st.integers(-5, 5), "number": st.floats(-1e3, 1e3),
            "boolean": st.booleans(), "null": st.none()}.get(kind)
    return (leaf | JSON) if leaf is not None else JSON


def _snapshot(store: MemoryStore) -> Any:
    rollouts = store.query_rollouts()
    return (
        [r.model_dump() for r in rollouts],
        [[a.model_dump() for a in store.get_attempts(r.rollout_id)] for r in rollouts],
        [[s.model_dump() for s in store.query_spans(r.rollout_id)] for r in rollouts],
        [r.model_dump() for r in store.query_resources()],
        [w.model_dump() for w in store.query_workers()],
        [m.model_dump() for m in store.query_metrics()],
    )


@pytest.fixture(scope="module")
def service():
    store = MemoryStore(watchdog_interval=None)
    store.enqueue_rollout({"seed": 1}, rollout_id="r1")
    claimed = store.dequeue_rollout()
    store.update_attempt("r1", claimed.attempt.attempt_id, "running")
    store.add_resources({"t": 1}, resources_id="res-1")
    with TestClient(create_app(store, max_wait_seconds=0.05)) as client:
        spec = client.get("/openapi.json").json()
        yield client, store, spec
    store.close()


def _operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any] | None]]:
    ops = []
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            ops.append((method.upper(), path, body))
    return ops


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_no_5xx_and_refusals_change_nothing(service, data):
    client, store, spec = service
    method, path, body_schema = data.draw(st.sampled_from(_operations(spec)), label="operation")
    params = data.draw(st.dictionaries(st.sampled_from(["rollout_id", "attempt_id", "resources_id", "limit",
                                                        "after_sequence_id", "name", "run_id"]),
                                       st.sampled_from(["r1", "nope", "-1", "x", "0", "latest"]), max_size=3))
    before = _snapshot(store)
    if method == "GET":
        response = client.get(path, params=params)
    elif path == "/v1/traces":
        raw = data.draw(st.binary(max_size=64))
        response = client.post(path, content=raw, headers={"Content-Type": data.draw(
            st.sampled_from(["application/x-protobuf", "application/json"]))})
    else:
        body = data.draw(from_schema(body_schema, spec) if body_schema else JSON, label="body")
        if data.draw(st.booleans(), label="raw bytes"):
            response = client.request(method, path, content=data.draw(st.binary(max_size=32)),
                                      headers={"Content-Type": "application/json"})
        else:
            response = client.request(method, path, json=body)
    assert response.status_code < 500, (method, path, response.text)
    if response.status_code >= 400:
        assert response.json()["message"], response.text
        assert _snapshot(store) == before, f"refused {method} {path} changed the store"

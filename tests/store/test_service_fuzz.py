"""Bounded property-based fuzzing of the store service, driven by its own OpenAPI schema (the
strategies: ``tests/support/openapi_strategies.py``; against real servers over SQLite and
PostgreSQL: ``tests/chaos/test_fuzz_store.py``).

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
from openapi_strategies import JSON, encode, from_schema  # noqa: E402
from store_contents import store_contents  # noqa: E402

from agentgrad.store.memory import MemoryStore  # noqa: E402
from agentgrad.store.service.server import create_app  # noqa: E402


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
    params = data.draw(
        st.dictionaries(
            st.sampled_from(
                ["rollout_id", "attempt_id", "resources_id", "limit", "after_sequence_id", "name", "run_id"]
            ),
            st.sampled_from(["r1", "nope", "-1", "x", "0", "latest"]),
            max_size=3,
        )
    )
    before = store_contents(store)
    if method == "GET":
        response = client.get(path, params=params)
    elif path == "/v1/traces":
        raw = data.draw(st.binary(max_size=64))
        response = client.post(
            path,
            content=raw,
            headers={"Content-Type": data.draw(st.sampled_from(["application/x-protobuf", "application/json"]))},
        )
    else:
        body = data.draw(from_schema(body_schema, spec) if body_schema else JSON, label="body")
        if data.draw(st.booleans(), label="raw bytes"):
            response = client.request(
                method, path, content=data.draw(st.binary(max_size=32)), headers={"Content-Type": "application/json"}
            )
        else:
            response = client.request(
                method,
                path,
                content=encode(body),  # NaN, surrogates as drawn
                headers={"Content-Type": "application/json"},
            )
    assert response.status_code < 500, (method, path, response.text)
    if response.status_code >= 400:
        assert response.json()["message"], response.text
        assert store_contents(store) == before, f"refused {method} {path} changed the store"

"""OTLP/HTTP ingestion at POST /v1/traces, exercised with the real OpenTelemetry SDK exporter."""

from __future__ import annotations

import httpx
import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.trace import Status, StatusCode  # noqa: E402

from agentgrad import semconv  # noqa: E402
from agentgrad.store.memory import MemoryStore  # noqa: E402
from agentgrad.store.service.server import StoreServer  # noqa: E402


@pytest.fixture
def served():
    with StoreServer(MemoryStore(watchdog_interval=None), token="t", owns_store=True) as server:
        yield server


def _claim(store):
    store.enqueue_rollout("task")
    claimed = store.dequeue_rollout()
    return claimed.rollout.rollout_id, claimed.attempt.attempt_id


def _provider(url: str, **resource: str) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create(resource))
    exporter = OTLPSpanExporter(endpoint=f"{url}/v1/traces", headers={"Authorization": "Bearer t"})
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def test_sdk_exporter_spans_land_on_the_attempt(served):
    store = served.store
    rid, aid = _claim(store)
    provider = _provider(served.url, **{semconv.ROLLOUT_ID: rid, semconv.ATTEMPT_ID: aid, "service.name": "agent"})
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("agent.run") as parent:
        with tracer.start_as_current_span(semconv.SPAN_LLM_CALL) as child:
            child.set_attribute(semconv.LLM_PROMPT_TOKEN_IDS, [1, 2, 3])
            child.set_attribute("gen_ai.request.model", "tiny")
            child.set_attribute("ratio", 0.5)
            child.set_attribute("ok", True)
            child.add_event("token", {"index": 7})
            child.set_status(Status(StatusCode.ERROR, "boom"))
    provider.shutdown()
    spans = store.query_spans(rid)
    assert [s.name for s in spans] == [semconv.SPAN_LLM_CALL, "agent.run"]
    llm = spans[0]
    ctx = parent.get_span_context()
    assert llm.trace_id == format(ctx.trace_id, "032x")
    assert llm.parent_id == format(ctx.span_id, "016x")
    assert llm.span_id == format(child.get_span_context().span_id, "016x")
    assert llm.attributes[semconv.LLM_PROMPT_TOKEN_IDS] == [1, 2, 3]
    assert llm.attributes["ratio"] == 0.5 and llm.attributes["ok"] is True
    assert llm.status.status_code == "ERROR" and llm.status.description == "boom"
    assert llm.events[0].name == "token" and llm.events[0].attributes == {"index": 7}
    assert llm.resource["service.name"] == "agent"
    assert 0 < llm.start_time <= llm.end_time
    assert store.get_rollout(rid).llm_calls == 1
    assert store.get_latest_attempt(rid).status == "running", "spans are heartbeats"


def test_span_attributes_override_resource_and_unattributed_spans_are_reported(served):
    store = served.store
    rid, aid = _claim(store)
    provider = _provider(served.url)
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("tagged") as span:
        span.set_attribute(semconv.ROLLOUT_ID, rid)
        span.set_attribute(semconv.ATTEMPT_ID, aid)
    with tracer.start_as_current_span("orphan"):
        pass
    provider.shutdown()
    assert [s.name for s in store.query_spans(rid)] == ["tagged"]
    metrics = httpx.get(f"{served.url}/metrics", headers={"Authorization": "Bearer t"}).text
    assert "agentgrad_otlp_spans_rejected_total 1" in metrics


def _json_request(rid: str, aid: str, span_id: str = "00f067aa0ba902b7") -> dict:
    return {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [
                        {"key": semconv.ROLLOUT_ID, "value": {"stringValue": rid}},
                        {"key": semconv.ATTEMPT_ID, "value": {"stringValue": aid}},
                    ]
                },
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "4bf92f3577b34da6a3ce929d0e0e4736",
                                "spanId": span_id,
                                "name": "json-span",
                                "startTimeUnixNano": "1700000000000000000",
                                "endTimeUnixNano": "1700000001500000000",
                                "attributes": [
                                    {"key": "n", "value": {"intValue": "42"}},
                                    {"key": "xs", "value": {"arrayValue": {"values": [{"doubleValue": 1.5}]}}},
                                    {
                                        "key": "kv",
                                        "value": {
                                            "kvlistValue": {"values": [{"key": "a", "value": {"stringValue": "b"}}]}
                                        },
                                    },
                                ],
                                "status": {"code": 1},
                            }
                        ]
                    }
                ],
            }
        ]
    }


def test_otlp_json_with_hex_ids(served):
    rid, aid = _claim(served.store)
    response = httpx.post(
        f"{served.url}/v1/traces", json=_json_request(rid, aid), headers={"Authorization": "Bearer t"}
    )
    assert response.status_code == 200 and response.json() == {}
    (span,) = served.store.query_spans(rid)
    assert span.span_id == "00f067aa0ba902b7" and span.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert span.attributes == {"n": 42, "xs": [1.5], "kv": {"a": "b"}}
    assert (span.start_time, span.end_time) == (1700000000.0, 1700000001.5)
    assert span.status.status_code == "OK"


def test_unknown_attempt_is_a_partial_success(served):
    rid, _ = _claim(served.store)
    response = httpx.post(
        f"{served.url}/v1/traces", json=_json_request(rid, "at-nope"), headers={"Authorization": "Bearer t"}
    )
    assert response.status_code == 200
    partial = response.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1" and "at-nope" in partial["errorMessage"]
    assert served.store.query_spans(rid) == []


@pytest.mark.parametrize(
    ("content", "content_type"),
    [
        (b"\xff\xfe garbage", "application/x-protobuf"),
        (b"{broken", "application/json"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"spanId": "zz"}]}]}]}', "application/json"),
        (b"[]", "application/json"),
        (b"hello", "text/plain"),
    ],
)
def test_malformed_otlp_is_400(served, content, content_type):
    response = httpx.post(
        f"{served.url}/v1/traces", content=content, headers={"Authorization": "Bearer t", "Content-Type": content_type}
    )
    assert response.status_code == 400, response.text
    assert response.json()["message"]


def test_gzip_bodies_are_accepted_and_bombs_refused(served):
    import gzip
    import json

    rid, aid = _claim(served.store)
    body = gzip.compress(json.dumps(_json_request(rid, aid)).encode())
    headers = {"Authorization": "Bearer t", "Content-Type": "application/json", "Content-Encoding": "gzip"}
    assert httpx.post(f"{served.url}/v1/traces", content=body, headers=headers).status_code == 200
    bomb = gzip.compress(b" " * (40 * 1024 * 1024))
    response = httpx.post(f"{served.url}/v1/traces", content=bomb, headers=headers)
    assert response.status_code == 413

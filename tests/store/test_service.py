"""The store service beyond the conformance suite: HTTP errors, auth, retries, long polls, metrics."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi")

from agentgrad.errors import (  # noqa: E402
    AlreadyExistsError,
    IdempotencyKeyReusedError,
    InvalidInputError,
    NotFoundError,
)
from agentgrad.store.client import StoreClient, StoreServiceError, StoreUnavailableError  # noqa: E402
from agentgrad.store.memory import MemoryStore  # noqa: E402
from agentgrad.store.service.server import StoreServer  # noqa: E402
from agentgrad.types import Span  # noqa: E402

TOKEN = "s3cret-token"


@pytest.fixture
def served():
    server = StoreServer(MemoryStore(watchdog_interval=None), token=TOKEN, max_body_bytes=64_000, owns_store=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def http(served):
    with httpx.Client(base_url=served.url, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        yield client


@pytest.fixture
def client(served):
    c = StoreClient(served.url, token=TOKEN, retries=2, backoff=0.01)
    yield c
    c.close()


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["message"], body
    return body


# ---- auth and service endpoints -----------------------------------------------------------------


def test_health_needs_no_token_but_everything_else_does(served):
    assert httpx.get(f"{served.url}/health").json()["status"] == "ok"
    for path in ("/v1/resources", "/metrics", "/openapi.json", "/v1/rollouts/get?rollout_id=x"):
        body = _error(httpx.get(served.url + path), 401)
        assert body["error"] == "unauthorized" and "bearer" in body["message"]
    _error(httpx.get(f"{served.url}/v1/resources", headers={"Authorization": "Bearer wrong"}), 401)
    with pytest.raises(StoreServiceError) as info:
        StoreClient(served.url, token="wrong").query_resources()
    assert info.value.status == 401


def test_openapi_documents_every_store_method(http):
    paths = http.get("/openapi.json").json()["paths"]
    for path in (
        "/v1/rollouts/enqueue",
        "/v1/rollouts/dequeue",
        "/v1/rollouts/wait",
        "/v1/spans",
        "/v1/attempts/update",
        "/v1/watchdog/check",
        "/v1/resources/latest",
        "/v1/traces",
    ):
        assert path in paths
    assert "ErrorBody" in http.get("/openapi.json").json()["components"]["schemas"]


def test_metrics_in_prometheus_text(client, http):
    client.enqueue_rollouts([{"input": i} for i in range(3)])
    claimed = client.dequeue_rollout()
    client.add_spans([Span(rollout_id=claimed.rollout.rollout_id, attempt_id=claimed.attempt.attempt_id, name="s")])
    text = http.get("/metrics").text
    assert 'agentgrad_http_requests_total{method="POST",route="/v1/rollouts/enqueue",status="200"} 1' in text
    assert 'agentgrad_rollouts{status="queuing"} 2' in text
    assert 'agentgrad_rollouts{status="running"} 1' in text
    assert "agentgrad_queue_depth 2" in text
    assert "agentgrad_spans_stored_total 1" in text
    assert 'agentgrad_http_request_duration_seconds_count{method="POST",route="/v1/spans/receipt"} 1' in text


def test_span_receipt_sends_back_only_what_differs(client, http):
    """The bulk endpoint answers with sequence ids; a repeat whose stored copy differs from what
    was sent comes back whole, by its index in the batch."""
    client.enqueue_rollout("t")
    claimed = client.dequeue_rollout()
    ids = {"rollout_id": claimed.rollout.rollout_id, "attempt_id": claimed.attempt.attempt_id}
    first = {**ids, "span_id": "s1", "name": "call", "start_time": 5.0, "trace_id": "t1", "attributes": {"v": 1}}
    assert http.post("/v1/spans/receipt", json={"spans": [first]}).json() == {"sequence_ids": [1], "stored": {}}
    changed = {**first, "attributes": {"v": 2}}
    fresh = {**ids, "span_id": "s2", "name": "call"}
    answer = http.post("/v1/spans/receipt", json={"spans": [first, changed, fresh]}).json()
    assert answer["sequence_ids"] == [1, 1, 2]
    assert list(answer["stored"]) == ["1"] and answer["stored"]["1"]["attributes"] == {"v": 1}
    assert "rollout_id" in _error(http.post("/v1/spans/receipt", json={"spans": [{"name": "x"}]}), 422)["message"]


def test_cors_is_off_unless_configured(http, served):
    assert "access-control-allow-origin" not in http.get("/health", headers={"Origin": "http://x.test"}).headers
    store = MemoryStore(watchdog_interval=None)
    with StoreServer(store, cors_origins=["http://ui.test"], owns_store=True) as cors:
        preflight = httpx.options(
            f"{cors.url}/v1/resources", headers={"Origin": "http://ui.test", "Access-Control-Request-Method": "GET"}
        )
        assert preflight.headers["access-control-allow-origin"] == "http://ui.test"


def test_app_exposes_store_and_mounts_extra_routers():
    from fastapi import APIRouter

    extra = APIRouter()

    @extra.get("/")
    def index() -> dict[str, str]:
        return {"page": "dashboard"}

    store = MemoryStore(watchdog_interval=None)
    with StoreServer(store, extra_routers=[extra], owns_store=True) as server:
        assert server.app.state.store is store
        assert httpx.get(server.url + "/").json() == {"page": "dashboard"}
        assert httpx.get(server.url + "/v1/rollouts/count").status_code == 405, "the API still wins"


# ---- bad input: always 4xx with a message ---------------------------------------------------------


def test_malformed_json_is_422(http):
    body = _error(
        http.post("/v1/rollouts/enqueue", content=b"{not json", headers={"Content-Type": "application/json"}), 422
    )
    assert body["error"] == "validation_error" and "JSON" in body["message"]


def test_wrong_types_are_422_naming_the_field(http):
    body = _error(http.post("/v1/rollouts/enqueue", json={"rollouts": [{"mode": "bogus"}]}), 422)
    assert "rollouts.0.mode" in body["message"]
    body = _error(http.post("/v1/rollouts/dequeue", json={"limit": "many"}), 422)
    assert "limit" in body["message"]
    _error(http.get("/v1/spans", params={"rollout_id": "r", "limit": -1}), 422)


def test_store_refusals_map_to_their_status(http, client):
    body = _error(http.get("/v1/rollouts/get", params={"rollout_id": "ro-missing"}), 404)
    assert body["error"] == "not_found" and "ro-missing" in body["message"]
    client.enqueue_rollout(rollout_id="taken")
    body = _error(http.post("/v1/rollouts/enqueue", json={"rollouts": [{"rollout_id": "taken"}]}), 409)
    assert body["error"] == "already_exists"
    client.cancel_rollout("taken")
    body = _error(http.post("/v1/rollouts/cancel", json={"rollout_id": "taken"}), 409)
    assert body["error"] == "invalid_transition" and body["fields"] == {
        "current": "cancelled",
        "requested": "cancelled",
    }
    body = _error(http.post("/v1/rollouts/dequeue", json={"limit": 0}), 400)
    assert body["error"] == "invalid_input"
    _error(http.get("/v1/no/such/route"), 404)


def test_client_raises_what_a_local_store_raises(client):
    with pytest.raises(NotFoundError) as info:
        client.get_rollout("nope")
    assert str(info.value) == "rollout 'nope' not found" and info.value.ident == "nope"
    client.enqueue_rollout(rollout_id="dup")
    with pytest.raises(AlreadyExistsError):
        client.enqueue_rollout(rollout_id="dup")
    with pytest.raises(InvalidInputError) as bad:
        client.enqueue_rollout({"x": float("nan")})
    assert "input" in str(bad.value) and "non-finite" in str(bad.value)
    with pytest.raises(InvalidInputError):
        client.update_attempt("dup", "at-x", "exploded")  # unknown status is refused before ids are looked up


def test_oversized_body_is_413(http):
    big = {"rollouts": [{"input": "x" * 70_000}]}
    body = _error(http.post("/v1/rollouts/enqueue", json=big), 413)
    assert "64000" in body["message"]

    def chunks():
        for _ in range(10):
            yield b" " * 10_000

    _error(http.post("/v1/rollouts/enqueue", content=chunks(), headers={"Content-Type": "application/json"}), 413)
    assert http.post("/v1/rollouts/count", json={}).json() == {"count": 0}


# ---- retries and idempotency ------------------------------------------------------------------------


class _LoseFirstResponses(httpx.BaseTransport):
    """Delivers requests but 'loses' the first ``n`` responses, as a dropped connection would."""

    def __init__(self, n: int) -> None:
        self.inner = httpx.HTTPTransport()
        self.lost = n
        self.sent = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent += 1
        response = self.inner.handle_request(request)
        response.read()
        if self.lost:
            self.lost -= 1
            raise httpx.ReadError("connection reset (test)", request=request)
        return response

    def close(self) -> None:
        self.inner.close()


def _flaky(served, lost: int) -> tuple[StoreClient, _LoseFirstResponses]:
    transport = _LoseFirstResponses(lost)
    return StoreClient(served.url, token=TOKEN, retries=3, backoff=0.001, transport=transport), transport


def test_retried_enqueue_after_lost_response_stores_once(served, client):
    flaky, transport = _flaky(served, 2)
    rollout = flaky.enqueue_rollout({"task": 1}, rollout_id="only-once")
    assert rollout.rollout_id == "only-once" and transport.sent == 3
    generated = _flaky(served, 1)[0].enqueue_rollout("auto-id")
    assert client.count_rollouts() == 2
    assert client.get_rollout(generated.rollout_id).input == "auto-id"


def test_retried_dequeue_after_lost_response_claims_once(served, client):
    client.enqueue_rollouts([{"input": 1}, {"input": 2}])
    flaky, _ = _flaky(served, 1)
    claimed = flaky.dequeue_rollout(worker_id="w")
    assert claimed.rollout.input == 1
    assert len(client.get_attempts(claimed.rollout.rollout_id)) == 1
    assert client.dequeue_rollout().rollout.input == 2, "the retry did not claim a second rollout"


def test_retried_span_batch_and_resources_are_idempotent(served, client):
    claimed = (client.enqueue_rollout(), client.dequeue_rollout())[1]
    spans = [
        Span(rollout_id=claimed.rollout.rollout_id, attempt_id=claimed.attempt.attempt_id, name=f"s{i}")
        for i in range(5)
    ]
    flaky, _ = _flaky(served, 1)
    assert [s.sequence_id for s in flaky.add_spans(spans)] == [1, 2, 3, 4, 5]
    assert len(client.query_spans(claimed.rollout.rollout_id)) == 5
    flaky, _ = _flaky(served, 1)
    assert flaky.add_resources({"t": 0.5}).version == 1
    assert len(client.query_resources()) == 1


def test_4xx_is_never_retried(served):
    flaky, transport = _flaky(served, 0)
    with pytest.raises(NotFoundError):
        flaky.get_rollout("missing")
    assert transport.sent == 1


def test_unreachable_service_raises_after_retries():
    client = StoreClient("http://127.0.0.1:9", retries=2, backoff=0.001, timeout=1)
    with pytest.raises(StoreUnavailableError) as info:
        client.get_latest_resources()
    assert "3 time(s)" in str(info.value)


def test_idempotency_key_replays_the_first_answer(http):
    headers = {"Idempotency-Key": "k-1"}
    first = http.post("/v1/rollouts/enqueue", json={"rollouts": [{"rollout_id": "a"}]}, headers=headers)
    again = http.post("/v1/rollouts/enqueue", json={"rollouts": [{"rollout_id": "a"}]}, headers=headers)
    assert first.status_code == again.status_code == 200 and first.json() == again.json()
    other_key = http.post(
        "/v1/rollouts/enqueue", json={"rollouts": [{"rollout_id": "a"}]}, headers={"Idempotency-Key": "k-2"}
    )
    assert other_key.status_code == 409


def test_idempotency_key_with_another_body_is_refused_with_422(http, client):
    headers = {"Idempotency-Key": "k-1"}
    assert http.post("/v1/resources", json={"items": {"t": 1}}, headers=headers).status_code == 200
    body = _error(http.post("/v1/resources", json={"items": {"t": 2}}, headers=headers), 422)
    assert body["error"] == "idempotency_key_reused" and "k-1" in body["message"]
    with pytest.raises(IdempotencyKeyReusedError):  # the client raises what a local store raises
        client.add_resources({"t": 3}, idempotency_key="k-1")
    assert [r.items["t"].value for r in client.query_resources()] == [1]


@pytest.mark.parametrize("path", ["/v1/rollouts/enqueue", "/v1/rollouts/dequeue"])
def test_oversized_idempotency_keys_are_refused_and_nothing_is_kept(http, client, path):
    """Issue 22, finding 9: 100 writes with a 1 MB key used to keep +100 MB of keys."""
    client.enqueue_rollout("queued")
    body = {"rollouts": [{"input": 1}]} if path.endswith("enqueue") else {"limit": 1}
    for key in ("k" * 201, "k" * 1_000_000):
        refused = _error(http.post(path, json=body, headers={"Idempotency-Key": key}), 400)
        assert refused["error"] == "invalid_input" and "200" in refused["message"]
        assert len(refused["message"]) < 500, "the key is not echoed back whole"
    assert client.count_rollouts() == 1 and client.dequeue_rollout() is not None, "nothing was written or claimed"


# ---- long polls -----------------------------------------------------------------------------------


class _Counting(httpx.HTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.sent = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent += 1
        return super().handle_request(request)


def test_dequeue_long_polls_and_wakes_on_enqueue(served, client):
    transport = _Counting()
    waiter = StoreClient(served.url, token=TOKEN, transport=transport)
    timer = threading.Timer(0.3, lambda: client.enqueue_rollout("late"))
    timer.start()
    started = time.monotonic()
    claimed = waiter.dequeue_rollout(timeout=10)
    timer.join()
    assert claimed is not None and claimed.rollout.input == "late"
    assert time.monotonic() - started < 3
    assert transport.sent == 1, "one long-poll request, no client polling"


def test_long_poll_repeats_until_the_callers_deadline(served):
    transport = _Counting()
    waiter = StoreClient(served.url, token=TOKEN, transport=transport, long_poll=0.2)
    started = time.monotonic()
    assert waiter.dequeue_rollout(timeout=0.5) is None
    assert 0.45 < time.monotonic() - started < 3
    assert 2 <= transport.sent <= 4


def test_wait_for_rollouts_wakes_on_completion(served, client):
    rid = client.enqueue_rollout().rollout_id
    claimed = client.dequeue_rollout()
    timer = threading.Timer(0.3, lambda: client.update_attempt(rid, claimed.attempt.attempt_id, "succeeded"))
    timer.start()
    started = time.monotonic()
    done = client.wait_for_rollouts([rid], timeout=10)
    timer.join()
    assert [r.status for r in done] == ["succeeded"]
    assert time.monotonic() - started < 3


def test_server_caps_one_long_poll(served, http):
    from agentgrad.store.service.routes import Context

    assert Context(served.store, 60.0, lambda n: None).wait_limit(3600) == 60.0
    started = time.monotonic()
    assert http.post("/v1/rollouts/dequeue", json={"timeout": 0.2}).json() == {"claimed": []}
    assert time.monotonic() - started >= 0.15


def test_error_bodies_are_json_everywhere(http):
    response = http.put("/v1/spans", content=b"x")
    assert response.status_code == 405 and json.loads(response.text)["error"] == "method_not_allowed"


# ---- the store API's own request path ---------------------------------------------------------------


def test_store_api_refuses_unreadable_requests_with_4xx(http):
    response = http.put("/v1/rollouts/enqueue", content=b"{}")
    assert _error(response, 405)["error"] == "method_not_allowed" and response.headers["allow"] == "POST"
    assert (
        "Content-Type"
        in _error(http.post("/v1/rollouts/count", content=b"{}", headers={"Content-Type": "text/plain"}), 422)[
            "message"
        ]
    )
    assert "empty" in _error(http.post("/v1/rollouts/count"), 422)["message"]
    assert "limit" in _error(http.get("/v1/spans", params={"rollout_id": "r", "limit": "many"}), 422)["message"]


class _Recording(MemoryStore):
    """Records the thread each call ran on, and can fail unexpectedly."""

    def __init__(self) -> None:
        super().__init__(watchdog_interval=None)
        self.threads: list[str] = []

    def get_latest_resources(self):
        self.threads.append(threading.current_thread().name)
        return super().get_latest_resources()

    def dequeue_rollouts(self, limit, worker_id=None, timeout=0.0, **keyed):
        self.threads.append(threading.current_thread().name)
        return super().dequeue_rollouts(limit, worker_id=worker_id, timeout=timeout, **keyed)

    def query_workers(self):
        raise RuntimeError("a bug in the store")


@pytest.mark.parametrize("inline", [None, False])
def test_quick_calls_run_inline_only_for_locked_stores_and_long_polls_never(inline):
    store = _Recording()
    with StoreServer(store, owns_store=True, inline_calls=inline) as server:
        client = StoreClient(server.url)
        client.get_latest_resources()
        client.dequeue_rollout(timeout=0.05)
        client.close()
    quick, long_poll = store.threads
    assert quick.startswith("agentgrad-store-server") is (inline is None), "memory store: on the event loop"
    assert not long_poll.startswith("agentgrad-store-server"), "a long poll never holds the event loop"


def test_unexpected_store_error_is_a_json_500():
    with StoreServer(_Recording(), owns_store=True) as server:
        response = httpx.get(f"{server.url}/v1/workers")
    assert response.status_code == 500
    assert response.json()["error"] == "internal_error" and "a bug in the store" in response.json()["message"]


def test_client_uses_the_lean_pool_only_for_plain_http(monkeypatch):
    from agentgrad.http.transport import ConnectionPool, HttpxTransport

    def transport(url: str, **options) -> object:
        client = StoreClient(url, **options)
        client.close()
        return client._transport

    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert isinstance(transport("http://127.0.0.1:1"), ConnectionPool)
    assert isinstance(transport("https://store.test"), HttpxTransport)
    assert isinstance(transport("http://127.0.0.1:1", transport=httpx.HTTPTransport()), HttpxTransport)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.test:3128")
    assert isinstance(transport("http://127.0.0.1:1"), HttpxTransport)


def test_client_encodes_models_exactly_as_model_dump_would():
    from pydantic import BaseModel, field_serializer

    from agentgrad.store.client import _encode
    from agentgrad.types import SpanEvent

    class Shouting(BaseModel):
        word: str

        @field_serializer("word")
        def loud(self, word: str) -> str:
            return word.upper()

    span = Span(
        rollout_id="r",
        attempt_id="a",
        name="s",
        attributes={"t": (1, 2), "m": Shouting(word="hi")},
        events=[SpanEvent(name="e")],
    )
    payload = {"spans": [span], "extra": Shouting(word="hey")}
    expected = json.dumps(payload, default=lambda m: m.model_dump(), separators=(",", ":")).encode()
    assert _encode(payload) == expected and b'"HEY"' in expected


def test_coalescing_transport_sends_one_step_of_writes_at_once():
    import asyncio

    from agentgrad.store.service.fastpath import _CoalescingTransport

    class Transport:
        def __init__(self) -> None:
            self.sent: list[list[bytes]] = []
            self.closed = False

        def writelines(self, data: list[bytes]) -> None:
            self.sent.append(list(data))

        def is_closing(self) -> bool:
            return self.closed

        def close(self) -> None:
            self.closed = True

    async def scenario() -> Transport:
        inner = Transport()
        transport = _CoalescingTransport(inner, asyncio.get_running_loop())  # type: ignore[arg-type]
        transport.write(b"head")
        transport.write(b"body")
        assert inner.sent == [], "held until the step ends"
        await asyncio.sleep(0)
        transport.write(b"last")
        transport.close()
        await asyncio.sleep(0)
        return inner

    inner = asyncio.run(scenario())
    assert inner.sent == [[b"head", b"body"], [b"last"]] and inner.closed

"""The store service under hostile input and long reads (issue 22, findings 4, 5 and 8).

* A long read (a page of spans, every worker) runs off the event loop, and an SQLite store reads
  apart from its writer: while one is held up, heartbeats, claims and span writes are answered.
* ``GET /v1/spans`` is paged: a bounded default, a documented maximum, a pointer to the next page.
* Records poisoned before the edge checked every number (a NaN stored as JSON null) are skipped
  with a warning instead of failing every read of their table, its API and its dashboard page.
* OTLP spans the store could never hold are rejected as a partial success, not a 500.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("uvicorn")

import service_backends

from agentgrad import semconv
from agentgrad.dashboard.app import dashboard_router
from agentgrad.store import wire
from agentgrad.store.client import StoreClient
from agentgrad.store.core import StoreTx
from agentgrad.store.protocol import Store
from agentgrad.store.service.server import StoreServer
from agentgrad.store.sqlite import SqliteStore
from agentgrad.types import MetricRecord, Span, Worker

#: How long a test waits for something that must happen before it gives up (a hang guard, not
#: a measurement: everything here happens in milliseconds).
HANG = 20.0


class HeldReads(SqliteStore):
    """An SQLite store whose span reads, once ``hold`` is set, stop inside their snapshot (the read
    transaction open) until ``release`` is set: a read as long as the test wants. Other reads (a
    claim's look at the queue among them) go on as usual."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hold, self.inside, self.release = threading.Event(), threading.Event(), threading.Event()

    def query_spans(self, *args: Any, **kwargs: Any) -> Any:
        self._local.span_read = True
        try:
            return super().query_spans(*args, **kwargs)
        finally:
            self._local.span_read = False

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[StoreTx]:
        with super()._transaction() as tx:
            if self.hold.is_set() and getattr(self._local, "span_read", False):
                assert self._local.read_only  # a read apart from the writer's lock: what is tested
                self.inside.set()
                self.release.wait(HANG)
            yield tx


def _in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def _running(store: Store) -> tuple[str, str]:
    store.enqueue_rollout({"q": 1}, rollout_id="r1")
    claimed = store.dequeue_rollout(worker_id="w1")
    store.update_attempt("r1", claimed.attempt.attempt_id, "running")
    return "r1", claimed.attempt.attempt_id


def test_a_held_sqlite_read_does_not_block_writes(tmp_path: Path) -> None:
    """Reads used to take the writer's lock for their whole length (a 200,000-span read: 4.4 s
    in which nothing else was answered)."""
    store = HeldReads(tmp_path / "store.db", watchdog_interval=None)
    try:
        rid, aid = _running(store)
        store.enqueue_rollout({"q": 2}, rollout_id="r2")
        store.hold.set()
        reader, read = _in_thread(lambda: store.query_spans(rid))
        assert store.inside.wait(HANG)
        writer, wrote = _in_thread(
            lambda: (
                store.heartbeat(rid, aid),
                store.add_span(Span(rollout_id=rid, attempt_id=aid, name="while-reading")),
                store.dequeue_rollout(worker_id="w2"),
            )
        )
        writer.join(HANG)
        assert wrote and not writer.is_alive(), "a write waited for a read"
        assert reader.is_alive(), "the read was not held while the writes ran"
        store.release.set()
        reader.join(HANG)
        assert len(read) == 1, "the held read did not finish once released"
        store.hold.clear()
        assert [s.name for s in store.query_spans(rid)] == ["while-reading"]
    finally:
        store.release.set()
        store.close()


def test_a_held_read_through_the_service_does_not_stall_it(tmp_path: Path) -> None:
    """Heavy reads leave the event loop: heartbeats, claims and other reads are answered while
    one is held up. (Before, an SQLite store's reads ran on the event loop.)"""
    store = HeldReads(tmp_path / "store.db", watchdog_interval=None)
    with StoreServer(store, owns_store=True) as server:
        client = StoreClient(server.url, retries=0, timeout=HANG)
        rid, aid = _running(client)
        client.enqueue_rollout({"q": 2}, rollout_id="r2")
        store.hold.set()
        reader, read = _in_thread(lambda: client.query_spans(rid))
        try:
            assert store.inside.wait(HANG)
            others, answered = _in_thread(
                lambda: (
                    client.heartbeat(rid, aid).status.value,
                    client.dequeue_rollout(worker_id="w2").rollout.rollout_id,
                    httpx.get(f"{server.url}/health", timeout=HANG).status_code,
                )
            )
            others.join(HANG)
            assert answered == [("running", "r2", 200)]
            assert reader.is_alive()
        finally:
            store.release.set()
        reader.join(HANG)
        assert len(read) == 1, "the held read did not finish once released"
        client.close()


def test_span_reads_are_paged_over_http(tmp_path: Path) -> None:
    with StoreServer(SqliteStore(tmp_path / "store.db", watchdog_interval=None), owns_store=True) as server:
        rid, aid = _running(server.store)
        total = wire.DEFAULT_SPAN_PAGE + 5
        server.store.add_spans([Span(rollout_id=rid, attempt_id=aid, name=f"s{i}") for i in range(total)])
        with httpx.Client(base_url=server.url, timeout=HANG) as http:
            first = http.get("/v1/spans", params={"rollout_id": rid}).json()
            assert len(first["spans"]) == wire.DEFAULT_SPAN_PAGE
            assert first["next_after_sequence_id"] == wire.DEFAULT_SPAN_PAGE
            last = http.get("/v1/spans", params={"rollout_id": rid, "after_sequence_id": wire.DEFAULT_SPAN_PAGE}).json()
            assert [s["sequence_id"] for s in last["spans"]] == list(range(wire.DEFAULT_SPAN_PAGE + 1, total + 1))
            assert last["next_after_sequence_id"] is None
            exact = http.get("/v1/spans", params={"rollout_id": rid, "after_sequence_id": total - 3, "limit": 3}).json()
            assert len(exact["spans"]) == 3 and exact["next_after_sequence_id"] is None
            empty = http.get("/v1/spans", params={"rollout_id": rid, "limit": 0}).json()
            assert empty == {"spans": [], "next_after_sequence_id": 0}
            refused = http.get("/v1/spans", params={"rollout_id": rid, "limit": wire.MAX_SPAN_PAGE + 1})
            assert refused.status_code == 422 and str(wire.MAX_SPAN_PAGE) in refused.json()["message"]


# ---- records poisoned before the edge checked them ------------------------------------------------


def _poison(kind: str, store: Store, data_dir: Path) -> None:
    """Rows as an older AgentGrad wrote them: NaN stored as null where a number must be. (Each
    row is warned about once per process: the worker's id names the backend.)"""
    worker_id = f"w-bad-{kind}"
    worker = json.loads(Worker(worker_id=worker_id).model_dump_json()) | {"last_heartbeat_time": None}
    metric = json.loads(MetricRecord(run_id="run", step=2, values={"loss": 1.0}).model_dump_json()) | {"time": None}
    rows = [
        ("INSERT INTO workers (worker_id, data) VALUES (?, ?)", (worker_id, json.dumps(worker))),
        ("INSERT INTO metrics (run_id, step, data) VALUES (?, ?, ?)", ("run", 2, json.dumps(metric))),
    ]
    if kind == "sqlite":
        with sqlite3.connect(data_dir / "store.db") as conn:
            for statement, params in rows:
                conn.execute(statement, params)
        return
    import psycopg

    with psycopg.connect(service_backends.PG_URL, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{service_backends.pg_schema(data_dir)}"')
        for statement, params in rows:
            conn.execute(statement.replace("?", "%s"), params)


def _open(kind: str, data_dir: Path) -> Store:
    if kind == "sqlite":
        return SqliteStore(data_dir / "store.db", watchdog_interval=None)
    return service_backends.open_postgres(data_dir, {"watchdog_interval": None})


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_poisoned_records_are_skipped_with_a_warning(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, GET /v1/workers, GET /v1/metrics, query_workers() and the runners and training
    pages failed for good (also after a restart) once one such record was stored."""
    store = _open(kind, tmp_path)
    store.update_worker(Worker(worker_id="w-good"))
    store.add_metrics([MetricRecord(run_id="run", step=1, values={"loss": 2.0})])
    _poison(kind, store, tmp_path)
    with caplog.at_level(logging.WARNING, logger="agentgrad.store.sql"):
        assert [w.worker_id for w in store.query_workers()] == ["w-good"]
        assert [m.step for m in store.query_metrics("run")] == [1]
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert f"'w-bad-{kind}'" in warned and "last_heartbeat_time" in warned
    with StoreServer(store, owns_store=True, extra_routers=[dashboard_router(store)]) as server:
        client = StoreClient(server.url, retries=0)
        assert [w.worker_id for w in client.query_workers()] == ["w-good"]
        assert [m.step for m in client.query_metrics()] == [1]
        for page in ("/dashboard/runners", "/dashboard/training"):
            response = httpx.get(server.url + page, timeout=HANG)
            assert response.status_code == 200, (page, response.text[:300])
        assert "w-good" in httpx.get(server.url + "/dashboard/runners", timeout=HANG).text
        client.close()


# ---- OTLP ----------------------------------------------------------------------------------------


def test_otlp_span_the_store_cannot_hold_is_rejected_not_a_500(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.proto")
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    with StoreServer(SqliteStore(tmp_path / "store.db", watchdog_interval=None), owns_store=True) as server:
        rid, aid = _running(server.store)
        request = ExportTraceServiceRequest()
        spans = request.resource_spans.add().scope_spans.add().spans
        for name in ("good", "bad\x00name"):
            span = spans.add(
                name=name, span_id=bytes([len(name)] * 8), trace_id=b"\x01" * 16, start_time_unix_nano=10**18
            )
            for key, value in ((semconv.ROLLOUT_ID, rid), (semconv.ATTEMPT_ID, aid)):
                attribute = span.attributes.add(key=key)
                attribute.value.string_value = value
        response = httpx.post(
            f"{server.url}/v1/traces",
            content=request.SerializeToString(),
            headers={"Content-Type": "application/x-protobuf"},
            timeout=HANG,
        )
        assert response.status_code == 200, response.text
        answer = ExportTraceServiceResponse.FromString(response.content)
        assert answer.partial_success.rejected_spans == 1
        assert "NUL" in answer.partial_success.error_message
        assert [s.name for s in server.store.query_spans(rid)] == ["good"]

"""Conformance: worker records and training metrics."""

from __future__ import annotations

import math

import pytest

from agentgrad.errors import InvalidInputError
from agentgrad.types import MetricRecord, Worker


def test_no_workers_initially(store):
    assert store.query_workers() == []


def test_update_worker_inserts(store):
    worker = Worker(
        worker_id="w-1",
        status="busy",
        current_rollout_id="ro-1",
        current_attempt_id="at-1",
        last_heartbeat_time=123.5,
        metadata={"pid": 42, "host": "box"},
    )
    returned = store.update_worker(worker)
    assert returned == worker
    assert store.query_workers() == [worker]


def test_update_worker_replaces(store):
    store.update_worker(Worker(worker_id="w-1", status="busy", current_rollout_id="ro-1", metadata={"a": 1}))
    replacement = Worker(worker_id="w-1", status="idle", last_heartbeat_time=999.0, metadata={"b": 2})
    store.update_worker(replacement)
    workers = store.query_workers()
    assert len(workers) == 1
    assert workers[0] == replacement
    assert workers[0].current_rollout_id is None


def test_many_workers(store):
    for i in range(4):
        store.update_worker(Worker(worker_id=f"w-{i}", status="idle"))
    store.update_worker(Worker(worker_id="w-2", status="stopped"))
    workers = {w.worker_id: w for w in store.query_workers()}
    assert set(workers) == {"w-0", "w-1", "w-2", "w-3"}
    assert workers["w-2"].status == "stopped"
    assert workers["w-0"].status == "idle"


def test_no_metrics_initially(store):
    assert store.query_metrics() == []
    assert store.query_metrics("run-x") == []


def test_metrics_in_insertion_order(store):
    records = [
        MetricRecord(run_id="r", step=s, time=1000.0 + s, values={"loss": 1.0 / (s + 1), "acc": 0.1 * s})
        for s in (3, 1, 2)
    ]
    store.add_metrics(records[:2])
    store.add_metrics(records[2:])
    assert store.query_metrics("r") == records
    assert [m.step for m in store.query_metrics()] == [3, 1, 2]


def test_metrics_by_run_id(store):
    store.add_metrics(
        [
            MetricRecord(run_id="a", step=1, values={"x": 1.0}),
            MetricRecord(run_id="b", step=1, values={"x": 2.0}),
            MetricRecord(run_id="a", step=2, values={"x": 3.0}),
        ]
    )
    store.add_metrics([MetricRecord(step=7, values={"y": 0.5})])
    assert [(m.step, m.values["x"]) for m in store.query_metrics("a")] == [(1, 1.0), (2, 3.0)]
    assert [m.values["x"] for m in store.query_metrics("b")] == [2.0]
    assert [m.step for m in store.query_metrics("default")] == [7]
    assert [m.run_id for m in store.query_metrics()] == ["a", "b", "a", "default"]
    assert store.query_metrics("nope") == []


def test_add_no_metrics(store):
    store.add_metrics([])
    assert store.query_metrics() == []


def test_non_finite_metric_is_refused_or_kept(store):
    """A NaN loss must never poison the metrics table: refuse it, or give it back."""
    store.add_metrics([MetricRecord(run_id="r", step=1, values={"loss": 0.5})])
    try:
        store.add_metrics([MetricRecord(run_id="r", step=2, values={"loss": float("nan")})])
    except InvalidInputError:
        assert [m.step for m in store.query_metrics("r")] == [1]
        return
    got = store.query_metrics("r")
    assert [m.step for m in got] == [1, 2]
    assert math.isnan(got[1].values["loss"])


def test_non_json_worker_metadata_is_refused(store):
    with pytest.raises(InvalidInputError) as info:
        store.update_worker(Worker(worker_id="w-bad", metadata={"handle": object()}))
    assert "handle" in str(info.value)
    assert store.query_workers() == []


def test_returned_worker_is_a_copy(store):
    worker = Worker(worker_id="w-1", metadata={"tags": ["a"]})
    store.update_worker(worker)
    worker.metadata["tags"].append("b")
    store.query_workers()[0].metadata["tags"].append("c")
    assert store.query_workers()[0].metadata == {"tags": ["a"]}

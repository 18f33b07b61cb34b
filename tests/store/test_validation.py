"""Validation at the store's edge, the same on every backend (issue 22, findings 4, 5 and 9).

Every backend (memory, SQLite, PostgreSQL, the HTTP client) refuses what one of them could not
store or read back: non-finite numbers where a number must be finite, integers past 64 bits, NUL
characters and over-long values in ids and names, JSON nested deeper than it can be read. A
refused call stores nothing. Reads page through long rollouts the same way everywhere.
"""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from agentgrad.errors import InvalidInputError
from agentgrad.store import wire
from agentgrad.store.jsoncheck import MAX_VALUE_DEPTH
from agentgrad.store.protocol import RolloutFilter, Store
from agentgrad.types import (
    INT64_MAX,
    MAX_ID_LENGTH,
    MAX_STEP,
    MetricRecord,
    RolloutConfig,
    Span,
    Worker,
)

REFUSED = (ValidationError, InvalidInputError)


@pytest.mark.parametrize("field", ["timeout_seconds", "unresponsive_seconds"])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan], ids=["inf", "-inf", "nan"])
def test_rollout_config_refuses_non_finite_deadlines(field: str, value: float) -> None:
    """``timeout_seconds=Infinity`` used to be stored as JSON null: "no timeout", silently."""
    with pytest.raises(ValidationError, match="finite"):
        RolloutConfig(**{field: value})


def test_rollout_config_with_a_non_finite_deadline_is_not_enqueued(store: Store) -> None:
    with pytest.raises(REFUSED):
        store.enqueue_rollout({"q": 1}, config={"timeout_seconds": math.inf})  # type: ignore[arg-type]
    assert store.count_rollouts() == 0


@pytest.mark.parametrize("value", [math.nan, math.inf], ids=["nan", "inf"])
def test_worker_heartbeat_time_must_be_finite(store: Store, value: float) -> None:
    """A NaN heartbeat time was stored as null, after which every read of the workers failed."""
    with pytest.raises(REFUSED):
        store.update_worker({"worker_id": "w-1", "last_heartbeat_time": value})  # type: ignore[arg-type]
    assert store.query_workers() == []


@pytest.mark.parametrize("value", [math.nan, -math.inf], ids=["nan", "-inf"])
def test_metric_time_must_be_finite(store: Store, value: float) -> None:
    with pytest.raises(REFUSED):
        store.add_metrics([{"run_id": "r", "step": 1, "time": value, "values": {"loss": 1.0}}])  # type: ignore[list-item]
    assert store.query_metrics() == []


@pytest.mark.parametrize("step", [-1, MAX_STEP + 1, INT64_MAX + 1, 2**70])
def test_metric_step_fits_every_backend(store: Store, step: int) -> None:
    """SQLite overflowed past 64 bits; PostgreSQL's step column past 31."""
    with pytest.raises(REFUSED):
        store.add_metrics([{"step": step, "values": {}}])  # type: ignore[list-item]
    store.add_metrics([MetricRecord(step=MAX_STEP, values={"x": 1.0})])
    assert [m.step for m in store.query_metrics()] == [MAX_STEP]


@pytest.mark.parametrize(
    "request_fields",
    [
        {"rollout_id": "a\x00b"},
        {"resources_id": "r\x00"},
        {"rollout_id": "x" * (MAX_ID_LENGTH + 1)},
        {"metadata": {"group_id": "g\x00"}},
    ],
    ids=["nul-rollout-id", "nul-resources-id", "long-rollout-id", "nul-group-id"],
)
def test_ids_every_backend_can_store(store: Store, request_fields: dict) -> None:
    """PostgreSQL refused a NUL character (a 500) where SQLite stored it: now every backend
    refuses, before anything is stored. Ids are bounded so that they fit its index entries."""
    with pytest.raises(REFUSED):
        store.enqueue_rollouts([{"input": 1, **request_fields}])  # type: ignore[list-item]
    assert store.count_rollouts() == 0
    with pytest.raises(REFUSED):
        store.enqueue_rollouts([{"input": 1}, {"input": 2, **request_fields}])  # type: ignore[list-item]
    assert store.count_rollouts() == 0


def test_an_id_of_the_longest_length_is_stored(store: Store) -> None:
    longest = "\U0001f600" * MAX_ID_LENGTH  # four bytes a character: the worst case for an index
    store.enqueue_rollout({"q": 1}, rollout_id=longest)
    assert store.get_rollout(longest).rollout_id == longest


def test_nul_in_a_span_name_or_a_worker_id_is_refused(store: Store, kit) -> None:
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    with pytest.raises(REFUSED):
        store.add_spans([{"rollout_id": rid, "attempt_id": aid, "name": "a\x00"}])  # type: ignore[list-item]
    with pytest.raises(REFUSED):
        store.update_worker({"worker_id": "w\x00"})  # type: ignore[arg-type]
    with pytest.raises(REFUSED):
        store.query_rollouts(RolloutFilter.model_validate({"group_id": "\x00"}))
    assert store.query_spans(rid) == [] and store.query_workers() == []


def test_json_nested_deeper_than_it_can_be_read_is_refused(store: Store, kit) -> None:
    """A value nested past MAX_VALUE_DEPTH could be stored, but no read of it would parse."""
    deep: list = [1]
    for _ in range(MAX_VALUE_DEPTH):
        deep = [deep]
    with pytest.raises(InvalidInputError, match="nested too deeply"):
        store.enqueue_rollout(deep)
    started = kit.start(store, {"q": 1})
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    with pytest.raises(InvalidInputError, match="nested too deeply"):
        store.add_span(Span(rollout_id=rid, attempt_id=aid, name="s", attributes={"x": deep}))
    assert store.count_rollouts() == 1 and store.query_spans(rid) == []


@pytest.mark.parametrize("bound", ["limit", "offset"])
def test_rollout_filter_paging_is_a_stored_integer(bound: str) -> None:
    with pytest.raises(ValidationError, match="less than or equal"):
        RolloutFilter.model_validate({bound: INT64_MAX + 1})


def test_worker_and_metric_fields_refuse_what_json_cannot_carry() -> None:
    """The models themselves: constructing one with a non-finite time fails at once."""
    with pytest.raises(ValidationError):
        Worker(worker_id="w", last_heartbeat_time=math.nan)
    with pytest.raises(ValidationError):
        MetricRecord(step=1, time=math.inf, values={})


# ---- paged reads of spans --------------------------------------------------------------------------


def test_a_long_rollout_reads_whole_and_in_pages(store: Store, kit) -> None:
    """More spans than one page of the service: the HTTP client reads them page by page (no
    request asks for them all), and every backend answers the same, whole or paged."""
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    total = 2 * wire.DEFAULT_SPAN_PAGE + 7
    store.add_spans([kit.span(rid, aid, f"s{i}", attributes={"i": i}) for i in range(total)])
    everything = store.query_spans(rid)
    assert [s.sequence_id for s in everything] == list(range(1, total + 1))
    assert [s.attributes["i"] for s in store.query_spans(rid, "latest")] == list(range(total))
    assert [s.sequence_id for s in store.query_spans(rid, limit=wire.DEFAULT_SPAN_PAGE + 3)] == list(
        range(1, wire.DEFAULT_SPAN_PAGE + 4)
    )
    assert [s.sequence_id for s in store.query_spans(rid, after_sequence_id=total - 2)] == [total - 1, total]
    assert store.query_spans(rid, limit=0) == []
    pages, after = [], 0
    while page := store.query_spans(rid, aid, after_sequence_id=after, limit=300):
        pages.append(page)
        after = page[-1].sequence_id
    assert [s for page in pages for s in page] == everything and max(map(len, pages)) == 300

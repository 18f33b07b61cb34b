"""Conformance: idempotency keys on the writes whose repeat would do something twice.

Every replayable write (the ``replayable`` endpoints of ``store/service/routes.py``: enqueue,
dequeue, cancel, add_resources, add_metrics), on every backend: the same key twice gives the same
answer and one effect, also after the store is reopened (durable backends); the same key with
another request is refused and changes nothing; keys are checked; refused writes are not
recorded; records expire and are bounded in number.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from manual_clock import ManualClock

from agentgrad.errors import IdempotencyKeyReusedError, InvalidInputError, NotFoundError
from agentgrad.store import idempotency
from agentgrad.store.core import TransactionalStore
from agentgrad.store.protocol import RolloutFilter
from agentgrad.types import MetricRecord


@dataclass(frozen=True)
class Write:
    """One replayable write: ``prepare`` sets the stage and returns what the calls need;
    ``call`` makes the write with a key; ``other`` makes a different request with the same key;
    ``effects`` counts what the write leaves behind (one call adds one)."""

    name: str
    prepare: Callable[[Any], Any]
    call: Callable[[Any, Any, str], Any]
    other: Callable[[Any, Any, str], Any]
    effects: Callable[[Any, Any], Any]


def _two_queued(store: Any) -> list[str]:
    return [r.rollout_id for r in store.enqueue_rollouts([{"input": 1}, {"input": 2}])]


def _attempts(store: Any, ids: list[str]) -> int:
    return sum(len(store.get_attempts(rid)) for rid in ids)


WRITES = [
    Write(
        "enqueue",
        prepare=lambda store: None,
        call=lambda store, _, key: store.enqueue_rollouts([{"input": {"task": 1}}], idempotency_key=key),
        other=lambda store, _, key: store.enqueue_rollouts([{"input": {"task": 2}}], idempotency_key=key),
        effects=lambda store, _: store.count_rollouts(),
    ),
    Write(
        "enqueue_named",
        prepare=lambda store: None,
        call=lambda store, _, key: store.enqueue_rollout("x", rollout_id="ro-named", idempotency_key=key),
        other=lambda store, _, key: store.enqueue_rollout("x", rollout_id="ro-other", idempotency_key=key),
        effects=lambda store, _: store.count_rollouts(),
    ),
    Write(
        "dequeue",
        prepare=_two_queued,
        call=lambda store, _, key: store.dequeue_rollouts(1, worker_id="w", idempotency_key=key),
        other=lambda store, _, key: store.dequeue_rollouts(1, worker_id="another", idempotency_key=key),
        effects=_attempts,
    ),
    Write(
        "cancel",
        prepare=_two_queued,
        call=lambda store, ids, key: store.cancel_rollout(ids[0], idempotency_key=key),
        other=lambda store, ids, key: store.cancel_rollout(ids[1], idempotency_key=key),
        effects=lambda store, _: store.count_rollouts(RolloutFilter(status=["cancelled"])),
    ),
    Write(
        "add_resources",
        prepare=lambda store: None,
        call=lambda store, _, key: store.add_resources({"temperature": 0.5}, idempotency_key=key),
        other=lambda store, _, key: store.add_resources({"temperature": 0.9}, idempotency_key=key),
        effects=lambda store, _: len(store.query_resources()),
    ),
    Write(
        "add_metrics",  # a record is stamped when made: a retry sends the same one
        prepare=lambda store: [MetricRecord(run_id="r", step=step, values={"loss": 0.5}) for step in (1, 2)],
        call=lambda store, records, key: store.add_metrics(records[:1], idempotency_key=key),
        other=lambda store, records, key: store.add_metrics(records[1:], idempotency_key=key),
        effects=lambda store, _: len(store.query_metrics()),
    ),
]
BY_NAME = {write.name: write for write in WRITES}


def _dump(answer: Any) -> Any:
    if isinstance(answer, list):
        return [item.model_dump() for item in answer]
    return answer.model_dump() if answer is not None else None


@pytest.fixture(params=[write.name for write in WRITES])
def write(request: pytest.FixtureRequest) -> Write:
    return BY_NAME[request.param]


def test_same_key_twice_gives_the_first_answer_and_one_effect(store, write):
    stage = write.prepare(store)
    before = write.effects(store, stage)
    first = write.call(store, stage, "key-1")
    assert write.effects(store, stage) == before + 1
    again = write.call(store, stage, "key-1")
    assert _dump(again) == _dump(first)
    assert write.effects(store, stage) == before + 1, "the repeat did the write again"


def test_a_new_key_is_a_new_write(store):
    first = store.enqueue_rollouts([{"input": 1}], idempotency_key="a")
    second = store.enqueue_rollouts([{"input": 1}], idempotency_key="b")
    assert first[0].rollout_id != second[0].rollout_id and store.count_rollouts() == 2
    assert store.dequeue_rollout(idempotency_key="a").rollout.rollout_id == first[0].rollout_id, (
        "keys belong to one operation: the enqueue's key is free for a dequeue"
    )


def test_same_key_with_another_request_is_refused_and_changes_nothing(store, write):
    stage = write.prepare(store)
    first = write.call(store, stage, "key-1")
    effects = write.effects(store, stage)
    with pytest.raises(IdempotencyKeyReusedError) as info:
        write.other(store, stage, "key-1")
    assert isinstance(info.value, InvalidInputError)
    assert "key-1" in str(info.value) and "different" in str(info.value)
    assert info.value.key == "key-1"
    assert write.effects(store, stage) == effects
    assert _dump(write.call(store, stage, "key-1")) == _dump(first), "the exact repeat still gets its answer"


def test_the_first_answer_survives_a_reopen(backend, write):
    backend.require("durable")
    store = backend.new()
    stage = write.prepare(store)
    first = write.call(store, stage, "key-durable")
    effects = write.effects(store, stage)
    store = backend.reopen(store)
    assert _dump(write.call(store, stage, "key-durable")) == _dump(first)
    assert write.effects(store, stage) == effects


def test_a_key_is_shared_by_every_store_over_the_same_data(backend):
    backend.require("shared")
    one, two = backend.new(), backend.another()
    _two_queued(one)
    claimed = one.dequeue_rollout(worker_id="w", idempotency_key="k")
    assert two.dequeue_rollout(worker_id="w", idempotency_key="k") == claimed
    assert two.dequeue_rollout(worker_id="w").rollout.rollout_id != claimed.rollout.rollout_id


@pytest.mark.parametrize("key", ["", "x" * (idempotency.MAX_KEY_CHARS + 1), "new\nline", "tab\there", "ü-key"])
def test_bad_keys_are_refused_before_anything_is_stored(store, key):
    with pytest.raises(InvalidInputError) as info:
        store.enqueue_rollouts([{"input": 1}], idempotency_key=key)
    assert "idempotency key" in str(info.value) and str(idempotency.MAX_KEY_CHARS) in str(info.value)
    assert store.count_rollouts() == 0


def test_the_longest_key_is_accepted(store):
    key = "k" * idempotency.MAX_KEY_CHARS
    first = store.add_resources({"t": 1}, idempotency_key=key)
    assert store.add_resources({"t": 1}, idempotency_key=key) == first
    assert len(store.query_resources()) == 1


def test_a_refused_write_is_not_recorded(store):
    with pytest.raises(NotFoundError):
        store.cancel_rollout("ro-later", idempotency_key="k")
    store.enqueue_rollout("x", rollout_id="ro-later")
    assert store.cancel_rollout("ro-later", idempotency_key="k").status == "cancelled"


def test_a_dequeue_that_claimed_nothing_is_not_recorded(store):
    assert store.dequeue_rollouts(1, worker_id="w", idempotency_key="k") == []
    rid = store.enqueue_rollout("late").rollout_id
    claimed = store.dequeue_rollouts(1, worker_id="w", idempotency_key="k")
    assert [c.rollout.rollout_id for c in claimed] == [rid]
    assert store.dequeue_rollouts(1, worker_id="w", idempotency_key="k") == claimed


def test_same_key_long_polls_side_by_side_get_one_claim(store, kit):
    results: list[Any] = []

    def poll() -> None:
        results.append(store.dequeue_rollouts(1, worker_id="w", timeout=10, idempotency_key="twin"))

    threads = [threading.Thread(target=poll) for _ in range(2)]
    for thread in threads:
        thread.start()
    kit.wait_until(lambda: False, timeout=0.3)  # both are waiting
    first, second = (r.rollout_id for r in store.enqueue_rollouts([{"input": 1}, {"input": 2}]))
    for thread in threads:
        thread.join(15)
    assert len(results) == 2 and results[0] == results[1]
    assert [c.rollout.rollout_id for c in results[0]] == [first]
    assert len(store.get_attempts(first)) == 1 and store.get_attempts(second) == []


# ---- bounds (the store's own settings: local backends) -------------------------------------------


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def local(backend, clock) -> TransactionalStore:
    store = backend.new(clock=clock)
    if not isinstance(store, TransactionalStore):
        pytest.skip("the bounds are the settings of the store behind the service")
    store.replay_prune_interval = 1
    return store


def test_records_expire_after_the_ttl(local, clock):
    first = local.enqueue_rollouts([{"input": 1}], idempotency_key="old")
    clock.advance(local.replay_ttl_seconds - 1)
    assert local.enqueue_rollouts([{"input": 1}], idempotency_key="old") == first, "kept for the whole TTL"
    local.add_metrics([MetricRecord(run_id="r", step=1, values={})], idempotency_key="prune-1")
    clock.advance(2)
    local.add_metrics([MetricRecord(run_id="r", step=2, values={})], idempotency_key="prune-2")
    again = local.enqueue_rollouts([{"input": 1}], idempotency_key="old")
    assert again[0].rollout_id != first[0].rollout_id, "an expired key names a new write"
    assert local.count_rollouts() == 2


def test_at_most_max_replays_are_kept(local):
    local.max_replays = 2
    answers = [local.add_resources({"n": i}, idempotency_key=f"k{i}") for i in range(3)]
    assert local.add_resources({"n": 2}, idempotency_key="k2") == answers[2]
    assert local.add_resources({"n": 1}, idempotency_key="k1") == answers[1]
    assert local.add_resources({"n": 0}, idempotency_key="k0").version == 4, "the oldest record was dropped"


def test_the_memory_backend_bounds_the_bytes_it_keeps(monkeypatch):
    from agentgrad.store import memory

    monkeypatch.setattr(memory, "MAX_REPLAY_CHARS", 3000)
    store = memory.MemoryStore(watchdog_interval=None)
    first = store.enqueue_rollouts([{"input": "x" * 1000}], idempotency_key="big-1")
    assert store.enqueue_rollouts([{"input": "x" * 1000}], idempotency_key="big-1") == first
    store.enqueue_rollouts([{"input": "y" * 1000}], idempotency_key="big-2")
    store.enqueue_rollouts([{"input": "z" * 1000}], idempotency_key="big-3")
    assert store.enqueue_rollouts([{"input": "x" * 1000}], idempotency_key="big-1") != first, "the oldest went first"
    assert store.count_rollouts() == 4

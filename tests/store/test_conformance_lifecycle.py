"""Conformance: the rollout/attempt status machine on the happy path, and the queue."""

from __future__ import annotations

import time

import pytest

from agentgrad.types import AttemptError, AttemptStatus, RolloutConfig, RolloutStatus


def test_enqueue_creates_queuing_rollout(store):
    before = time.time()
    rollout = store.enqueue_rollout({"q": "2+2"})
    assert rollout.status == "queuing"
    assert rollout.rollout_id
    assert rollout.num_attempts == 0
    assert rollout.start_time is None and rollout.end_time is None
    assert before - 1 <= rollout.enqueue_time <= time.time() + 1
    stored = store.get_rollout(rollout.rollout_id)
    assert stored.status == "queuing"
    assert stored.input == {"q": "2+2"}
    assert store.get_attempts(rollout.rollout_id) == []
    assert store.get_latest_attempt(rollout.rollout_id) is None


def test_enqueue_keeps_every_field(store):
    config = RolloutConfig(timeout_seconds=12.5, unresponsive_seconds=3.0, max_attempts=4, retry_on=["timeout"])
    rollout = store.enqueue_rollout(
        {"x": 1},
        mode="val",
        resources_id="res-a",
        config=config,
        metadata={"group_id": "g-1", "tags": ["a", "b"]},
        rollout_id="my-rollout",
    )
    assert rollout.rollout_id == "my-rollout"
    stored = store.get_rollout("my-rollout")
    assert stored.mode == "val"
    assert stored.resources_id == "res-a"
    assert stored.config == config
    assert stored.metadata == {"group_id": "g-1", "tags": ["a", "b"]}
    assert stored.group_id == "g-1"


@pytest.mark.parametrize(
    "task",
    [
        None,
        "plain string",
        42,
        3.25,
        True,
        ["a", 1, None, [2, {"deep": [True, False]}]],
        {"unicode": "héllo ✓ 日本", "nested": {"list": [1.5, -2, {"k": None}]}, "empty": {}},
    ],
    ids=["none", "str", "int", "float", "bool", "list", "nested-dict"],
)
def test_input_round_trips_any_json(store, task):
    rollout = store.enqueue_rollout(task)
    assert store.get_rollout(rollout.rollout_id).input == task
    claimed = store.dequeue_rollout()
    assert claimed.rollout.input == task


def test_generated_rollout_ids_are_unique(store):
    ids = [store.enqueue_rollout(i).rollout_id for i in range(50)]
    assert len(set(ids)) == 50


def test_dequeue_claims_rollout_and_creates_first_attempt(store):
    rollout = store.enqueue_rollout("task")
    claimed = store.dequeue_rollout(worker_id="worker-7")
    assert claimed is not None
    assert claimed.rollout.rollout_id == rollout.rollout_id
    assert claimed.rollout.status == "preparing"
    assert claimed.rollout.num_attempts == 1
    attempt = claimed.attempt
    assert attempt.rollout_id == rollout.rollout_id
    assert attempt.sequence_id == 1
    assert attempt.status == "preparing"
    assert attempt.worker_id == "worker-7"
    assert attempt.attempt_id
    assert attempt.end_time is None
    # The stored state agrees with what the runner was handed.
    assert store.get_rollout(rollout.rollout_id).status == "preparing"
    assert store.get_attempts(rollout.rollout_id) == [attempt]
    assert store.get_latest_attempt(rollout.rollout_id) == attempt


def test_running_attempt_moves_rollout_to_running(store, kit):
    claimed = kit.claim(store)
    rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
    attempt = store.update_attempt(rid, aid, "running")
    assert attempt.status == "running"
    assert store.get_latest_attempt(rid).status == "running"
    rollout = store.get_rollout(rid)
    assert rollout.status == "running"
    assert rollout.end_time is None


def test_succeeded_attempt_finishes_rollout(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    attempt = store.update_attempt(rid, aid, "succeeded")
    assert attempt.status == "succeeded"
    assert attempt.end_time is not None
    rollout = store.get_rollout(rid)
    assert rollout.status == "succeeded"
    assert rollout.end_time is not None
    assert store.get_latest_attempt(rid).end_time is not None


def test_start_and_end_times_are_ordered(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    time.sleep(0.01)
    store.update_attempt(rid, aid, "succeeded")
    rollout = store.get_rollout(rid)
    attempt = store.get_latest_attempt(rid)
    assert rollout.start_time is not None, "a rollout that ran has a start_time"
    assert rollout.enqueue_time <= rollout.start_time <= rollout.end_time
    assert attempt.start_time <= attempt.end_time
    assert rollout.end_time >= attempt.start_time


@pytest.mark.parametrize("final", ["succeeded", "failed", "timeout", "unresponsive"])
def test_every_terminal_attempt_status_sets_end_times(store, kit, final):
    started = kit.start(store, config=RolloutConfig(max_attempts=1))
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    error = None if final == "succeeded" else AttemptError(type="Boom", message="x")
    attempt = store.update_attempt(rid, aid, final, error=error)
    assert attempt.status == final
    assert attempt.end_time is not None
    rollout = store.get_rollout(rid)
    assert rollout.status == ("succeeded" if final == "succeeded" else "failed")
    assert rollout.end_time is not None
    assert rollout.status.is_terminal


def test_attempts_are_numbered_one_two_three(store, kit):
    started = kit.start(store, config=RolloutConfig(max_attempts=3, retry_on=["failed"]))
    rid = started.rollout.rollout_id
    seen = [started.attempt]
    store.update_attempt(rid, started.attempt.attempt_id, "failed")
    for _ in range(2):
        claimed = store.dequeue_rollout(worker_id="w-1")
        assert claimed is not None and claimed.rollout.rollout_id == rid
        seen.append(claimed.attempt)
        store.update_attempt(rid, claimed.attempt.attempt_id, "running")
        store.update_attempt(rid, claimed.attempt.attempt_id, "failed")
    assert [a.sequence_id for a in seen] == [1, 2, 3]
    attempts = store.get_attempts(rid)
    assert [a.sequence_id for a in attempts] == [1, 2, 3]
    assert len({a.attempt_id for a in attempts}) == 3
    rollout = store.get_rollout(rid)
    assert rollout.num_attempts == 3
    assert rollout.status == "failed"


def test_queue_is_fifo(store):
    ids = [store.enqueue_rollout(i).rollout_id for i in range(30)]
    got = []
    while (claimed := store.dequeue_rollout()) is not None:
        got.append(claimed.rollout.rollout_id)
    assert got == ids


def test_fifo_does_not_depend_on_rollout_id_order(store):
    ids = ["zz", "aa", "mm", "bb"]
    for rid in ids:
        store.enqueue_rollout(rollout_id=rid)
    got = [store.dequeue_rollout().rollout.rollout_id for _ in ids]
    assert got == ids


def test_batch_enqueue_keeps_order(store):
    from agentgrad.store.protocol import RolloutRequest

    rollouts = store.enqueue_rollouts([RolloutRequest(input=i) for i in range(5)])
    assert [r.input for r in rollouts] == [0, 1, 2, 3, 4]
    assert [c.rollout.rollout_id for c in store.dequeue_rollouts(5)] == [r.rollout_id for r in rollouts]


def test_dequeue_rollouts_batch(store):
    ids = [store.enqueue_rollout(i).rollout_id for i in range(5)]
    batch = store.dequeue_rollouts(3, worker_id="w-batch")
    assert [c.rollout.rollout_id for c in batch] == ids[:3]
    assert all(c.attempt.worker_id == "w-batch" for c in batch)
    assert all(c.attempt.sequence_id == 1 and c.attempt.status == "preparing" for c in batch)
    assert len({c.attempt.attempt_id for c in batch}) == 3
    rest = store.dequeue_rollouts(10)
    assert [c.rollout.rollout_id for c in rest] == ids[3:]
    assert store.dequeue_rollouts(10) == []


def test_dequeue_on_empty_store(store):
    assert store.dequeue_rollout() is None
    assert store.dequeue_rollouts(5) == []


def test_claimed_rollout_is_never_handed_out_twice(store):
    ids = {store.enqueue_rollout(i).rollout_id for i in range(3)}
    claimed = [store.dequeue_rollout() for _ in range(3)]
    assert {c.rollout.rollout_id for c in claimed} == ids
    assert store.dequeue_rollout() is None
    assert store.dequeue_rollouts(3) == []
    for c in claimed:
        assert len(store.get_attempts(c.rollout.rollout_id)) == 1


def test_running_and_finished_rollouts_are_not_dequeued(store, kit):
    done = kit.start(store)
    store.update_attempt(done.rollout.rollout_id, done.attempt.attempt_id, "succeeded")
    kit.start(store)
    assert store.dequeue_rollout() is None


def test_requeued_rollout_goes_to_back_of_queue(store):
    config = RolloutConfig(max_attempts=2, retry_on=["failed"])
    a = store.enqueue_rollout("a", config=config).rollout_id
    b = store.enqueue_rollout("b").rollout_id
    c = store.enqueue_rollout("c").rollout_id
    claimed = store.dequeue_rollout()
    assert claimed.rollout.rollout_id == a
    store.update_attempt(a, claimed.attempt.attempt_id, "running")
    store.update_attempt(a, claimed.attempt.attempt_id, "failed")
    assert store.get_rollout(a).status == "requeuing"
    order = [store.dequeue_rollout().rollout.rollout_id for _ in range(3)]
    assert order == [b, c, a]


def test_requeued_rollout_goes_behind_rollouts_enqueued_before_the_requeue(store):
    config = RolloutConfig(max_attempts=2, retry_on=["failed"])
    a = store.enqueue_rollout("a", config=config).rollout_id
    b = store.enqueue_rollout("b").rollout_id
    claimed = store.dequeue_rollout()
    store.update_attempt(a, claimed.attempt.attempt_id, "running")
    store.update_attempt(a, claimed.attempt.attempt_id, "failed")
    c = store.enqueue_rollout("c").rollout_id
    order = [store.dequeue_rollout().rollout.rollout_id for _ in range(3)]
    assert order == [b, a, c]


def test_first_span_moves_preparing_attempt_to_running(store, kit):
    claimed = kit.claim(store)
    rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
    store.add_span(kit.span(rid, aid, "first"))
    assert store.get_latest_attempt(rid).status == "running"
    assert store.get_rollout(rid).status == "running"


def test_span_on_running_attempt_keeps_it_running(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    store.add_span(kit.span(rid, aid))
    store.add_span(kit.span(rid, aid))
    assert store.get_latest_attempt(rid).status == "running"
    assert store.get_rollout(rid).status == "running"


def test_heartbeat_records_time(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    before = time.time()
    attempt = store.heartbeat(rid, aid)
    assert attempt.attempt_id == aid
    assert attempt.status == "running"
    assert attempt.last_heartbeat_time is not None
    assert attempt.last_heartbeat_time >= before - 0.5
    time.sleep(0.02)
    later = store.heartbeat(rid, aid)
    assert later.last_heartbeat_time > attempt.last_heartbeat_time
    assert store.get_latest_attempt(rid).last_heartbeat_time == later.last_heartbeat_time


def test_span_updates_heartbeat_time(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    before = store.get_latest_attempt(rid).last_heartbeat_time
    time.sleep(0.02)
    store.add_span(kit.span(rid, aid))
    after = store.get_latest_attempt(rid).last_heartbeat_time
    assert after is not None
    assert before is None or after > before


def test_returned_objects_are_copies(store, kit):
    rollout = store.enqueue_rollout({"k": [1]}, metadata={"m": 1})
    rollout.metadata["m"] = 999
    rollout.input["k"].append(2)
    fetched = store.get_rollout(rollout.rollout_id)
    assert fetched.metadata == {"m": 1}
    assert fetched.input == {"k": [1]}
    fetched.metadata["x"] = 1
    assert store.get_rollout(rollout.rollout_id).metadata == {"m": 1}


def test_objects_returned_by_changes_are_copies(store, kit):
    """Claims, status changes and heartbeats hand out records the caller may change freely."""
    claimed = kit.claim(store, {"k": [1]}, metadata={"m": [1]}, config=RolloutConfig(max_attempts=2))
    rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
    claimed.rollout.input["k"].append(2)
    claimed.rollout.metadata["m"].append(2)
    claimed.rollout.config.retry_on.clear()
    claimed.rollout.config.max_attempts = 9
    running = store.update_attempt(rid, aid, "running")
    running.status = AttemptStatus.SUCCEEDED
    store.heartbeat(rid, aid).last_heartbeat_time = 0.0
    failed = store.update_attempt(rid, aid, "failed", error=AttemptError(type="E", message="boom"))
    failed.error.message = "changed"
    store.update_attempt(rid, aid, "failed").error.type = "changed"  # no change: still a copy
    fetched = store.get_rollout(rid)
    assert fetched.input == {"k": [1]}
    assert fetched.metadata == {"m": [1]}
    assert fetched.config == RolloutConfig(max_attempts=2)
    assert fetched.status == RolloutStatus.REQUEUING  # the retry the stored config allows
    attempt = store.get_latest_attempt(rid)
    assert (attempt.status, attempt.error.type, attempt.error.message) == (AttemptStatus.FAILED, "E", "boom")
    assert attempt.last_heartbeat_time > 0.0

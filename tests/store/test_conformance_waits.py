"""Conformance: blocking calls wake on events, not on the end of their timeout."""

from __future__ import annotations

import time

from agentgrad.types import RolloutConfig


def _complete(store, rid, status="succeeded"):
    attempt = store.get_latest_attempt(rid)
    if attempt.status == "preparing":
        store.update_attempt(rid, attempt.attempt_id, "running")
    store.update_attempt(rid, attempt.attempt_id, status)


def test_wait_returns_when_completed_in_another_thread(store, kit):
    rid = kit.start(store).rollout.rollout_id
    worker = kit.later(0.2, lambda: _complete(store, rid))
    t0 = time.monotonic()
    done = store.wait_for_rollouts([rid], timeout=10)
    elapsed = time.monotonic() - t0
    worker.join(5)
    assert not worker.errors
    assert elapsed < 2, f"wait_for_rollouts took {elapsed:.2f}s for a completion after 0.2s"
    assert elapsed >= 0.1
    assert [r.rollout_id for r in done] == [rid]
    assert done[0].status == "succeeded"


def test_wait_for_several_returns_when_last_completes(store, kit):
    a = kit.start(store).rollout.rollout_id
    b = kit.start(store).rollout.rollout_id
    w1 = kit.later(0.1, lambda: _complete(store, a))
    w2 = kit.later(0.3, lambda: _complete(store, b, "failed"))
    t0 = time.monotonic()
    done = store.wait_for_rollouts([b, a], timeout=10)
    elapsed = time.monotonic() - t0
    w1.join(5), w2.join(5)
    assert 0.2 <= elapsed < 2.5
    assert [(r.rollout_id, r.status) for r in done] == [(b, "failed"), (a, "succeeded")]


def test_wait_wakes_on_cancel(store, kit):
    rid = kit.start(store).rollout.rollout_id
    worker = kit.later(0.2, lambda: store.cancel_rollout(rid))
    t0 = time.monotonic()
    done = store.wait_for_rollouts([rid], timeout=10)
    worker.join(5)
    assert time.monotonic() - t0 < 2
    assert [r.status for r in done] == ["cancelled"]


def test_wait_returns_partial_list_on_timeout(store, kit):
    finished = kit.start(store).rollout.rollout_id
    _complete(store, finished)
    pending = kit.start(store).rollout.rollout_id
    queued = store.enqueue_rollout().rollout_id
    t0 = time.monotonic()
    done = store.wait_for_rollouts([pending, finished, queued], timeout=0.3)
    elapsed = time.monotonic() - t0
    assert 0.25 <= elapsed < 2.5
    assert [r.rollout_id for r in done] == [finished]


def test_wait_zero_timeout_does_not_block(store, kit):
    rid = kit.start(store).rollout.rollout_id
    t0 = time.monotonic()
    assert store.wait_for_rollouts([rid], timeout=0) == []
    assert time.monotonic() - t0 < 1


def test_wait_returns_immediately_for_terminal(store, kit):
    ids = []
    for status in ("succeeded", "failed"):
        rid = kit.start(store).rollout.rollout_id
        _complete(store, rid, status)
        ids.append(rid)
    cancelled = store.enqueue_rollout().rollout_id
    store.cancel_rollout(cancelled)
    ids.append(cancelled)
    t0 = time.monotonic()
    done = store.wait_for_rollouts(ids, timeout=10)
    assert time.monotonic() - t0 < 1
    assert [r.rollout_id for r in done] == ids
    assert [r.status for r in done] == ["succeeded", "failed", "cancelled"]


def test_wait_returns_final_state(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    store.add_span(kit.span(rid, aid, "agentgrad.reward", attributes={"agentgrad.reward.value": 1.0}))
    _complete(store, rid)
    (done,) = store.wait_for_rollouts([rid], timeout=5)
    assert done == store.get_rollout(rid)
    assert done.end_time is not None and done.reward == 1.0


def test_wait_does_not_return_requeuing_rollout(store, kit):
    rid = kit.start(store, config=RolloutConfig(max_attempts=2, retry_on=["failed"])).rollout.rollout_id
    _complete(store, rid, "failed")
    assert store.get_rollout(rid).status == "requeuing"
    assert store.wait_for_rollouts([rid], timeout=0.2) == []


def test_wait_wakes_on_background_watchdog(backend, kit):
    store = backend.new(watchdog_interval=0.05)
    rid = kit.start(store, config=RolloutConfig(timeout_seconds=0.2)).rollout.rollout_id
    t0 = time.monotonic()
    done = store.wait_for_rollouts([rid], timeout=10)
    assert time.monotonic() - t0 < 3
    assert [r.status for r in done] == ["failed"]


def test_dequeue_wakes_on_enqueue_from_another_thread(store, kit):
    producer = kit.later(0.2, lambda: store.enqueue_rollout("late", rollout_id="ro-late"))
    t0 = time.monotonic()
    claimed = store.dequeue_rollout(worker_id="w", timeout=10)
    elapsed = time.monotonic() - t0
    producer.join(5)
    assert not producer.errors
    assert claimed is not None and claimed.rollout.rollout_id == "ro-late"
    assert 0.1 <= elapsed < 2, f"dequeue took {elapsed:.2f}s for an enqueue after 0.2s"


def test_dequeue_batch_wakes_on_enqueue(store, kit):
    producer = kit.later(0.2, lambda: store.enqueue_rollout("late"))
    t0 = time.monotonic()
    claimed = store.dequeue_rollouts(4, timeout=10)
    producer.join(5)
    assert time.monotonic() - t0 < 2
    assert len(claimed) == 1


def test_dequeue_wakes_on_requeue(store, kit):
    started = kit.start(store, config=RolloutConfig(max_attempts=2, retry_on=["failed"]))
    rid = started.rollout.rollout_id
    worker = kit.later(0.2, lambda: _complete(store, rid, "failed"))
    t0 = time.monotonic()
    claimed = store.dequeue_rollout(timeout=10)
    worker.join(5)
    assert time.monotonic() - t0 < 2
    assert claimed is not None and claimed.rollout.rollout_id == rid
    assert claimed.attempt.sequence_id == 2


def test_dequeue_timeout_on_empty_queue(store):
    t0 = time.monotonic()
    assert store.dequeue_rollout(timeout=0.3) is None
    elapsed = time.monotonic() - t0
    assert 0.25 <= elapsed < 2.5
    t0 = time.monotonic()
    assert store.dequeue_rollouts(3, timeout=0.2) == []
    assert time.monotonic() - t0 >= 0.15


def test_dequeue_with_timeout_returns_available_at_once(store):
    rid = store.enqueue_rollout().rollout_id
    t0 = time.monotonic()
    claimed = store.dequeue_rollout(timeout=10)
    assert time.monotonic() - t0 < 1
    assert claimed.rollout.rollout_id == rid

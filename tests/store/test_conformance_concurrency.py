"""Conformance: exclusive claims and consistent sequence ids under concurrent callers."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from agentgrad.errors import InvalidTransitionError
from agentgrad.store.protocol import RolloutRequest
from agentgrad.types import RolloutConfig


def _run_threads(n, target):
    """Run ``target(index)`` in ``n`` threads started together; re-raise the first error."""
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def body(i):
        try:
            barrier.wait(10)
            target(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a worker thread hung"
    if errors:
        raise errors[0]


def _drain(store, results, lock, worker_id, batch=1):
    while True:
        claimed = store.dequeue_rollouts(batch, worker_id=worker_id)
        if not claimed:
            return
        with lock:
            results.extend(claimed)


def test_concurrent_dequeue_claims_each_rollout_once(store):
    ids = [r.rollout_id for r in store.enqueue_rollouts([RolloutRequest(input=i) for i in range(200)])]
    results, lock = [], threading.Lock()
    _run_threads(8, lambda i: _drain(store, results, lock, f"w-{i}"))
    claimed_ids = Counter(c.rollout.rollout_id for c in results)
    assert sorted(claimed_ids) == sorted(ids)
    assert set(claimed_ids.values()) == {1}, "a rollout was handed out twice"
    assert len({c.attempt.attempt_id for c in results}) == 200
    assert all(c.attempt.sequence_id == 1 for c in results)
    for rid in ids[::20]:
        assert len(store.get_attempts(rid)) == 1


def test_concurrent_batch_dequeue_claims_each_rollout_once(store):
    store.enqueue_rollouts([RolloutRequest(input=i) for i in range(120)])
    results, lock = [], threading.Lock()
    _run_threads(6, lambda i: _drain(store, results, lock, f"w-{i}", batch=7))
    counts = Counter(c.rollout.rollout_id for c in results)
    assert len(counts) == 120 and set(counts.values()) == {1}
    # The worker id recorded on each attempt is the one that received it.
    for c in results[::10]:
        assert store.get_latest_attempt(c.rollout.rollout_id).worker_id == c.attempt.worker_id


def test_concurrent_enqueue(store):
    _run_threads(8, lambda i: [store.enqueue_rollout({"t": i, "j": j}) for j in range(25)])
    assert store.count_rollouts() == 200
    inputs = {(r.input["t"], r.input["j"]) for r in store.query_rollouts()}
    assert len(inputs) == 200


def test_concurrent_add_spans_get_contiguous_sequence_ids(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    returned, lock = [], threading.Lock()

    def writer(i):
        for _ in range(10):
            spans = store.add_spans([kit.span(rid, aid, f"t{i}") for _ in range(3)])
            with lock:
                returned.extend(s.sequence_id for s in spans)

    _run_threads(8, writer)
    assert sorted(returned) == list(range(1, 241))
    stored = store.query_spans(rid)
    assert [s.sequence_id for s in stored] == list(range(1, 241))


def test_concurrent_repeats_of_one_span_store_it_once(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    span = kit.span(rid, aid, "retried", span_id="same-span")
    returned, lock = [], threading.Lock()

    def writer(i):
        for _ in range(5):
            got = store.add_span(span)
            with lock:
                returned.append(got.sequence_id)

    _run_threads(8, writer)
    assert set(returned) == {1}
    assert len(store.query_spans(rid)) == 1


def test_concurrent_spans_on_many_rollouts(store, kit):
    runs = [kit.start(store) for _ in range(4)]

    def writer(i):
        run = runs[i % 4]
        for _ in range(20):
            store.add_span(kit.span(run.rollout.rollout_id, run.attempt.attempt_id))

    _run_threads(8, writer)
    for run in runs:
        assert [s.sequence_id for s in store.query_spans(run.rollout.rollout_id)] == list(range(1, 41))


def test_concurrent_finish_and_watchdog_agree(store, kit):
    """A runner finishing while the watchdog sweeps: the attempt ends exactly once."""
    runs = [kit.start(store, config=RolloutConfig(timeout_seconds=0.15)) for _ in range(20)]
    time.sleep(0.2)
    outcomes = {}

    def racer(i):
        if i == 0:
            for _ in range(3):
                store.check_watchdog()
        else:
            for run in runs[i - 1 :: 3]:
                try:
                    store.update_attempt(run.rollout.rollout_id, run.attempt.attempt_id, "succeeded")
                    outcomes[run.rollout.rollout_id] = "succeeded"
                except Exception as exc:  # lost the race to the watchdog
                    outcomes[run.rollout.rollout_id] = type(exc).__name__

    _run_threads(4, racer)
    for run in runs:
        rid = run.rollout.rollout_id
        attempt = store.get_latest_attempt(rid)
        rollout = store.get_rollout(rid)
        assert attempt.status in ("succeeded", "timeout")
        assert rollout.status == ("succeeded" if attempt.status == "succeeded" else "failed")
        if outcomes[rid] == "succeeded":
            assert attempt.status == "succeeded"
        else:
            assert outcomes[rid] == "InvalidTransitionError"
            assert attempt.status == "timeout"


# ---- several store objects over the same data (like several processes) ------------------------


def test_two_stores_never_double_claim(backend):
    first = backend.new()
    second = backend.another()
    ids = [r.rollout_id for r in first.enqueue_rollouts([RolloutRequest(input=i) for i in range(100)])]
    results, lock = [], threading.Lock()

    def worker(i):
        _drain(first if i % 2 else second, results, lock, f"w-{i}")

    _run_threads(6, worker)
    counts = Counter(c.rollout.rollout_id for c in results)
    assert sorted(counts) == sorted(ids)
    assert set(counts.values()) == {1}, "two store objects handed out the same rollout"


def test_two_stores_see_each_others_writes(backend, kit):
    first = backend.new()
    second = backend.another()
    rid = first.enqueue_rollout({"x": 1}).rollout_id
    claimed = second.dequeue_rollout(worker_id="w-2")
    assert claimed.rollout.rollout_id == rid
    assert first.get_rollout(rid).status == "preparing"
    first.add_span(kit.span(rid, claimed.attempt.attempt_id, "from-first"))
    span = second.add_span(kit.span(rid, claimed.attempt.attempt_id, "from-second"))
    assert span.sequence_id == 2
    assert [s.name for s in first.query_spans(rid)] == ["from-first", "from-second"]
    second.update_attempt(rid, claimed.attempt.attempt_id, "succeeded")
    assert first.get_rollout(rid).status == "succeeded"
    assert first.dequeue_rollout() is None


def test_a_store_acts_on_what_another_store_wrote_since_it_last_looked(backend, kit):
    """Each store reads the rollout and the attempt it touches on every call (SQL stores keep
    parsed rows while their text is unchanged): a change through another store object in between
    must be what the next call acts on, never the copy it remembers."""
    first = backend.new()
    second = backend.another()
    started = kit.start(first, config=RolloutConfig(max_attempts=2))
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    first.add_span(kit.span(rid, aid, "remembered"))  # first has now read (and kept) both records
    second.update_attempt(rid, aid, "failed")  # the rollout goes back to the queue for attempt 2
    beat = first.heartbeat(rid, aid)
    assert beat.status == "failed"
    first.add_span(kit.span(rid, aid, "late"))  # a late span of the failed attempt changes nothing
    with pytest.raises(InvalidTransitionError):
        first.update_attempt(rid, aid, "succeeded")
    assert [a.status for a in second.get_attempts(rid)] == ["failed"]
    assert first.get_rollout(rid).status == "requeuing"
    retry = first.dequeue_rollout()
    assert retry.attempt.sequence_id == 2


def test_two_stores_concurrent_spans_contiguous(backend, kit):
    first = backend.new()
    second = backend.another()
    started = kit.start(first)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id

    def writer(i):
        target = first if i % 2 else second
        for _ in range(15):
            target.add_span(kit.span(rid, aid))

    _run_threads(4, writer)
    assert [s.sequence_id for s in first.query_spans(rid)] == list(range(1, 61))


def test_wait_sees_completion_by_another_store(backend, kit):
    first = backend.new()
    second = backend.another()
    started = kit.start(first)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    finisher = kit.later(0.2, lambda: second.update_attempt(rid, aid, "succeeded"))
    t0 = time.monotonic()
    done = first.wait_for_rollouts([rid], timeout=10)
    finisher.join(5)
    assert not finisher.errors
    assert time.monotonic() - t0 < 3
    assert [r.status for r in done] == ["succeeded"]


def test_dequeue_sees_enqueue_by_another_store(backend, kit):
    first = backend.new()
    second = backend.another()
    producer = kit.later(0.2, lambda: second.enqueue_rollout("x", rollout_id="ro-other"))
    t0 = time.monotonic()
    claimed = first.dequeue_rollout(timeout=10)
    producer.join(5)
    assert time.monotonic() - t0 < 3
    assert claimed is not None and claimed.rollout.rollout_id == "ro-other"

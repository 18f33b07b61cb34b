"""Conformance: the store-side watchdog (timeouts and unresponsive attempts).

Time is a :class:`ManualClock` injected into the store (``clock=``; for the HTTP backend, into the
in-process store behind the server): tests move it with ``advance`` and sweep with
``check_watchdog()`` instead of sleeping. Stores are opened without a background watchdog unless
the test is about it. Two tests still take real time: one background sweep on the default (real)
clock, end to end, and the thread checks.
"""

from __future__ import annotations

import threading
import time

import pytest
from manual_clock import ManualClock

from agentgrad.types import AttemptError, RolloutConfig


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store(backend, clock):
    """The conformance suite's store (see conftest.py), on ``clock``, with no background watchdog."""
    return backend.new(clock=clock)


def test_timeout_after_timeout_seconds(store, kit, clock):
    started = kit.start(store, config=RolloutConfig(timeout_seconds=0.2))
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    assert store.check_watchdog() == []
    assert store.get_latest_attempt(rid).status == "running"
    clock.advance(0.15)
    assert store.check_watchdog() == [], "not overdue before timeout_seconds"
    clock.advance(0.15)
    changed = store.check_watchdog()
    assert [(a.rollout_id, a.attempt_id, a.status) for a in changed] == [(rid, aid, "timeout")]
    attempt = store.get_latest_attempt(rid)
    assert attempt.status == "timeout"
    assert attempt.end_time is not None
    rollout = store.get_rollout(rid)
    assert rollout.status == "failed"
    assert rollout.end_time is not None
    assert attempt.end_time == rollout.end_time == clock(), "stamped by the store's clock"


def test_timeout_whatever_text_the_records_hold(store, kit, clock):
    """Strings JSON escapes (a NUL, a literal backslash-u) must not keep the watchdog from reading
    attempts' clocks; PostgreSQL's JSON functions, for one, refuse the \\u0000 escape."""
    odd = {"nul": "a\x00b", "escaped": "\\u0000", "timeout_seconds": "not this one"}
    started = kit.start(store, odd, metadata=odd, config=RolloutConfig(timeout_seconds=0.2))
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    store.update_attempt(rid, aid, "failed", error=AttemptError(type="E", message="a\x00b"))
    other = kit.start(store, odd, config=RolloutConfig(timeout_seconds=0.2))
    clock.advance(0.3)
    changed = store.check_watchdog()
    assert [(a.rollout_id, a.status) for a in changed] == [(other.rollout.rollout_id, "timeout")]
    assert store.get_rollout(other.rollout.rollout_id).input == odd


def test_heartbeats_do_not_extend_timeout(store, kit, clock):
    started = kit.start(store, config=RolloutConfig(timeout_seconds=0.3))
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    for _ in range(9):  # 0.45 s of heartbeats every 0.05 s
        store.heartbeat(rid, aid)
        clock.advance(0.05)
    store.heartbeat(rid, aid)
    store.check_watchdog()
    assert store.get_latest_attempt(rid).status == "timeout"


def test_timeout_applies_to_preparing_attempt(store, kit, clock):
    claimed = kit.claim(store, config=RolloutConfig(timeout_seconds=0.2))
    rid = claimed.rollout.rollout_id
    clock.advance(0.3)
    store.check_watchdog()
    assert store.get_latest_attempt(rid).status == "timeout"
    assert store.get_rollout(rid).status == "failed"


def test_unresponsive_after_silence(store, kit, clock):
    started = kit.start(store, config=RolloutConfig(unresponsive_seconds=0.2, max_attempts=1))
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    clock.advance(0.3)
    changed = store.check_watchdog()
    assert [(a.attempt_id, a.status) for a in changed] == [(aid, "unresponsive")]
    attempt = store.get_latest_attempt(rid)
    assert attempt.status == "unresponsive"
    assert attempt.end_time is not None
    rollout = store.get_rollout(rid)
    assert rollout.status == "failed" and rollout.end_time is not None


def test_unresponsive_counts_from_last_heartbeat(store, kit, clock):
    started = kit.start(store, config=RolloutConfig(unresponsive_seconds=0.25))
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    clock.advance(0.15)
    store.heartbeat(rid, aid)
    clock.advance(0.15)  # 0.3 s since start, 0.15 s since the heartbeat
    assert store.check_watchdog() == []
    assert store.get_latest_attempt(rid).status == "running"
    clock.advance(0.2)
    store.check_watchdog()
    assert store.get_latest_attempt(rid).status == "unresponsive"


def test_heartbeats_keep_attempt_alive(store, kit, clock):
    started = kit.start(store, config=RolloutConfig(unresponsive_seconds=0.25))
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    for _ in range(12):  # 0.6 s, more than twice unresponsive_seconds
        store.heartbeat(rid, aid)
        assert store.check_watchdog() == []
        clock.advance(0.05)
    assert store.get_latest_attempt(rid).status == "running"


def test_spans_keep_attempt_alive(store, kit, clock):
    started = kit.start(store, config=RolloutConfig(unresponsive_seconds=0.25))
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    for _ in range(12):  # 0.6 s, more than twice unresponsive_seconds
        store.add_spans([kit.span(rid, aid)])
        assert store.check_watchdog() == []
        clock.advance(0.05)
    assert store.get_latest_attempt(rid).status == "running"
    clock.advance(0.35)
    store.check_watchdog()
    assert store.get_latest_attempt(rid).status == "unresponsive"


def test_unresponsive_applies_to_preparing_attempt(store, kit, clock):
    claimed = kit.claim(store, config=RolloutConfig(unresponsive_seconds=0.2))
    rid = claimed.rollout.rollout_id
    clock.advance(0.3)
    store.check_watchdog()
    assert store.get_latest_attempt(rid).status == "unresponsive"


def test_watchdog_requeues_when_retries_remain(store, kit, clock):
    started = kit.start(store, config=RolloutConfig(timeout_seconds=0.2, max_attempts=2, retry_on=["timeout"]))
    rid = started.rollout.rollout_id
    clock.advance(0.3)
    store.check_watchdog()
    rollout = store.get_rollout(rid)
    assert rollout.status == "requeuing"
    assert rollout.end_time is None
    second = store.dequeue_rollout()
    assert second is not None and second.rollout.rollout_id == rid
    assert second.attempt.sequence_id == 2
    assert second.attempt.status == "preparing"
    # The fresh attempt has its own clock: it is not overdue right away.
    assert store.check_watchdog() == []


def test_watchdog_respects_retry_on(store, kit, clock):
    started = kit.start(store, config=RolloutConfig(unresponsive_seconds=0.2, max_attempts=3, retry_on=["timeout"]))
    rid = started.rollout.rollout_id
    clock.advance(0.3)
    store.check_watchdog()
    assert store.get_rollout(rid).status == "failed"
    assert store.dequeue_rollout() is None


def test_check_watchdog_returns_only_changed_attempts(store, kit, clock):
    slow = kit.start(store, config=RolloutConfig(timeout_seconds=0.2))
    kit.start(store, config=RolloutConfig(timeout_seconds=30))
    kit.start(store, config=RolloutConfig(unresponsive_seconds=None))  # no limits at all
    clock.advance(0.3)
    changed = store.check_watchdog()
    assert [a.attempt_id for a in changed] == [slow.attempt.attempt_id]
    assert changed[0].status == "timeout"
    assert store.check_watchdog() == [], "an attempt is changed once"


def test_watchdog_ignores_terminal_attempts(store, kit, clock):
    config = RolloutConfig(timeout_seconds=0.2, unresponsive_seconds=0.2, max_attempts=3)
    done = kit.start(store, config=config)
    store.update_attempt(done.rollout.rollout_id, done.attempt.attempt_id, "succeeded")
    failed = kit.start(store, config=RolloutConfig(timeout_seconds=0.2))
    store.update_attempt(failed.rollout.rollout_id, failed.attempt.attempt_id, "failed")
    clock.advance(0.3)
    assert store.check_watchdog() == []
    assert store.get_latest_attempt(done.rollout.rollout_id).status == "succeeded"
    assert store.get_rollout(done.rollout.rollout_id).status == "succeeded"
    assert store.get_latest_attempt(failed.rollout.rollout_id).status == "failed"


def test_watchdog_ignores_queued_rollouts(store, clock):
    rid = store.enqueue_rollout(config=RolloutConfig(timeout_seconds=0.1, unresponsive_seconds=0.1)).rollout_id
    clock.advance(0.2)
    assert store.check_watchdog() == []
    assert store.get_rollout(rid).status == "queuing"
    claimed = store.dequeue_rollout()
    assert claimed.rollout.rollout_id == rid
    assert store.check_watchdog() == [], "the attempt clock starts at dequeue, not at enqueue"


def test_background_watchdog_catches_timeout(backend, kit):
    """On the default, real clock: no injected clock, nothing moved by hand."""
    store = backend.new(watchdog_interval=0.05)
    started = kit.start(store, config=RolloutConfig(timeout_seconds=0.2))
    rid = started.rollout.rollout_id
    assert kit.wait_until(lambda: store.get_rollout(rid).status == "failed", timeout=5)
    assert store.get_latest_attempt(rid).status == "timeout"


def test_background_watchdog_catches_unresponsive(backend, kit, clock):
    store = backend.new(watchdog_interval=0.05, clock=clock)
    started = kit.start(store, config=RolloutConfig(unresponsive_seconds=0.2, max_attempts=2))
    rid = started.rollout.rollout_id
    clock.advance(0.3)  # the background thread's next sweep sees it
    assert kit.wait_until(lambda: store.get_rollout(rid).status == "requeuing", timeout=5)
    assert store.get_latest_attempt(rid).status == "unresponsive"


def test_disabled_background_watchdog_changes_nothing(backend, kit, clock):
    before = set(threading.enumerate())
    store = backend.new(clock=clock)  # watchdog_interval=None: the suite's default
    started = kit.start(store, config=RolloutConfig(timeout_seconds=0.1))
    clock.advance(0.3)
    time.sleep(0.1)  # real time for a sweep that must not happen
    assert store.get_latest_attempt(started.rollout.rollout_id).status == "running"
    assert not [t for t in threading.enumerate() if t not in before and t.name == "agentgrad-watchdog"]


def test_close_stops_background_threads(backend):
    before = set(threading.enumerate())
    store = backend.new(watchdog_interval=0.05)
    store.enqueue_rollout()
    time.sleep(0.1)
    backend.close(store)

    def leftovers():
        return [t for t in threading.enumerate() if t not in before and t.is_alive()]

    deadline = time.monotonic() + 3
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leftovers() == []


def test_default_config_recovers_a_silent_attempt(store, kit, clock):
    """A runner killed outright stops heartbeating: with the default config its rollout is run
    again after the default deadline, and a runner that keeps beating is left alone."""
    dead = kit.start(store)
    alive = kit.start(store)
    deadline = RolloutConfig().unresponsive_seconds
    assert deadline is not None
    for _ in range(int(deadline // 5) + 2):  # a heartbeat every 5 s: the runner's default interval
        clock.advance(5)
        store.heartbeat(alive.rollout.rollout_id, alive.attempt.attempt_id)
        store.check_watchdog()
    assert store.get_latest_attempt(dead.rollout.rollout_id).status == "unresponsive"
    assert store.get_rollout(dead.rollout.rollout_id).status == "requeuing"
    assert store.get_latest_attempt(alive.rollout.rollout_id).status == "running"
    again = store.dequeue_rollout()
    assert again.rollout.rollout_id == dead.rollout.rollout_id and again.attempt.sequence_id == 2


def test_silence_while_the_store_was_closed_does_not_count(backend, kit, clock):
    """A store restarted after an outage longer than the deadline (no runner could reach it) gives
    each attempt the whole deadline again, counted from its own start; a time limit still holds."""
    backend.require("durable")
    store = backend.new(clock=clock)
    silent = kit.start(store, config=RolloutConfig(unresponsive_seconds=0.2, max_attempts=1))
    slow = kit.start(store, config=RolloutConfig(timeout_seconds=0.2, max_attempts=1))
    backend.close(store)
    clock.advance(0.3)  # the outage: longer than both limits
    store = backend.new(clock=clock)
    changed = store.check_watchdog()
    assert [(a.attempt_id, a.status) for a in changed] == [(slow.attempt.attempt_id, "timeout")]
    assert store.get_latest_attempt(silent.rollout.rollout_id).status == "running"
    clock.advance(0.3)  # silent for a whole deadline after the restart: now it is judged
    store.check_watchdog()
    assert store.get_latest_attempt(silent.rollout.rollout_id).status == "unresponsive"

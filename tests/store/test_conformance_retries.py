"""Conformance: retries (``RolloutConfig.max_attempts`` / ``retry_on``) and cancellation."""

from __future__ import annotations

import pytest

from agentgrad.errors import AgentGradError, InvalidTransitionError, NotFoundError
from agentgrad.types import AttemptError, RolloutConfig


def _finish(store, claimed, status, error=None):
    rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
    if claimed.attempt.status == "preparing":
        store.update_attempt(rid, aid, "running")
    return store.update_attempt(rid, aid, status, error=error)


# ---- retries -------------------------------------------------------------------------------


def test_failed_attempt_with_retries_left_requeues(store, kit):
    started = kit.start(store, config=RolloutConfig(max_attempts=2, retry_on=["failed"]))
    rid = started.rollout.rollout_id
    attempt = _finish(store, started, "failed")
    assert attempt.status == "failed"
    assert attempt.end_time is not None
    rollout = store.get_rollout(rid)
    assert rollout.status == "requeuing"
    assert rollout.end_time is None, "a requeuing rollout has not ended"
    second = store.dequeue_rollout(worker_id="w-2")
    assert second is not None
    assert second.rollout.rollout_id == rid
    assert second.attempt.sequence_id == 2
    assert second.attempt.worker_id == "w-2"
    assert second.attempt.attempt_id != started.attempt.attempt_id
    assert second.rollout.status == "preparing"
    assert second.rollout.num_attempts == 2


def test_retry_that_succeeds_finishes_rollout(store, kit):
    started = kit.start(store, config=RolloutConfig(max_attempts=3, retry_on=["failed"]))
    rid = started.rollout.rollout_id
    _finish(store, started, "failed")
    second = store.dequeue_rollout()
    _finish(store, second, "succeeded")
    rollout = store.get_rollout(rid)
    assert rollout.status == "succeeded"
    assert rollout.end_time is not None
    assert [a.status for a in store.get_attempts(rid)] == ["failed", "succeeded"]
    assert store.dequeue_rollout() is None


def test_failed_not_in_retry_on_fails_rollout(store, kit):
    started = kit.start(store, config=RolloutConfig(max_attempts=3, retry_on=["timeout", "unresponsive"]))
    rid = started.rollout.rollout_id
    _finish(store, started, "failed")
    rollout = store.get_rollout(rid)
    assert rollout.status == "failed"
    assert rollout.end_time is not None
    assert store.dequeue_rollout() is None


def test_default_config_does_not_retry(store, kit):
    started = kit.start(store)
    _finish(store, started, "failed")
    assert store.get_rollout(started.rollout.rollout_id).status == "failed"
    assert store.dequeue_rollout() is None


def test_exhausting_attempts_fails_rollout(store, kit):
    started = kit.start(store, config=RolloutConfig(max_attempts=2, retry_on=["failed"]))
    rid = started.rollout.rollout_id
    _finish(store, started, "failed")
    second = store.dequeue_rollout()
    _finish(store, second, "failed")
    rollout = store.get_rollout(rid)
    assert rollout.status == "failed"
    assert rollout.end_time is not None
    assert rollout.num_attempts == 2
    assert store.dequeue_rollout() is None
    assert len(store.get_attempts(rid)) == 2


@pytest.mark.parametrize("reason", ["timeout", "unresponsive"])
def test_reason_in_retry_on_requeues(store, kit, reason):
    started = kit.start(store, config=RolloutConfig(max_attempts=2, retry_on=[reason]))
    rid = started.rollout.rollout_id
    _finish(store, started, reason)
    assert store.get_rollout(rid).status == "requeuing"
    second = store.dequeue_rollout()
    assert second.rollout.rollout_id == rid and second.attempt.sequence_id == 2


@pytest.mark.parametrize("reason", ["timeout", "unresponsive"])
def test_reason_not_in_retry_on_fails(store, kit, reason):
    other = "unresponsive" if reason == "timeout" else "timeout"
    started = kit.start(store, config=RolloutConfig(max_attempts=3, retry_on=["failed", other]))
    rid = started.rollout.rollout_id
    _finish(store, started, reason)
    rollout = store.get_rollout(rid)
    assert rollout.status == "failed"
    assert rollout.end_time is not None
    assert store.dequeue_rollout() is None


def test_success_is_never_retried(store, kit):
    started = kit.start(store, config=RolloutConfig(max_attempts=5))
    _finish(store, started, "succeeded")
    assert store.get_rollout(started.rollout.rollout_id).status == "succeeded"
    assert store.dequeue_rollout() is None


def test_error_is_stored(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    error = AttemptError(type="ValueError", message="bad things: ünïcode", traceback="Traceback...\n  line 1\n")
    returned = store.update_attempt(rid, aid, "failed", error=error)
    assert returned.error == error
    stored = store.get_latest_attempt(rid)
    assert stored.error == error
    assert stored.error.traceback == "Traceback...\n  line 1\n"


def test_updating_old_attempt_does_not_change_rollout(store, kit):
    """A late report from the runner of a superseded attempt is refused; the retry is untouched."""
    started = kit.start(store, config=RolloutConfig(max_attempts=2, retry_on=["timeout"]))
    rid, old = started.rollout.rollout_id, started.attempt.attempt_id
    _finish(store, started, "timeout")
    second = store.dequeue_rollout()
    new = second.attempt.attempt_id
    store.update_attempt(rid, new, "running")
    with pytest.raises(InvalidTransitionError):
        store.update_attempt(rid, old, "succeeded")
    assert store.get_rollout(rid).status == "running"
    attempts = {a.attempt_id: a for a in store.get_attempts(rid)}
    assert attempts[old].status == "timeout"
    assert attempts[new].status == "running"


def test_late_span_of_old_attempt_does_not_drive_rollout(store, kit):
    started = kit.start(store, config=RolloutConfig(max_attempts=2, retry_on=["failed"]))
    rid, old = started.rollout.rollout_id, started.attempt.attempt_id
    _finish(store, started, "failed")
    second = store.dequeue_rollout()
    new = second.attempt.attempt_id
    try:
        store.add_span(kit.span(rid, old, "late"))
    except AgentGradError:
        pass  # refusing late spans is allowed; changing the rollout is not
    attempts = {a.attempt_id: a for a in store.get_attempts(rid)}
    assert attempts[old].status == "failed"
    assert attempts[new].status == "preparing"
    assert store.get_rollout(rid).status == "preparing"


def test_heartbeat_on_superseded_attempt_reports_its_status(store, kit):
    started = kit.start(store, config=RolloutConfig(max_attempts=2, retry_on=["unresponsive"]))
    rid, old = started.rollout.rollout_id, started.attempt.attempt_id
    _finish(store, started, "unresponsive")
    store.dequeue_rollout()
    assert store.heartbeat(rid, old).status == "unresponsive"
    assert store.get_rollout(rid).status == "preparing"


# ---- cancellation ----------------------------------------------------------------------------


def test_cancel_queued_rollout(store):
    rid = store.enqueue_rollout("x").rollout_id
    rollout = store.cancel_rollout(rid)
    assert rollout.status == "cancelled"
    assert rollout.end_time is not None
    stored = store.get_rollout(rid)
    assert stored.status == "cancelled" and stored.end_time is not None
    assert store.dequeue_rollout() is None
    assert store.get_attempts(rid) == []


def test_cancelled_rollout_is_skipped_by_queue(store):
    a = store.enqueue_rollout("a").rollout_id
    b = store.enqueue_rollout("b").rollout_id
    c = store.enqueue_rollout("c").rollout_id
    store.cancel_rollout(b)
    # A batch of two is filled from what is really queued; the cancelled one takes no slot.
    assert [x.rollout.rollout_id for x in store.dequeue_rollouts(2)] == [a, c]
    assert store.dequeue_rollouts(5) == []


@pytest.mark.parametrize("phase", ["preparing", "running"])
def test_cancel_active_rollout_fails_attempt_as_cancelled(store, kit, phase):
    claimed = kit.claim(store, config=RolloutConfig(max_attempts=3))
    rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
    if phase == "running":
        store.update_attempt(rid, aid, "running")
    rollout = store.cancel_rollout(rid)
    assert rollout.status == "cancelled"
    assert rollout.end_time is not None
    attempt = store.get_latest_attempt(rid)
    assert attempt.attempt_id == aid
    assert attempt.status == "failed"
    assert attempt.end_time is not None
    assert attempt.error is not None and attempt.error.type == "Cancelled"
    # Even with retries left and "failed" in retry_on, a cancelled rollout is not requeued.
    assert store.get_rollout(rid).status == "cancelled"
    assert store.dequeue_rollout() is None


def test_cancel_requeuing_rollout(store, kit):
    started = kit.start(store, config=RolloutConfig(max_attempts=3, retry_on=["failed"]))
    rid = started.rollout.rollout_id
    _finish(store, started, "failed")
    assert store.get_rollout(rid).status == "requeuing"
    rollout = store.cancel_rollout(rid)
    assert rollout.status == "cancelled" and rollout.end_time is not None
    assert store.dequeue_rollout() is None
    assert len(store.get_attempts(rid)) == 1


def test_runner_report_after_cancel_is_refused(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    store.cancel_rollout(rid)
    with pytest.raises(InvalidTransitionError):
        store.update_attempt(rid, aid, "succeeded")
    assert store.get_rollout(rid).status == "cancelled"
    assert store.heartbeat(rid, aid).status == "failed"


@pytest.mark.parametrize("final", ["succeeded", "failed"])
def test_cancel_terminal_rollout_is_invalid(store, kit, final):
    started = kit.start(store)
    rid = started.rollout.rollout_id
    _finish(store, started, final)
    before = store.get_rollout(rid)
    with pytest.raises(InvalidTransitionError) as info:
        store.cancel_rollout(rid)
    message = str(info.value)
    assert final in message and "cancelled" in message
    assert store.get_rollout(rid) == before


def test_cancel_twice_is_invalid(store):
    rid = store.enqueue_rollout().rollout_id
    store.cancel_rollout(rid)
    with pytest.raises(InvalidTransitionError):
        store.cancel_rollout(rid)


def test_cancel_unknown_rollout(store):
    with pytest.raises(NotFoundError) as info:
        store.cancel_rollout("ro-does-not-exist")
    assert "ro-does-not-exist" in str(info.value)

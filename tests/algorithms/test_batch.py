"""run_batch / wait_batch: each straggler policy against a MemoryStore served by a real Runner."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

import agents_for_tests
import pytest

from agentgrad.algorithms.batch import StragglersError, run_batch, wait_batch
from agentgrad.runner import Runner
from agentgrad.store.memory import MemoryStore
from agentgrad.store.protocol import RolloutRequest
from agentgrad.types import RolloutStatus

#: Quick rollouts, and one that would sleep far past every deadline below.
QUICK, STUCK = {"sleep": 0}, {"sleep": 60}
#: A deadline the quick rollouts meet even on a busy machine (the runner is warmed up first).
DEADLINE = 3.0


@pytest.fixture
def store(memory_store: MemoryStore) -> Iterator[MemoryStore]:
    """The root ``memory_store``, served by a real runner in a thread."""
    store = memory_store
    runner = Runner(
        agents_for_tests.slow_async_agent,
        store,
        concurrency=4,
        poll_timeout=0.05,
        heartbeat_interval=0.1,
        grace_seconds=0.1,
    )
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        warm_up = [r.rollout_id for r in store.enqueue_rollouts(requests(QUICK))]
        assert len(store.wait_for_rollouts(warm_up, 30)) == 1, "the runner did not start"
        yield store
    finally:
        runner.stop()
        thread.join(timeout=15)
        assert not thread.is_alive(), "runner did not stop"


def requests(*tasks: dict) -> list[RolloutRequest]:
    return [RolloutRequest(input=task) for task in tasks]


def test_cancel_cancels_counts_and_logs_the_stragglers(store: MemoryStore, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="agentgrad.algorithms.batch"):
        batch = run_batch(store, requests(QUICK, QUICK, STUCK), timeout=DEADLINE, on_straggler="cancel", label="step 7")
    assert [r.status for r in batch.rollouts] == [
        RolloutStatus.SUCCEEDED,
        RolloutStatus.SUCCEEDED,
        RolloutStatus.CANCELLED,
    ]
    assert (batch.finished, batch.cancelled) == (2, 1)
    assert "step 7: cancelled 1 of 3 rollout(s)" in caplog.text


def test_raise_leaves_the_stragglers_running(store: MemoryStore) -> None:
    with pytest.raises(StragglersError, match=r"APO: 1 of 2 rollout\(s\) did not finish within 3 s") as info:
        run_batch(store, requests(QUICK, STUCK), timeout=DEADLINE, on_straggler="raise", label="APO")
    assert (info.value.unfinished, info.value.total) == (1, 2)
    (straggler,) = [r for r in store.query_rollouts() if r.input == STUCK]
    assert not store.get_rollout(straggler.rollout_id).status.is_terminal  # a resumed run waits for it again
    store.cancel_rollout(straggler.rollout_id)


@pytest.mark.parametrize("policy", ["cancel", "raise"])
def test_no_deadline_means_no_stragglers(store: MemoryStore, policy: str) -> None:
    batch = run_batch(store, requests(QUICK, {"sleep": 0.2}), timeout=None, on_straggler=policy)  # type: ignore[arg-type]
    assert [r.status for r in batch.rollouts] == [RolloutStatus.SUCCEEDED] * 2 and batch.cancelled == 0


def test_wait_batch_waits_for_rollouts_already_in_the_store(store: MemoryStore) -> None:
    ids = [r.rollout_id for r in store.enqueue_rollouts(requests(QUICK, {"sleep": 0.2}))]
    batch = wait_batch(store, ids, timeout=30, on_straggler="raise")
    assert [r.rollout_id for r in batch.rollouts] == ids
    assert all(r.status == RolloutStatus.SUCCEEDED for r in batch.rollouts)


def test_arguments_are_checked_before_anything_is_enqueued() -> None:
    store = MemoryStore(watchdog_interval=None)
    with contextlib.closing(store):
        with pytest.raises(ValueError, match="on_straggler"):
            run_batch(store, requests(QUICK), timeout=1, on_straggler="ignore")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="timeout"):
            run_batch(store, requests(QUICK), timeout=-1, on_straggler="cancel")
        assert store.query_rollouts() == []

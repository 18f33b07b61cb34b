"""Runner and RunnerPool over real stores: concurrency, heartbeats, failures, signals, kills."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import agents_for_tests
import pytest

from agentgrad.runner import Runner, RunnerDiedError, RunnerPool
from agentgrad.store.memory import MemoryStore
from agentgrad.store.sqlite import SqliteStore
from agentgrad.types import AttemptStatus, RolloutConfig, RolloutStatus


@contextlib.contextmanager
def running(runner: Runner) -> Iterator[Runner]:
    """The runner's loop in a thread for the block; stopped and joined after it."""
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        yield runner
    finally:
        runner.stop()
        thread.join(timeout=15)
        assert not thread.is_alive(), "runner did not stop"


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    return max(sum(s <= start < e for s, e in intervals) for start, _ in intervals)


# ---- basics ----------------------------------------------------------------------------------------

def test_runner_runs_all_tasks(local_store):
    ids = [local_store.enqueue_rollout({"x": x}).rollout_id for x in range(5)]
    stats = Runner(agents_for_tests.reward_agent, local_store, max_rollouts=5, poll_timeout=0.05).run()
    assert (stats.succeeded, stats.failed, stats.finished) == (5, 0, 5)
    assert stats.no_llm_calls == 5  # the agent made no LLM call: counted
    rollouts = [local_store.get_rollout(i) for i in ids]
    assert [r.reward for r in rollouts] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])
    for r in rollouts:
        assert r.status == RolloutStatus.SUCCEEDED and r.end_time is not None
        (attempt,) = local_store.get_attempts(r.rollout_id)
        assert attempt.status == AttemptStatus.SUCCEEDED and attempt.worker_id is not None
        assert [s.name for s in local_store.query_spans(r.rollout_id)] == ["agentgrad.message", "agentgrad.reward"]


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_concurrency_runs_rollouts_at_once(kind):
    store = MemoryStore(watchdog_interval=None)
    concurrency = 4 if kind == "async" else 8
    intervals: list[tuple[float, float]] = []

    async def async_agent(task, resources):
        start = time.monotonic()
        await asyncio.sleep(0.4)
        intervals.append((start, time.monotonic()))
        return 1.0

    def sync_agent(task, resources):
        start = time.monotonic()
        time.sleep(0.4)
        intervals.append((start, time.monotonic()))
        return 1.0

    n = 2 * concurrency
    ids = [store.enqueue_rollout(i).rollout_id for i in range(n)]
    agent = async_agent if kind == "async" else sync_agent
    stats = Runner(agent, store, concurrency=concurrency, max_rollouts=n, poll_timeout=0.05).run()
    assert stats.succeeded == n and len(intervals) == n
    assert max_overlap(intervals) == concurrency  # never more, and really that many at once
    assert all(store.get_rollout(i).status == RolloutStatus.SUCCEEDED for i in ids)
    store.close()


def test_heartbeats_advance_for_a_slow_agent(local_store):
    rollout = local_store.enqueue_rollout({"sleep": 1.2})
    runner = Runner(agents_for_tests.slow_async_agent, local_store, heartbeat_interval=0.05, poll_timeout=0.05)
    beats: list[float] = []
    with running(runner):
        attempt = wait_for(lambda: local_store.get_latest_attempt(rollout.rollout_id))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not local_store.get_rollout(rollout.rollout_id).status.is_terminal:
            beat = local_store.get_latest_attempt(rollout.rollout_id).last_heartbeat_time
            if not beats or beat != beats[-1]:
                beats.append(beat)
            time.sleep(0.05)
    assert local_store.get_rollout(rollout.rollout_id).status == RolloutStatus.SUCCEEDED
    assert len(beats) >= 3, beats  # claim/start, then heartbeats while the agent sleeps
    assert beats == sorted(beats) and beats[-1] - attempt.start_time >= 0.5


# ---- failures --------------------------------------------------------------------------------------

def test_agent_exception_fails_the_attempt_with_details(local_store):
    bad = local_store.enqueue_rollout({"x": 7, "fail": True})
    good = local_store.enqueue_rollout({"x": 1})
    stats = Runner(agents_for_tests.failing_agent, local_store, max_rollouts=2, poll_timeout=0.05).run()
    assert (stats.succeeded, stats.failed) == (1, 1)
    (attempt,) = local_store.get_attempts(bad.rollout_id)
    assert attempt.status == AttemptStatus.FAILED and attempt.end_time is not None
    assert attempt.error.type == "ValueError" and attempt.error.message == "bad task 7"
    assert "raise ValueError" in attempt.error.traceback and "failing_agent" in attempt.error.traceback
    assert local_store.get_rollout(bad.rollout_id).status == RolloutStatus.FAILED
    assert local_store.get_rollout(good.rollout_id).status == RolloutStatus.SUCCEEDED


def test_agent_exception_is_retried_per_config(local_store):
    config = RolloutConfig(max_attempts=2, retry_on=["failed"])
    rollout = local_store.enqueue_rollout({"x": 1, "fail": True}, config=config)
    Runner(agents_for_tests.failing_agent, local_store, max_rollouts=2, poll_timeout=0.05).run()
    attempts = local_store.get_attempts(rollout.rollout_id)
    assert [a.status for a in attempts] == [AttemptStatus.FAILED, AttemptStatus.FAILED]
    assert local_store.get_rollout(rollout.rollout_id).status == RolloutStatus.FAILED


def test_non_numeric_reward_fails_that_rollout_only(local_store):
    def agent(task, resources):
        return task  # "oops" is not a reward

    ids = [local_store.enqueue_rollout(t).rollout_id for t in ("oops", 0.5, {"reward": "x"}, {"reward": 1})]
    stats = Runner(agent, local_store, max_rollouts=4, poll_timeout=0.05).run()
    assert (stats.succeeded, stats.failed) == (2, 2)
    statuses = [local_store.get_rollout(i).status for i in ids]
    assert statuses == [RolloutStatus.FAILED, RolloutStatus.SUCCEEDED, RolloutStatus.FAILED, RolloutStatus.SUCCEEDED]
    error = local_store.get_latest_attempt(ids[0]).error
    assert error.type == "RewardError" and "'oops'" in error.message and "str" in error.message
    assert [local_store.get_rollout(i).reward for i in ids[1::2]] == [0.5, 1.0]


def test_worker_records_show_busy_and_idle(local_store):
    local_store.enqueue_rollout({"sleep": 0.6})
    runner = Runner(agents_for_tests.slow_async_agent, local_store, worker_id="w-test", poll_timeout=0.05,
                    heartbeat_interval=0.1)
    with running(runner):
        busy = wait_for(lambda: [w for w in local_store.query_workers() if w.status == "busy"])
        assert busy[0].worker_id == "w-test" and busy[0].current_rollout_id is not None
        idle = wait_for(lambda: [w for w in local_store.query_workers() if w.status == "idle"])
        assert idle[0].current_rollout_id is None and idle[0].metadata["succeeded"] == 1
    (worker,) = local_store.query_workers()
    assert worker.status == "stopped" and worker.metadata["pid"] == os.getpid()


def test_cancelling_in_the_store_cancels_the_agent(local_store):
    cancelled = threading.Event()

    async def agent(task, resources):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return 1.0

    rollout = local_store.enqueue_rollout("long")
    runner = Runner(agent, local_store, heartbeat_interval=0.05, poll_timeout=0.05)
    started = time.monotonic()
    with running(runner):
        wait_for(lambda: local_store.get_rollout(rollout.rollout_id).status == RolloutStatus.RUNNING)
        local_store.cancel_rollout(rollout.rollout_id)
        assert cancelled.wait(5), "the agent was not cancelled"
        wait_for(lambda: runner.stats.failed == 1)
    assert time.monotonic() - started < 10
    (attempt,) = local_store.get_attempts(rollout.rollout_id)
    assert attempt.status == AttemptStatus.FAILED and attempt.error.type == "Cancelled"
    assert local_store.get_rollout(rollout.rollout_id).status == RolloutStatus.CANCELLED


def test_stop_hands_back_in_flight_rollouts(local_store):
    rollout = local_store.enqueue_rollout({"sleep": 30}, config=RolloutConfig(max_attempts=2))
    runner = Runner(agents_for_tests.slow_async_agent, local_store, grace_seconds=0.2, poll_timeout=0.05)
    with running(runner):
        wait_for(lambda: local_store.get_rollout(rollout.rollout_id).status == RolloutStatus.RUNNING)
    assert runner.stats.handed_back == 1
    (attempt,) = local_store.get_attempts(rollout.rollout_id)
    assert attempt.status == AttemptStatus.FAILED and attempt.error.type == "RunnerStopped"
    assert local_store.get_rollout(rollout.rollout_id).status == RolloutStatus.REQUEUING  # retried later


def test_invalid_options():
    store = MemoryStore(watchdog_interval=None)
    with pytest.raises(ValueError, match="concurrency"):
        Runner(agents_for_tests.reward_agent, store, concurrency=0)
    with pytest.raises(TypeError, match="expected an Agent"):
        Runner(42, store)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n_runners"):
        RunnerPool(agents_for_tests.reward_agent, "memory", n_runners=0)
    store.close()


# ---- processes -------------------------------------------------------------------------------------

def test_runner_pool_processes_all_tasks(tmp_path):
    path = tmp_path / "pool.db"
    store = SqliteStore(path, watchdog_interval=None)
    ids = [store.enqueue_rollout({"x": x}).rollout_id for x in range(12)]
    with RunnerPool(agents_for_tests.reward_agent, f"sqlite://{path}", n_runners=2, poll_timeout=0.1) as pool:
        pids = [p.pid for p in pool.processes]
        done = store.wait_for_rollouts(ids, timeout=30)
    assert len(done) == 12 and all(r.status == RolloutStatus.SUCCEEDED for r in done)
    assert sorted(r.reward for r in done) == pytest.approx([x / 10 for x in range(12)])
    workers = {a.worker_id for i in ids for a in store.get_attempts(i)}
    assert workers <= {w.worker_id for w in store.query_workers()}
    assert all(w.status == "stopped" for w in store.query_workers())
    message_pids = {s.attributes["pid"] for i in ids for s in store.query_spans(i, name="agentgrad.message")}
    assert message_pids <= set(pids) and os.getpid() not in message_pids
    store.close()


def test_sigterm_hands_back_or_finishes(tmp_path):
    path = tmp_path / "term.db"
    store = SqliteStore(path, watchdog_interval=None)
    long = store.enqueue_rollout({"sleep": 30})
    short = store.enqueue_rollout({"sleep": 0.1})
    pool = RunnerPool(agents_for_tests.slow_async_agent, f"sqlite://{path}", n_runners=1,
                      concurrency=2, grace_seconds=0.5, poll_timeout=0.1, heartbeat_interval=0.2).start()
    try:
        wait_for(lambda: store.get_rollout(short.rollout_id).status == RolloutStatus.SUCCEEDED, timeout=20)
        wait_for(lambda: store.get_rollout(long.rollout_id).status == RolloutStatus.RUNNING)
        (process,) = pool.processes
        os.kill(process.pid, signal.SIGTERM)
        process.join(15)
        assert process.exitcode == 0
    finally:
        pool.stop(timeout=5)
    (attempt,) = store.get_attempts(long.rollout_id)
    assert attempt.status == AttemptStatus.FAILED and attempt.error.type == "RunnerStopped"
    assert store.get_rollout(long.rollout_id).status == RolloutStatus.FAILED  # max_attempts=1
    assert not [a for r in (long, short) for a in store.get_attempts(r.rollout_id) if not a.status.is_terminal]
    store.close()


def test_a_runner_process_that_fails_reports_its_exception():
    """The process ran our code and raised (here: its store cannot be opened): check() names the
    exception, not just the exit code."""
    pool = RunnerPool(agents_for_tests.reward_agent, "nosuch://nowhere", n_runners=1, poll_timeout=0.1).start()
    try:
        (process,) = pool.processes
        process.join(60)
        assert process.exitcode == 1
        with pytest.raises(RunnerDiedError) as caught:
            pool.check()
    finally:
        pool.stop(timeout=5)
    message = str(caught.value)
    assert message.startswith("runner process agentgrad-runner-0") and "exited with code 1: " in message
    assert "ValueError: unknown store URL 'nosuch://nowhere'" in message and "Traceback" in message  # its exception, with the child's traceback
    assert "while starting" not in message


def test_sigkill_is_caught_by_the_watchdog_and_retried(tmp_path):
    path = tmp_path / "kill.db"
    store = SqliteStore(path, watchdog_interval=0.2)
    config = RolloutConfig(unresponsive_seconds=1, max_attempts=2)
    rollout = store.enqueue_rollout({"task": "hang"}, config=config)
    pool = RunnerPool(agents_for_tests.hang_first_attempt, f"sqlite://{path}", n_runners=1,
                      poll_timeout=0.1, heartbeat_interval=0.2).start()
    try:
        wait_for(lambda: store.query_spans(rollout.rollout_id), timeout=20)  # the agent is in its hang
        (process,) = pool.processes
        pool.check()  # alive: nothing to report
        os.kill(process.pid, signal.SIGKILL)
        process.join(5)
        assert process.exitcode == -signal.SIGKILL
        with pytest.raises(RunnerDiedError, match=r"agentgrad-runner-0 \(pid \d+\) was killed by SIGKILL"):
            pool.check()  # whoever waits on the pool's work learns it
    finally:
        pool.stop(timeout=5)
    wait_for(lambda: store.get_rollout(rollout.rollout_id).status == RolloutStatus.REQUEUING, timeout=10)
    first = store.get_attempts(rollout.rollout_id)[0]
    assert first.status == AttemptStatus.UNRESPONSIVE and first.error.type == "Unresponsive"
    second_runner = Runner(agents_for_tests.hang_first_attempt, store, max_rollouts=1, poll_timeout=0.1,
                           heartbeat_interval=0.2)
    assert second_runner.run().succeeded == 1
    final = store.get_rollout(rollout.rollout_id)
    assert final.status == RolloutStatus.SUCCEEDED and final.reward == 0.5 and final.num_attempts == 2
    assert [a.status for a in store.get_attempts(rollout.rollout_id)] == [AttemptStatus.UNRESPONSIVE,
                                                                           AttemptStatus.SUCCEEDED]
    store.close()

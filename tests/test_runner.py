"""Runner and RunnerPool over real stores: concurrency, heartbeats, failures, signals, kills."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import agents_for_tests
import pytest

from agentgrad import runner as runner_module
from agentgrad import semconv
from agentgrad.agents import rollout
from agentgrad.errors import InvalidInputError
from agentgrad.runner import Runner, RunnerDiedError, RunnerPool
from agentgrad.store.client import StoreUnavailableError
from agentgrad.store.memory import MemoryStore
from agentgrad.store.sqlite import SqliteStore
from agentgrad.types import LLM, AttemptStatus, RolloutConfig, RolloutStatus


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


@rollout
async def quiet_async_agent(task: Any) -> None:
    """Sleeps ``task["sleep"]`` seconds; no span, no reward."""
    await asyncio.sleep(task["sleep"])


@rollout
def quiet_sync_agent(task: Any) -> None:
    time.sleep(task["sleep"])


@pytest.mark.parametrize("agent", [quiet_async_agent, quiet_sync_agent], ids=["async", "sync"])
@pytest.mark.parametrize(("sleep", "start_after", "marked"), [(0.0, 30.0, False), (0.6, 0.05, True)])
def test_an_attempt_is_marked_running_once_its_agent_has_run_a_while_without_a_span(
    local_store, monkeypatch, agent, sleep, start_after, marked
):
    """A rollout done before ``START_AFTER_SECONDS`` costs the store no write to start it: it goes
    from preparing to its end. One that runs longer (and wrote no span, which would have done it)
    is marked running by the runner while its agent runs."""
    monkeypatch.setattr(runner_module, "START_AFTER_SECONDS", start_after)
    written: list[AttemptStatus] = []
    update = local_store.update_attempt

    def recording(rollout_id: str, attempt_id: str, status: Any, *args: Any, **kwargs: Any) -> Any:
        written.append(AttemptStatus(status))
        return update(rollout_id, attempt_id, status, *args, **kwargs)

    monkeypatch.setattr(local_store, "update_attempt", recording)
    rollout_id = local_store.enqueue_rollout({"sleep": sleep}).rollout_id
    seen: set[AttemptStatus] = set()

    def ended() -> bool:
        attempt = local_store.get_latest_attempt(rollout_id)
        if attempt is not None:
            seen.add(attempt.status)
        return local_store.get_rollout(rollout_id).status.is_terminal

    with running(Runner(agent, local_store, poll_timeout=0.05)):
        wait_for(ended)
    assert local_store.get_rollout(rollout_id).status == RolloutStatus.SUCCEEDED
    assert written == [AttemptStatus.RUNNING, AttemptStatus.SUCCEEDED] if marked else [AttemptStatus.SUCCEEDED]
    assert (AttemptStatus.RUNNING in seen) is marked


@pytest.mark.parametrize("agent", [agents_for_tests.failing_agent, quiet_async_agent], ids=["sync", "async"])
def test_a_returned_reward_is_stored_with_the_attempts_success_in_one_write(local_store, monkeypatch, agent):
    writes: list[tuple[str, list[str]]] = []
    update, add_span, add_spans = local_store.update_attempt, local_store.add_span, local_store.add_spans

    def recording_update(rollout_id: str, attempt_id: str, status: Any, *args: Any, spans: Any = (), **kw: Any) -> Any:
        writes.append((AttemptStatus(status).value, [span.name for span in spans]))
        return update(rollout_id, attempt_id, status, *args, spans=spans, **kw)

    monkeypatch.setattr(local_store, "update_attempt", recording_update)
    monkeypatch.setattr(local_store, "add_span", lambda span: (writes.append(("span", [span.name])), add_span(span))[1])
    monkeypatch.setattr(local_store, "add_spans", lambda spans: (writes.append(("spans", [])), add_spans(spans))[1])
    rollout_id = local_store.enqueue_rollout({"x": 1, "sleep": 0.0}).rollout_id
    with running(Runner(agent, local_store, poll_timeout=0.05)):
        wait_for(lambda: local_store.get_rollout(rollout_id).status.is_terminal)
    rollout = local_store.get_rollout(rollout_id)
    expected = 1.0 if agent is agents_for_tests.failing_agent else None
    assert rollout.status == RolloutStatus.SUCCEEDED and rollout.reward == expected
    assert writes == [("succeeded", [semconv.SPAN_REWARD] if expected is not None else [])]


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
    runner = Runner(
        agents_for_tests.slow_async_agent, local_store, worker_id="w-test", poll_timeout=0.05, heartbeat_interval=0.1
    )
    with running(runner):
        busy = wait_for(lambda: [w for w in local_store.query_workers() if w.status == "busy"])
        assert busy[0].worker_id == "w-test" and busy[0].current_rollout_id is not None
        idle = wait_for(lambda: [w for w in local_store.query_workers() if w.status == "idle"])
        assert idle[0].current_rollout_id is None and idle[0].metadata["succeeded"] == 1
    (worker,) = local_store.query_workers()
    assert worker.status == "stopped" and worker.metadata["pid"] == os.getpid()


@pytest.mark.parametrize("phase", [RolloutStatus.RUNNING, RolloutStatus.PREPARING])
def test_cancelling_in_the_store_cancels_the_agent(local_store, monkeypatch, phase):
    """Seen by a heartbeat while running, or before the attempt was marked running by the start
    mark, which reads how it ended as a heartbeat does."""
    if phase == RolloutStatus.PREPARING:
        monkeypatch.setattr(runner_module, "START_AFTER_SECONDS", 0.5)
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
        wait_for(lambda: local_store.get_rollout(rollout.rollout_id).status == phase)
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


# ---- store outages --------------------------------------------------------------------------------


class Unplugged:
    """``store`` behind a plug: while :attr:`down` is set, every call fails the way a store service
    that cannot be reached does once the client's own retries are spent."""

    in_process = False  # it stands for a store behind a network, whose calls the runner makes in threads

    def __init__(self, store: MemoryStore, error: Exception | None = None) -> None:
        self.store = store
        self.down = threading.Event()
        self.error = error or StoreUnavailableError(
            "store service http://127.0.0.1:9 failed 6 time(s) on POST "
            "/v1/rollouts/dequeue: ConnectionRefusedError: refused"
        )
        self.failures = 0
        self.failed_calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.store, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.down.is_set():
                self.failures += 1
                self.failed_calls.append(name)
                raise self.error
            return attr(*args, **kwargs)

        return call


def outage_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "agentgrad.store.outage"]


def test_an_idle_runner_waits_out_an_outage(caplog):
    store = MemoryStore(watchdog_interval=None)
    plug = Unplugged(store)
    runner = Runner(agents_for_tests.reward_agent, plug, worker_id="w-out", poll_timeout=0.05)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="agentgrad.store.outage"), running(runner) as thread_runner:
        wait_for(lambda: store.query_workers())
        plug.down.set()
        wait_for(lambda: plug.failures >= 4)  # the dequeue failed again and again: the runner lives on
        rollout = store.enqueue_rollout({"x": 3})
        plug.down.clear()
        wait_for(lambda: store.get_rollout(rollout.rollout_id).status == RolloutStatus.SUCCEEDED)
        assert thread_runner.stats.errors == []
    assert store.get_rollout(rollout.rollout_id).reward == pytest.approx(0.3)
    lines = outage_lines(caplog)
    assert [level for level, _ in lines] == ["WARNING", "INFO"], lines  # once as it began, once as it ended
    assert "runner w-out: the store cannot be reached" in lines[0][1] and "answers again after" in lines[1][1]
    store.close()


@pytest.mark.parametrize("concurrency", [1, 3])
def test_the_attempt_in_flight_is_reported_after_an_outage(concurrency):
    store = MemoryStore(watchdog_interval=None)
    plug = Unplugged(store)
    release = threading.Event()

    def agent(task, resources):
        release.wait(30)
        return task["x"] / 10

    ids = [store.enqueue_rollout({"x": x}).rollout_id for x in range(4)]
    runner = Runner(
        agent,
        plug,
        concurrency=concurrency,
        poll_timeout=0.05,  # type: ignore[arg-type]
        heartbeat_interval=0.05,
    )
    with running(runner):
        wait_for(lambda: store.count_rollouts() and store.get_rollout(ids[0]).status == RolloutStatus.RUNNING)
        plug.down.set()
        release.set()  # the agents finish while the store is away: their reports wait
        wait_for(lambda: plug.failures >= 3)
        assert store.get_rollout(ids[0]).status == RolloutStatus.RUNNING
        plug.down.clear()
        done = store.wait_for_rollouts(ids, timeout=30)
    assert [r.status for r in done] == [RolloutStatus.SUCCEEDED] * 4
    assert [r.reward for r in done] == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert all(len(store.get_attempts(i)) == 1 for i in ids)  # reported once, never retried
    assert runner.stats.succeeded == 4 and runner.stats.errors == []
    store.close()


def test_a_runner_told_to_stop_during_an_outage_stops():
    """Idle, it stops at once; with an attempt in flight, after its grace (the attempt is left to
    the watchdog: the store could not be told)."""
    store = MemoryStore(watchdog_interval=None)
    plug = Unplugged(store)
    rollout = store.enqueue_rollout({"sleep": 30})
    runner = Runner(
        agents_for_tests.slow_async_agent,
        plug,
        grace_seconds=0.3,
        poll_timeout=0.05,  # type: ignore[arg-type]
        heartbeat_interval=0.05,
    )
    with running(runner):  # it asserts the runner's thread ends once stopped
        wait_for(lambda: store.get_rollout(rollout.rollout_id).status == RolloutStatus.RUNNING)
        plug.down.set()
        wait_for(lambda: plug.failures >= 2)
    assert runner.stats.handed_back == 1
    assert store.get_latest_attempt(rollout.rollout_id).status == AttemptStatus.RUNNING


def test_an_agent_whose_store_call_gives_up_as_the_runner_stops_is_handed_back_not_failed():
    """The agent's own store write (an emitter) waits out the outage until the stopping runner's
    grace runs out, then raises the outage error: the attempt is handed back, not failed by it."""
    from agentgrad.emit import emit_message

    store = MemoryStore(watchdog_interval=None)
    plug = Unplugged(store)
    rollout = store.enqueue_rollout("x")
    may_write = threading.Event()

    async def agent(task, resources):
        while not may_write.is_set():
            await asyncio.sleep(0.01)
        emit_message("during the outage")  # waits it out until the grace is over
        return 1.0

    runner = Runner(agent, plug, grace_seconds=0.3, poll_timeout=0.05, heartbeat_interval=0.05)  # type: ignore[arg-type]
    with running(runner):
        wait_for(lambda: store.get_rollout(rollout.rollout_id).status == RolloutStatus.RUNNING)
        plug.down.set()
        may_write.set()
        wait_for(lambda: "add_span" in plug.failed_calls or "add_spans" in plug.failed_calls)
    assert (runner.stats.handed_back, runner.stats.failed) == (1, 0)


def test_a_store_error_that_is_not_an_outage_is_raised():
    """A 4xx (here: the store refuses the call) is a programming error: raised, not retried forever."""
    store = MemoryStore(watchdog_interval=None)
    plug = Unplugged(store, InvalidInputError("limit must be ≥ 1, got 0"))
    plug.down.set()
    with pytest.raises(InvalidInputError, match="limit must be"):
        Runner(agents_for_tests.reward_agent, plug, poll_timeout=0.05).run()  # type: ignore[arg-type]
    assert plug.failed_calls.count("dequeue_rollout") == 1
    store.close()


def test_a_late_report_of_an_attempt_the_store_ended_is_dropped(caplog):
    """The watchdog ended the attempt while the runner could not reach the store (a partition
    longer than the deadline): the runner's report is refused; the runner says so and goes on."""
    store = MemoryStore(watchdog_interval=None)
    plug = Unplugged(store)
    release = threading.Event()

    def agent(task, resources):
        release.wait(30)
        return 1.0

    config = RolloutConfig(unresponsive_seconds=0.05, max_attempts=2)
    rollout = store.enqueue_rollout("x", config=config)
    # No heartbeat while the agent runs: a heartbeat answered after the plug is back would tell the
    # runner first (it cancels the agent instead), and this test is about the report.
    runner = Runner(agent, plug, poll_timeout=0.05, heartbeat_interval=600)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="agentgrad.runner"), running(runner):
        wait_for(lambda: store.get_rollout(rollout.rollout_id).status == RolloutStatus.RUNNING)
        plug.down.set()
        time.sleep(0.1)  # silence beyond the deadline (not an assertion on time)
        assert [a.status for a in store.check_watchdog()] == [AttemptStatus.UNRESPONSIVE]
        release.set()
        wait_for(lambda: plug.failures >= 2)  # the reward's write waits out the outage
        plug.down.clear()
        wait_for(lambda: store.get_rollout(rollout.rollout_id).status == RolloutStatus.SUCCEEDED)
    statuses = [a.status for a in store.get_attempts(rollout.rollout_id)]
    assert statuses == [AttemptStatus.UNRESPONSIVE, AttemptStatus.SUCCEEDED]  # succeeded exactly once
    assert any("was ended in the store before the runner could report it" in r.getMessage() for r in caplog.records)
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
    pool = RunnerPool(
        agents_for_tests.slow_async_agent,
        f"sqlite://{path}",
        n_runners=1,
        concurrency=2,
        grace_seconds=0.5,
        poll_timeout=0.1,
        heartbeat_interval=0.2,
    ).start()
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
    assert store.get_rollout(long.rollout_id).status == RolloutStatus.FAILED  # by default only a loss is retried
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
    assert (
        "ValueError: unknown store URL 'nosuch://nowhere'" in message and "Traceback" in message
    )  # its exception, with the child's traceback
    assert "while starting" not in message


def test_sigkill_is_caught_by_the_watchdog_and_retried(tmp_path):
    path = tmp_path / "kill.db"
    store = SqliteStore(path, watchdog_interval=0.2)
    config = RolloutConfig(unresponsive_seconds=1, max_attempts=2)
    rollout = store.enqueue_rollout({"task": "hang"}, config=config)
    pool = RunnerPool(
        agents_for_tests.hang_first_attempt, f"sqlite://{path}", n_runners=1, poll_timeout=0.1, heartbeat_interval=0.2
    ).start()
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
    second_runner = Runner(
        agents_for_tests.hang_first_attempt, store, max_rollouts=1, poll_timeout=0.1, heartbeat_interval=0.2
    )
    assert second_runner.run().succeeded == 1
    final = store.get_rollout(rollout.rollout_id)
    assert final.status == RolloutStatus.SUCCEEDED and final.reward == 0.5 and final.num_attempts == 2
    assert [a.status for a in store.get_attempts(rollout.rollout_id)] == [
        AttemptStatus.UNRESPONSIVE,
        AttemptStatus.SUCCEEDED,
    ]
    store.close()


# ---- the hot path: what a rollout costs the runner (issue 24) ---------------------------------------


class Counting:
    """``store`` with a count of the calls made to it, and the threads that made them, by method name."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.calls: dict[str, int] = {}
        self.threads: dict[str, set[str]] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.store, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            self.threads.setdefault(name, set()).add(threading.current_thread().name)
            return attr(*args, **kwargs)

        return call


def test_worker_records_are_written_on_changes_not_per_rollout(local_store):
    counting = Counting(local_store)
    for x in range(20):
        local_store.enqueue_rollout({"x": x})
    stats = Runner(
        agents_for_tests.reward_agent, counting, max_rollouts=20, poll_timeout=0.05, heartbeat_interval=60
    ).run()
    assert stats.succeeded == 20
    # idle at the start, busy once, stopped at the end: not busy and idle around each rollout
    assert counting.calls["update_worker"] <= 4, counting.calls
    (worker,) = local_store.query_workers()
    assert worker.status == "stopped" and worker.metadata["succeeded"] == 20


def test_resources_are_fetched_once_per_snapshot_and_each_attempt_gets_its_own_copy(local_store):
    import agents_for_runner_start

    counting = Counting(local_store)
    published = local_store.add_resources({"note": "as published"})
    ids = [local_store.enqueue_rollout({"x": x}, resources_id=published.resources_id).rollout_id for x in range(5)]
    stats = Runner(agents_for_runner_start.resources_mutating_agent, counting, max_rollouts=5, poll_timeout=0.05).run()
    assert stats.succeeded == 5
    assert [local_store.get_rollout(i).reward for i in ids] == [1.0] * 5  # no attempt saw another's change
    assert counting.calls["get_resources"] == 1
    assert local_store.get_resources(published.resources_id).items["note"].value == "as published"


def test_an_async_agent_runs_on_the_runners_loop_not_in_a_thread(local_store):
    import agents_for_runner_start

    agents_for_runner_start.THREADS.clear()
    local_store.enqueue_rollout({"x": 1})
    runner = Runner(agents_for_runner_start.thread_name_agent, local_store, max_rollouts=1, poll_timeout=0.05)
    thread = threading.Thread(target=runner.run, name="the-loop-thread")
    thread.start()
    thread.join(15)
    assert runner.stats.succeeded == 1
    assert agents_for_runner_start.THREADS == ["the-loop-thread"]


class Remote(Counting):
    """:class:`Counting` standing for a store behind a network (``in_process`` False)."""

    in_process = False


@pytest.mark.parametrize("where", ["in process", "remote"])
def test_a_runner_asks_an_in_process_store_on_its_loop_and_a_remote_one_from_threads(local_store, where):
    """A claim of what is queued and an attempt's report are made on the loop when the store answers
    in this process (a thread hop costs more than such a call), and in the runner's threads when it
    is behind a network (a slow answer must not stall the loop's other slots)."""
    import agents_for_runner_start

    store = Counting(local_store) if where == "in process" else Remote(local_store)
    ids = [local_store.enqueue_rollout({"x": x}).rollout_id for x in range(3)]
    runner = Runner(agents_for_runner_start.thread_name_agent, store, max_rollouts=3, poll_timeout=0.05)
    thread = threading.Thread(target=runner.run, name="the-loop-thread")
    thread.start()
    thread.join(15)
    assert runner.stats.succeeded == 3
    assert [r.reward for r in local_store.wait_for_rollouts(ids, timeout=5)] == [1.0] * 3
    claims, reports = store.threads["dequeue_rollout"], store.threads["update_attempt"]
    if where == "in process":
        assert claims == reports == {"the-loop-thread"}
    else:
        assert "the-loop-thread" not in claims | reports
        assert all(name.startswith("agentgrad-runner-") for name in claims | reports), claims | reports


class ClaimKeys(Counting):
    """:class:`Counting` that also keeps, for each claim that got a rollout, its idempotency key."""

    def __init__(self, store: Any, in_process: bool) -> None:
        super().__init__(store)
        self.in_process = in_process
        self.keys: list[str | None] = []

    def dequeue_rollout(self, *args: Any, idempotency_key: str | None = None, **kwargs: Any) -> Any:
        claimed = self.store.dequeue_rollout(*args, idempotency_key=idempotency_key, **kwargs)
        if claimed is not None:
            self.keys.append(idempotency_key)
        return claimed


@pytest.mark.parametrize("where", ["in process", "remote"])
def test_a_claim_carries_an_idempotency_key_only_where_it_may_be_retried(local_store, where):
    """The loop's one try at what an in-process store has queued carries no key: nothing retries
    it, and a key costs the claim a record's write. A claim through the long poll (a store behind a
    network) carries one, so a retry after a lost answer is given the same claim."""
    store = ClaimKeys(local_store, in_process=where == "in process")
    ids = [local_store.enqueue_rollout({"x": x}).rollout_id for x in range(4)]
    stats = Runner(agents_for_tests.reward_agent, store, max_rollouts=4, poll_timeout=0.05).run()
    assert stats.succeeded == 4
    assert len(local_store.wait_for_rollouts(ids, timeout=5)) == 4
    assert len(store.keys) == 4
    if where == "in process":
        assert store.keys == [None] * 4
    else:
        assert all(key is not None for key in store.keys) and len(set(store.keys)) == 4


class HeldSpanWrites:
    """The store as the capture proxy sees it: its first span write waits until ``release`` is set
    (the attempt's calls are still being stored, so its flush waits too)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.release = threading.Event()
        self.holding = threading.Event()

    def add_spans(self, spans: list[Any]) -> list[Any]:
        if not self.holding.is_set():
            self.holding.set()
            self.release.wait(10)
        return self._store.add_spans(spans)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@pytest.mark.parametrize("kind", ["async", "sync"])
@pytest.mark.parametrize("over_http", [True, False], ids=["proxy over HTTP", "proxy in process"])
def test_a_slot_runs_its_next_attempt_while_the_last_one_is_finishing(local_store, kind, over_http):
    """Behind a URL, the wait for the capture proxy to store an attempt's calls, and the attempt's
    report, overlap the slot's next agent; the slot waits for them once that agent is done (at most
    one attempt finishing per slot), and an attempt is reported only after its calls are stored.
    With the proxy in the runner's process (one GIL) the slot finishes an attempt before the next."""
    import openai

    from agentgrad.proxy import LLMProxy
    from agentgrad.testing.stub import StubUpstream

    started: list[int] = []

    async def async_agent(task, llm):
        started.append(task["i"])
        client = openai.AsyncOpenAI(base_url=llm.endpoint, api_key="k", max_retries=0)
        await client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "hi"}])
        await client.close()
        return 1.0

    def sync_agent(task, llm):
        started.append(task["i"])
        client = openai.OpenAI(base_url=llm.endpoint, api_key="k", max_retries=0)
        client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "hi"}])
        return 1.0

    held = HeldSpanWrites(local_store)
    with StubUpstream(["hello"]) as stub, LLMProxy(held, f"http://127.0.0.1:{stub.port}/v1") as proxy:
        local_store.add_resources({"llm": LLM(endpoint=f"http://127.0.0.1:{stub.port}/v1", model="m")})
        ids = [local_store.enqueue_rollout({"i": i}).rollout_id for i in range(3)]
        runner = Runner(
            async_agent if kind == "async" else sync_agent,
            local_store,
            max_rollouts=3,
            poll_timeout=0.05,
            llm_proxy_url=proxy.url,
            llm_proxy=None if over_http else proxy,
        )
        with running(runner):
            wait_for(held.holding.is_set)
            if over_http:  # the second attempt ran while the first one's calls are being stored
                wait_for(lambda: started == [0, 1])
            time.sleep(0.3)
            assert started == ([0, 1] if over_http else [0]), "a slot ran ahead of an attempt still finishing"
            assert local_store.get_rollout(ids[0]).status != RolloutStatus.SUCCEEDED  # not reported before its calls
            held.release.set()
            rollouts = local_store.wait_for_rollouts(ids, timeout=10)
    assert started == [0, 1, 2]
    assert [(r.status, r.reward, r.llm_calls) for r in rollouts] == [(RolloutStatus.SUCCEEDED, 1.0, 1)] * 3
    for rollout_id in ids:  # each reward span stored after its attempt's call
        names = [s.name for s in local_store.query_spans(rollout_id)]
        assert [n for n in names if n in (semconv.SPAN_LLM_CALL, semconv.SPAN_REWARD)] == [
            semconv.SPAN_LLM_CALL,
            semconv.SPAN_REWARD,
        ], names


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_a_flush_over_http_follows_the_environments_proxy_settings(local_store, monkeypatch, kind):
    """Where the environment routes the capture proxy's URL through an HTTP proxy, the runner's
    flush goes that way too (httpx, which honours ``NO_PROXY``): through a proxy that is not
    there it fails — logged, the attempt still reported — and with the host in ``NO_PROXY`` it
    reaches the capture proxy."""
    from agentgrad.proxy import LLMProxy
    from agentgrad.testing.stub import StubUpstream

    async def async_agent(task):
        return 1.0

    def sync_agent(task):
        return 1.0

    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # the discard port: nothing listens
    with StubUpstream(["hello"]) as stub, LLMProxy(local_store, f"http://127.0.0.1:{stub.port}/v1") as proxy:
        for no_proxy, failed_flushes in (("", 2), ("127.0.0.1", 0)):
            monkeypatch.setenv("NO_PROXY", no_proxy)
            ids = [local_store.enqueue_rollout({"i": i}).rollout_id for i in range(2)]
            runner = Runner(
                async_agent if kind == "async" else sync_agent,
                local_store,
                max_rollouts=2,
                poll_timeout=0.05,
                llm_proxy_url=proxy.url,
            )
            stats = runner.run()
            assert stats.succeeded == 2
            assert [r.status for r in local_store.wait_for_rollouts(ids, timeout=5)] == [RolloutStatus.SUCCEEDED] * 2
            assert sum(": flush: " in e for e in stats.errors) == failed_flushes, stats.errors


def test_async_agents_are_told_apart_from_sync_ones():
    from agentgrad.agents import Agent, as_agent
    from agentgrad.runner import _returns_coroutine

    class AsyncAgent(Agent):
        async def rollout_async(self, task, resources, rollout):
            return 1.0

    class SyncTraining(AsyncAgent):
        def training_rollout(self, task, resources, rollout):  # may block: needs a thread
            return 1.0

    assert _returns_coroutine(as_agent(agents_for_tests.slow_async_agent))
    assert _returns_coroutine(AsyncAgent())
    assert not _returns_coroutine(as_agent(agents_for_tests.reward_agent))
    assert not _returns_coroutine(agents_for_tests.EchoAgent())
    assert not _returns_coroutine(SyncTraining())


def test_a_sync_agent_whose_attempt_was_cancelled_stores_no_reward(local_store):
    """The agent's thread stores its reward itself (one hop): not once the runner gave up on it."""
    import agents_for_runner_start

    agents_for_runner_start.FINISHED.clear()
    rollout = local_store.enqueue_rollout({"sleep": 1.0})
    runner = Runner(agents_for_runner_start.slow_sync_agent, local_store, heartbeat_interval=0.05, poll_timeout=0.05)
    with running(runner):
        wait_for(lambda: local_store.get_rollout(rollout.rollout_id).status == RolloutStatus.RUNNING)
        local_store.cancel_rollout(rollout.rollout_id)
        wait_for(lambda: runner.stats.failed == 1)
        assert agents_for_runner_start.FINISHED.wait(10)
        time.sleep(0.2)  # the agent's thread has returned; let it do whatever it would do next
    assert local_store.query_spans(rollout.rollout_id, name="agentgrad.reward") == []
    assert local_store.get_rollout(rollout.rollout_id).status == RolloutStatus.CANCELLED


def test_runner_processes_have_the_parents_environment_of_when_they_start(tmp_path, monkeypatch):
    """A fork server started for an earlier pool has that moment's environment: each new runner
    process still gets the parent's environment of now, as a spawned one would."""
    import agents_for_runner_start

    path = tmp_path / "env.db"
    store = SqliteStore(path, watchdog_interval=None)
    for reward in ("0.25", "0.75"):
        monkeypatch.setenv("AGENTGRAD_TEST_REWARD", reward)
        rollout = store.enqueue_rollout({"x": 1})
        with RunnerPool(agents_for_runner_start.env_agent, f"sqlite://{path}", n_runners=1, poll_timeout=0.1):
            (done,) = store.wait_for_rollouts([rollout.rollout_id], timeout=60)
        assert done.reward == float(reward)
    store.close()


def test_runner_processes_share_the_default_tls_context_unless_told_not_to(tmp_path, monkeypatch):
    """An agent's HTTP clients in a runner process share their thread's default TLS context (no CA
    bundle loaded per client: 15-20 ms each); ``AGENTGRAD_TLS_CONTEXT_PER_CLIENT=1`` keeps one per client."""
    import agents_for_runner_start

    from agentgrad.http.tls import PER_CLIENT_ENV

    path = tmp_path / "tls.db"
    store = SqliteStore(path, watchdog_interval=None)
    for opt_out, shared in ((None, 1.0), ("1", 0.0)):
        if opt_out is None:
            monkeypatch.delenv(PER_CLIENT_ENV, raising=False)
        else:
            monkeypatch.setenv(PER_CLIENT_ENV, opt_out)
        rollout = store.enqueue_rollout({"x": 1})
        with RunnerPool(agents_for_runner_start.tls_agent, f"sqlite://{path}", n_runners=1, poll_timeout=0.1):
            (done,) = store.wait_for_rollouts([rollout.rollout_id], timeout=60)
        assert done.reward == shared
    store.close()


def test_runner_start_context_preloads_agentgrad_in_a_fork_server_not_user_code():
    import multiprocessing

    from agentgrad.runner import PRELOADED, start_context

    ctx = start_context()
    if "forkserver" not in multiprocessing.get_all_start_methods():
        assert ctx.get_start_method() == "spawn"
        return
    from multiprocessing import forkserver

    assert ctx.get_start_method() == "forkserver"  # this checkout is what a fresh interpreter imports
    preload = forkserver._forkserver._preload_modules
    assert "__main__" not in preload and set(PRELOADED) <= set(preload)


def test_a_prepared_pool_starts_from_the_fork_server_started_ahead(tmp_path) -> None:
    """``RunnerPool.prepare()`` (what ``Trainer`` calls before loading its model) starts the fork
    server in the background; the pool started later forks from that same server."""
    import multiprocessing
    import subprocess
    import sys
    from pathlib import Path

    if "forkserver" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork server on this platform")
    script = tmp_path / "prepared_pool.py"
    script.write_text(
        "from multiprocessing import forkserver\n"
        "import agents_for_tests\n"
        "from agentgrad.runner import RunnerPool\n"
        "from agentgrad.store.sqlite import SqliteStore\n"
        "if __name__ == '__main__':\n"
        "    before = forkserver._forkserver._forkserver_pid\n"
        "    RunnerPool.prepare().join(60)\n"
        "    ahead = forkserver._forkserver._forkserver_pid\n"
        f"    store = SqliteStore({str(tmp_path / 's.db')!r}, watchdog_interval=None)\n"
        "    rollout = store.enqueue_rollout({'x': 1})\n"
        "    with RunnerPool(agents_for_tests.reward_agent, store.shared_url, n_runners=2, poll_timeout=0.1):\n"
        "        (done,) = store.wait_for_rollouts([rollout.rollout_id], timeout=60)\n"
        "    print(before, ahead is not None and ahead == forkserver._forkserver._forkserver_pid, done.status.value)\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent / "support"), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert result.stdout.split() == ["None", "True", "succeeded"], result.stderr[-2000:]


def test_instrument_imports_no_openai_and_patches_it_once_imported():
    """A runner process starts without importing openai (half a second), yet an agent's openai
    client still sends the rollout's headers."""
    import subprocess
    import sys

    code = (
        "import sys; from agentgrad.tracing import instrument; instrument(); "
        "print('openai' in sys.modules); import openai; "
        "print(getattr(openai._base_client.BaseClient._build_headers, '_agentgrad_patched', False))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]


def test_pool_runners_stop_when_the_process_that_started_them_is_killed(tmp_path) -> None:
    """A trainer killed outright cannot stop its runner processes; they notice and stop themselves."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = tmp_path / "pool_owner.py"
    script.write_text(
        "import sys, time\n"
        "import agents_for_tests\n"
        "from agentgrad.runner import RunnerPool\n"
        "if __name__ == '__main__':\n"
        f"    pool = RunnerPool(agents_for_tests.reward_agent, 'sqlite://{tmp_path / 's.db'}', n_runners=2,\n"
        "                      poll_timeout=0.1).start()\n"
        "    print(' '.join(str(p.pid) for p in pool.processes), flush=True)\n"
        "    time.sleep(600)\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent / "support"), os.environ.get("PYTHONPATH", "")]),
    }
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        children = [int(pid) for pid in owner.stdout.readline().split()]  # type: ignore[union-attr]
        assert len(children) == 2
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        with open(f"/proc/{pid}/stat") as stat:  # an exited child of init is reaped soon; a zombie is gone
            return stat.read().split(")")[-1].split()[0] != "Z"

    deadline = time.monotonic() + 60
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [pid for pid in children if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "runner processes outlived the process that started them"

"""Write-behind recording: the flush barrier, batching, failures that surface, drain on stop, runner flush."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from typing import Any

import httpx
import openai
import pytest
from proxy_support import new_attempt

from agentgrad import semconv
from agentgrad.proxy import LLMProxy
from agentgrad.proxy.writer import FlushError, FlushTimeout
from agentgrad.runner import Runner
from agentgrad.store.protocol import Store
from agentgrad.testing.stub import StubUpstream
from agentgrad.types import LLM, AttemptedRollout, AttemptStatus

MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]


class WrappedStore:
    """Delegates to a store; ``add_spans`` can be held at a gate, failed, and is counted."""

    def __init__(self, inner: Store, *, fail: int = 0, error: type[Exception] = sqlite3.OperationalError) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.gate.set()
        self.fail, self.error = fail, error
        self.batches: list[int] = []
        self.entered = threading.Event()

    def add_spans(self, spans: Any) -> Any:
        self.entered.set()
        self.gate.wait(30)
        if self.fail:
            self.fail -= 1
            raise self.error("database is locked")
        result = self.inner.add_spans(spans)
        self.batches.append(len(spans))
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def url_for(proxy: LLMProxy, claimed: AttemptedRollout) -> str:
    return proxy.endpoint_for(claimed.rollout.rollout_id, claimed.attempt.attempt_id) + "/chat/completions"


def stored(store: Store, claimed: AttemptedRollout) -> int:
    return len(store.query_spans(claimed.rollout.rollout_id, claimed.attempt.attempt_id, name=semconv.SPAN_LLM_CALL))


def ids(claimed: AttemptedRollout) -> tuple[str, str]:
    return claimed.rollout.rollout_id, claimed.attempt.attempt_id


def test_answer_does_not_wait_for_the_store_and_flush_is_the_barrier(memory_store, stub, attempt) -> None:
    slow = WrappedStore(memory_store)
    slow.gate.clear()  # the store is stuck: the client still gets its answer
    with LLMProxy(slow, stub.start()) as proxy:
        reply = httpx.post(url_for(proxy, attempt), json={"model": "m", "messages": MESSAGES}, timeout=10)
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]
        assert stored(memory_store, attempt) == 0
        with pytest.raises(FlushTimeout):
            proxy.flush(*ids(attempt), timeout=0.2)
        timed_out = httpx.post(
            proxy.url + "/agentgrad/flush",
            timeout=10,
            json={"rollout_id": attempt.rollout.rollout_id, "attempt_id": attempt.attempt.attempt_id, "timeout": 0.1},
        )
        assert timed_out.status_code == 504 and timed_out.json()["error"]["code"] == "flush_timeout"
        slow.gate.set()
        done = httpx.post(
            proxy.url + "/agentgrad/flush",
            timeout=10,
            json={"rollout_id": attempt.rollout.rollout_id, "attempt_id": attempt.attempt.attempt_id, "timeout": 10},
        )
        assert done.status_code == 200 and done.json() == {"status": "stored", "recorded_calls": True}
        assert stored(memory_store, attempt) == 1
        assert proxy.metrics.recorded == 1 and proxy.metrics.as_dict()["store_batches"] == 1
        assert proxy.flush(*ids(attempt), timeout=0) is True
        other = new_attempt(memory_store)  # an attempt with no calls flushes at once
        assert proxy.flush(*ids(other), timeout=0) is False
        answer = httpx.post(
            proxy.url + "/agentgrad/flush",
            timeout=10,
            json={"rollout_id": other.rollout.rollout_id, "attempt_id": other.attempt.attempt_id, "timeout": 0},
        )
        assert answer.json() == {"status": "stored", "recorded_calls": False}


def test_concurrent_http_flushes_wait_on_the_loop_and_all_return_once_stored(memory_store, stub, attempt) -> None:
    """``POST /agentgrad/flush`` waits on a future the writer resolves: several flushes of one
    attempt (and one of another attempt that has nothing pending) are answered while the store
    is held, each at the right time, and none is left waiting behind."""
    slow = WrappedStore(memory_store)
    slow.gate.clear()
    idle = new_attempt(memory_store)
    with LLMProxy(slow, stub.start()) as proxy:
        assert httpx.post(url_for(proxy, attempt), json={"model": "m", "messages": MESSAGES}).status_code == 200
        assert slow.entered.wait(5)

        async def flush(claimed: AttemptedRollout, client: httpx.AsyncClient, timeout: float) -> httpx.Response:
            body = {"rollout_id": claimed.rollout.rollout_id, "attempt_id": claimed.attempt.attempt_id}
            return await client.post(proxy.url + "/agentgrad/flush", json={**body, "timeout": timeout}, timeout=30)

        async def main() -> list[httpx.Response]:
            async with httpx.AsyncClient() as client:
                waiting = [asyncio.ensure_future(flush(attempt, client, 20)) for _ in range(3)]
                timed_out = await flush(attempt, client, 0.1)  # gives up; the others go on waiting
                assert timed_out.status_code == 504
                assert (await flush(idle, client, 20)).json() == {"status": "stored", "recorded_calls": False}
                assert not any(w.done() for w in waiting)
                slow.gate.set()
                return list(await asyncio.gather(*waiting))

        answers = asyncio.run(main())
        assert [a.json() for a in answers] == [{"status": "stored", "recorded_calls": True}] * 3
        assert stored(memory_store, attempt) == 1
        assert not proxy.app.state.proxy.writer._waiters  # every waiter was resolved or withdrawn


def test_flush_endpoint_refuses_bad_bodies(proxy) -> None:
    for body in (
        b"nope",
        b"[]",
        b'{"rollout_id": "r"}',
        b'{"rollout_id": "r", "attempt_id": 3}',
        b'{"rollout_id": "r", "attempt_id": "a", "timeout": -1}',
    ):
        response = httpx.post(
            proxy.url + "/agentgrad/flush", content=body, headers={"Content-Type": "application/json"}
        )
        assert response.status_code == 400, body
        assert "rollout_id" in response.json()["error"]["message"]
    assert httpx.get(proxy.url + "/agentgrad/flush").status_code == 405  # only a POST is a flush


def test_flush_waits_for_an_in_flight_stream(memory_store, stub, proxy, attempt) -> None:
    stub.stream_gate = threading.Event()
    client = openai.OpenAI(base_url=proxy.endpoint_for(*ids(attempt)), api_key="k")
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    first = next(iter(stream))  # the call is under way: the upstream holds the rest
    assert first.choices[0].delta.role == "assistant"
    with pytest.raises(FlushTimeout):
        proxy.flush(*ids(attempt), timeout=0.2)
    flushed = threading.Event()
    waiter = threading.Thread(target=lambda: (proxy.flush(*ids(attempt), timeout=20), flushed.set()))
    waiter.start()
    time.sleep(0.2)
    assert not flushed.is_set()  # still waiting for the stream
    stub.stream_gate.set()
    for _ in stream:
        pass
    waiter.join(20)
    assert flushed.is_set()
    assert stored(memory_store, attempt) == 1  # stored the instant flush returned


def test_aborted_stream_releases_the_barrier(memory_store, stub, proxy, attempt) -> None:
    stub.stream_gate = threading.Event()
    with httpx.stream(
        "POST", url_for(proxy, attempt), timeout=10, json={"model": "m", "messages": MESSAGES, "stream": True}
    ) as response:
        next(response.iter_raw())  # first event, then the client goes away
    deadline = time.monotonic() + 5
    while proxy.metrics.streams_aborted < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proxy.metrics.streams_aborted == 1  # at once: the upstream still holds the rest
    stub.stream_gate.set()
    proxy.flush(*ids(attempt), timeout=10)  # the abandoned call ends without a span
    assert stored(memory_store, attempt) == 0


def test_concurrent_calls_share_store_transactions(memory_store, stub) -> None:
    counting = WrappedStore(memory_store)
    claimed = [new_attempt(memory_store) for _ in range(4)]
    counting.gate.clear()
    with LLMProxy(counting, stub.start()) as proxy:

        async def main() -> None:
            async with httpx.AsyncClient(timeout=20) as client:
                calls = [
                    client.post(url_for(proxy, one), json={"model": "m", "messages": MESSAGES})
                    for one in claimed
                    for _ in range(6)
                ]
                replies = await asyncio.gather(*calls)
            assert all(r.status_code == 200 for r in replies)

        asyncio.run(main())  # all 24 answered while the store is held
        assert counting.entered.wait(5)
        counting.gate.set()
        for one in claimed:
            proxy.flush(*ids(one), timeout=20)
            assert stored(memory_store, one) == 6
        assert sum(counting.batches) == 24 and proxy.metrics.recorded == 24
        # the first span may go alone (the writer woke for it); the others queued behind it share one
        assert len(counting.batches) <= 2, counting.batches
        assert proxy.metrics.store_batches == len(counting.batches)
        assert {r.llm_calls for r in (memory_store.get_rollout(one.rollout.rollout_id) for one in claimed)} == {6}


def test_back_to_back_calls_share_a_transaction_and_nobody_waits_for_the_linger(memory_store, stub, attempt) -> None:
    counting = WrappedStore(memory_store)
    with LLMProxy(counting, f"http://127.0.0.1:{stub.port}/v1") as proxy:
        proxy.app.state.proxy.writer.linger = 60  # a flush or a stop that waited for it would time out
        for _ in range(3):
            assert httpx.post(url_for(proxy, attempt), json={"model": "m", "messages": MESSAGES}).status_code == 200
        started = time.monotonic()
        proxy.flush(*ids(attempt), timeout=10)
        assert time.monotonic() - started < 5 and counting.batches == [3]
        assert httpx.post(url_for(proxy, attempt), json={"model": "m", "messages": MESSAGES}).status_code == 200
        started = time.monotonic()
    assert time.monotonic() - started < 15  # the stop drained the lingering span at once
    assert counting.batches == [3, 1] and stored(memory_store, attempt) == 4


def test_transient_store_errors_are_retried(memory_store, stub, attempt) -> None:
    flaky = WrappedStore(memory_store, fail=2)
    with LLMProxy(flaky, stub.start()) as proxy:
        proxy.app.state.proxy.writer.backoff = 0.01
        assert httpx.post(url_for(proxy, attempt), json={"model": "m", "messages": MESSAGES}).status_code == 200
        proxy.flush(*ids(attempt), timeout=10)
        assert stored(memory_store, attempt) == 1
        assert proxy.metrics.store_retries == 2 and proxy.metrics.store_errors == 0


def test_lost_spans_are_counted_and_fail_the_flush(memory_store, stub, attempt, caplog) -> None:
    broken = WrappedStore(memory_store, fail=10**6)
    with LLMProxy(broken, stub.start()) as proxy:
        writer = proxy.app.state.proxy.writer
        writer.backoff, writer.retries = 0.001, 2
        with caplog.at_level(logging.WARNING, logger="agentgrad.proxy"):
            assert httpx.post(url_for(proxy, attempt), json={"model": "m", "messages": MESSAGES}).status_code == 200
            with pytest.raises(FlushError, match="database is locked"):
                proxy.flush(*ids(attempt), timeout=10)
        assert any("could not store LLM call" in r.getMessage() for r in caplog.records)
        assert proxy.metrics.store_errors == 1 and proxy.metrics.store_retries == 2 and proxy.metrics.recorded == 0
        assert httpx.get(proxy.url + "/metrics").json()["store_errors"] == 1
        # reported once: the next failure is reported by the next flush, over HTTP with a 500
        assert httpx.post(url_for(proxy, attempt), json={"model": "m", "messages": MESSAGES}).status_code == 200
        response = httpx.post(
            proxy.url + "/agentgrad/flush",
            timeout=10,
            json={"rollout_id": attempt.rollout.rollout_id, "attempt_id": attempt.attempt.attempt_id},
        )
        assert response.status_code == 500 and response.json()["error"]["code"] == "store_error"
        proxy.flush(*ids(attempt), timeout=1)


def test_a_refused_span_does_not_take_its_batch_down(memory_store, stub, attempt) -> None:
    held = WrappedStore(memory_store)
    held.gate.clear()
    with LLMProxy(held, stub.start()) as proxy:
        first = httpx.post(url_for(proxy, attempt), json={"model": "m", "messages": MESSAGES})
        assert held.entered.wait(5)  # the writer holds the first span; the next two queue up together
        bogus = proxy.endpoint_for("ro-unknown", "at-unknown") + "/chat/completions"
        second = httpx.post(bogus, json={"model": "m", "messages": MESSAGES})
        third = httpx.post(url_for(proxy, attempt), json={"model": "m", "messages": MESSAGES})
        assert first.status_code == second.status_code == third.status_code == 200
        held.gate.set()
        proxy.flush(*ids(attempt), timeout=10)
        assert stored(memory_store, attempt) == 2
        with pytest.raises(FlushError):
            proxy.flush("ro-unknown", "at-unknown", timeout=10)
        assert proxy.metrics.store_retries == 0  # an unknown rollout is not worth retrying


def test_stop_drains_the_queue(memory_store, stub, attempt) -> None:
    held = WrappedStore(memory_store)
    held.gate.clear()
    proxy = LLMProxy(held, stub.start())
    proxy.start()
    for _ in range(5):
        assert httpx.post(url_for(proxy, attempt), json={"model": "m", "messages": MESSAGES}).status_code == 200
    assert stored(memory_store, attempt) == 0
    threading.Timer(0.3, held.gate.set).start()
    proxy.stop()
    assert stored(memory_store, attempt) == 5 and proxy.metrics.recorded == 5


# ---- the runner flushes before it reports -------------------------------------------------------------


def calling_agent(task: dict, llm: LLM) -> float:
    client = openai.OpenAI(base_url=llm.endpoint, api_key="k")
    for _ in range(2):
        client.chat.completions.create(model=llm.model, messages=MESSAGES)
    return 1.0


async def async_calling_agent(task: dict, llm: LLM) -> float:
    """:func:`calling_agent` as an async agent: the runner flushes its calls from its event loop."""
    async with openai.AsyncOpenAI(base_url=llm.endpoint, api_key="k") as client:
        for _ in range(2):
            await client.chat.completions.create(model=llm.model, messages=MESSAGES)
    return 1.0


AGENTS = pytest.mark.parametrize("agent", [calling_agent, async_calling_agent], ids=["sync", "async"])


class ObservedStore(WrappedStore):
    """The runner's view of the store: notes ``llm_calls`` at the instant an attempt is reported."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.calls_when_reported: list[int] = []
        self.counts = 0

    def count_rollouts(self, *args: Any, **kwargs: Any) -> int:
        self.counts += 1
        return self.inner.count_rollouts(*args, **kwargs)

    def update_attempt(self, rollout_id: str, attempt_id: str, status: Any, *args: Any, **kwargs: Any) -> Any:
        if status in (AttemptStatus.SUCCEEDED, AttemptStatus.FAILED):
            self.calls_when_reported.append(self.inner.get_rollout(rollout_id).llm_calls)
        return self.inner.update_attempt(rollout_id, attempt_id, status, *args, **kwargs)


@AGENTS
@pytest.mark.parametrize("remembered", [True, False], ids=["remembered", "forgotten"])
@pytest.mark.parametrize("via", ["http", "in_process"])
def test_runner_flushes_before_reporting(memory_store, via, remembered, agent, monkeypatch) -> None:
    """Every call is stored before the attempt is reported; the flush's answer that the proxy
    recorded calls spares the runner its store read ("did this rollout make an LLM call?"),
    which it makes when the proxy no longer remembers the attempt."""
    from agentgrad.proxy import metrics as metrics_module

    if not remembered:
        monkeypatch.setattr(metrics_module, "ATTEMPTS_REMEMBERED", 0)
    slow = WrappedStore(memory_store)
    original = slow.add_spans
    slow.add_spans = lambda spans: (time.sleep(0.3), original(spans))[1]  # type: ignore[method-assign]
    observed = ObservedStore(memory_store)
    for _ in range(2):
        memory_store.enqueue_rollout({"q": "x"})
    with StubUpstream(["The answer is 5."]) as stub, LLMProxy(slow, stub.start()) as proxy:
        extra = {"llm_proxy": proxy} if via == "in_process" else {}
        runner = Runner(agent, observed, max_rollouts=2, llm_proxy_url=proxy.url, poll_timeout=0.1, **extra)
        stats = runner.run()
    assert stats.succeeded == 2 and stats.no_llm_calls == 0 and not stats.errors
    assert observed.calls_when_reported == [2, 2]
    assert observed.counts == (0 if remembered else 2)


def quiet_agent(task: dict, llm: LLM) -> float:
    return 1.0  # never calls its LLM endpoint


@pytest.mark.parametrize("via", ["http", "in_process"])
def test_a_rollout_without_a_call_through_the_proxy_is_still_counted(memory_store, via) -> None:
    memory_store.enqueue_rollout({"q": "x"})
    observed = ObservedStore(memory_store)
    with StubUpstream(["The answer is 5."]) as stub, LLMProxy(memory_store, stub.start()) as proxy:
        extra = {"llm_proxy": proxy} if via == "in_process" else {}
        runner = Runner(quiet_agent, observed, max_rollouts=1, llm_proxy_url=proxy.url, poll_timeout=0.1, **extra)
        stats = runner.run()
    assert stats.succeeded == 1 and stats.no_llm_calls == 1 and observed.counts == 1


@AGENTS
def test_runner_reports_the_attempt_when_the_flush_fails(memory_store, agent, caplog) -> None:
    broken = WrappedStore(memory_store, fail=10**6)
    memory_store.enqueue_rollout({"q": "x"})
    with StubUpstream(["The answer is 5."]) as stub, LLMProxy(broken, stub.start()) as proxy:
        writer = proxy.app.state.proxy.writer
        writer.backoff, writer.retries = 0.001, 1
        runner = Runner(agent, memory_store, max_rollouts=1, llm_proxy_url=proxy.url, poll_timeout=0.1)
        with caplog.at_level(logging.WARNING, logger="agentgrad.runner"):
            stats = runner.run()
    assert stats.succeeded == 1 and len(stats.errors) == 1 and "flush" in stats.errors[0]
    assert any("could not confirm its calls are stored" in r.getMessage() for r in caplog.records)
    (rollout,) = memory_store.query_rollouts()
    assert rollout.status.value == "succeeded"


def test_attempts_with_calls_counts_each_attempt_once_in_bounded_memory(monkeypatch) -> None:
    """A proxy serves long runs: it remembers only the latest attempts to count each once, where
    it kept every attempt it ever saw (~250 bytes each)."""
    from agentgrad.proxy import metrics as metrics_module

    monkeypatch.setattr(metrics_module, "ATTEMPTS_REMEMBERED", 4)
    metrics = metrics_module.ProxyMetrics()
    metrics.recorded_calls_of([("r1", "a1"), ("r1", "a1"), ("r2", "a1")])
    metrics.recorded_calls_of([("r1", "a1"), ("r1", "a2")])  # a retry is another attempt
    assert (metrics.recorded, metrics.attempts_with_calls) == (5, 3)
    metrics.recorded_calls_of([(f"r{i}", "a1") for i in range(3, 13)])
    assert (metrics.recorded, metrics.attempts_with_calls) == (15, 13)
    assert len(metrics._recent) == 4
    metrics.recorded_calls_of([("r12", "a1")])  # still remembered: not counted again
    assert metrics.attempts_with_calls == 13
    values = metrics.as_dict()
    assert values["attempts_with_calls"] == 13 and values["recorded"] == 16
    assert all(isinstance(v, int) for v in values.values())

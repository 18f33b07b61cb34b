"""Fixtures of the proxy tests: a store, the scripted upstream stand-in, a proxy, an attempt."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentgrad.proxy import LLMProxy
from agentgrad.testing.stub import StubUpstream, tool_reply
from agentgrad.store import open_store
from agentgrad.store.protocol import Store
from agentgrad.types import AttemptedRollout


@pytest.fixture
def store() -> Iterator[Store]:
    with open_store("memory", watchdog=False) as s:
        yield s


@pytest.fixture
def stub() -> Iterator[StubUpstream]:
    with StubUpstream([tool_reply("calculator", {"expression": "2 + 3"}), "The answer is 5."]) as upstream:
        yield upstream


#: Proxies of the ``proxy`` fixture now serving: :func:`flush_all` waits for their writers.
LIVE_PROXIES: list[LLMProxy] = []


@pytest.fixture
def proxy(store: Store, stub: StubUpstream) -> Iterator[LLMProxy]:
    with LLMProxy(store, f"http://127.0.0.1:{stub.port}/v1") as p:
        LIVE_PROXIES.append(p)
        try:
            yield p
        finally:
            LIVE_PROXIES.remove(p)


def flush_all(claimed: AttemptedRollout) -> None:
    """The flush barrier the runner passes before reporting an attempt (spans are written behind)."""
    for p in LIVE_PROXIES:
        p.flush(claimed.rollout.rollout_id, claimed.attempt.attempt_id, timeout=10)


def new_attempt(store: Store) -> AttemptedRollout:
    """A queued-then-claimed rollout whose attempt the proxy can record into."""
    store.enqueue_rollout({"question": "What is 2 + 3?"})
    claimed = store.dequeue_rollout("test-worker")
    assert claimed is not None
    return claimed


@pytest.fixture
def attempt(store: Store) -> AttemptedRollout:
    return new_attempt(store)

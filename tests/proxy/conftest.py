"""Fixtures of the proxy tests: the scripted upstream stand-in, a proxy, an attempt (their store is
the root conftest's ``memory_store``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from proxy_support import LIVE_PROXIES, new_attempt

from agentgrad.proxy import LLMProxy
from agentgrad.store.protocol import Store
from agentgrad.testing.stub import StubUpstream, tool_reply
from agentgrad.types import AttemptedRollout


@pytest.fixture
def stub() -> Iterator[StubUpstream]:
    with StubUpstream([tool_reply("calculator", {"expression": "2 + 3"}), "The answer is 5."]) as upstream:
        yield upstream


@pytest.fixture
def proxy(memory_store: Store, stub: StubUpstream) -> Iterator[LLMProxy]:
    with LLMProxy(memory_store, f"http://127.0.0.1:{stub.port}/v1") as p:
        LIVE_PROXIES.append(p)
        try:
            yield p
        finally:
            LIVE_PROXIES.remove(p)


@pytest.fixture
def attempt(memory_store: Store) -> AttemptedRollout:
    return new_attempt(memory_store)

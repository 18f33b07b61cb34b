"""Helpers of the proxy tests (importable by name: ``tests/support`` is on pytest's ``pythonpath``)."""

from __future__ import annotations

from agentgrad.proxy import LLMProxy
from agentgrad.store.protocol import Store
from agentgrad.types import AttemptedRollout

#: Proxies of the ``proxy`` fixture now serving: :func:`flush_all` waits for their writers.
LIVE_PROXIES: list[LLMProxy] = []


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

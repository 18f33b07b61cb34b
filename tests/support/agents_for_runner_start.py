"""Agents for the runner's start and hot-path tests (module level: runner processes import them)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from agentgrad.types import Resources


def env_agent(task: Any, resources: Resources) -> float:
    """The reward a variable of the runner process's environment names."""
    return float(os.environ["AGENTGRAD_TEST_REWARD"])


async def thread_name_agent(task: Any, resources: Resources) -> dict[str, Any]:
    """An async agent that says which thread ran it (in the reward's place: the rollout's metadata
    is not for agents to write, so the name travels in a dict the test reads back)."""
    THREADS.append(threading.current_thread().name)
    return {"reward": 1.0}


THREADS: list[str] = []
FINISHED = threading.Event()


def slow_sync_agent(task: Any, resources: Resources) -> float:
    """Sleeps ``task['sleep']`` seconds in its thread, then returns a reward."""
    time.sleep(task["sleep"])
    FINISHED.set()
    return 1.0


def resources_mutating_agent(task: Any, resources: Resources) -> float:
    """Changes the resources it was given (an agent may): the next attempt must not see it."""
    note = resources.items["note"]  # a JsonResource
    seen, note.value = note.value, "changed by an agent"
    resources.items["other"] = note
    return 1.0 if seen == "as published" else 0.0


def tls_agent(task: Any, resources: Resources) -> float:
    """1.0 when the runner process's httpx clients share their default TLS context."""
    import httpx

    first, second = httpx.Client(), httpx.Client()
    try:
        return float(first._transport._pool._ssl_context is second._transport._pool._ssl_context)
    finally:
        first.close()
        second.close()

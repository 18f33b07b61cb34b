"""Module-level agents for tests that run them in other processes (runner pools, the CLI).

Runner processes are spawned and unpickle the agent by reference, so these must live in an
importable module: ``tests/support`` is on ``sys.path`` under pytest (pyproject's ``pythonpath``),
and on ``PYTHONPATH`` for the CLI subprocesses.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from agentgrad import emit_message, emit_reward
from agentgrad.agents import Agent, rollout
from agentgrad.types import Resources, Rollout


@rollout
def reward_agent(task: Any, resources: Resources) -> float:
    """Reward = task["x"] / 10; emits one message so every rollout has a span of its own."""
    emit_message(f"task {task}", pid=os.getpid())
    return float(task["x"]) / 10


@rollout
def failing_agent(task: Any, resources: Resources) -> float:
    if task.get("fail"):
        raise ValueError(f"bad task {task['x']}")
    return 1.0


@rollout
async def slow_async_agent(task: Any, resources: Resources) -> float:
    """Sleeps ``task["sleep"]`` seconds (cancellable)."""
    emit_message("started")
    await asyncio.sleep(float(task.get("sleep", 30)))
    return 1.0


@rollout
def hang_first_attempt(task: Any, rollout: Rollout) -> float:
    """Hangs on the first attempt (the test kills its runner); succeeds on a retry."""
    emit_message(f"attempt {rollout.num_attempts} in pid {os.getpid()}")
    if rollout.num_attempts == 1:
        time.sleep(60)
    emit_reward(0.5)
    return None  # type: ignore[return-value]


class EchoAgent(Agent):
    """A class-based agent: reward 1 in training, 0.25 in validation."""

    name = "echo"

    def rollout(self, task: Any, resources: Resources, rollout: Rollout) -> float:
        return 1.0

    def validation_rollout(self, task: Any, resources: Resources, rollout: Rollout) -> float:
        return 0.25


echo_agent = EchoAgent()

not_an_agent = "just a string"


def bad_signature(task, llm, temperature):  # noqa: ANN001 - an unsupported shape on purpose
    return 0.0


def plain_agent(task, resources):  # noqa: ANN001 - undecorated; Runner wraps it
    return 0.5


class NeedsArgsAgent(Agent):
    """An Agent subclass whose constructor needs arguments: ``module:NeedsArgsAgent`` is refused."""

    def __init__(self, model: str, temperature: float = 0.0) -> None:
        self.model, self.temperature = model, temperature

    def rollout(self, task: Any, resources: Resources, rollout: Rollout) -> float:
        return 1.0


class NotAnAgentClass:
    """A class that is not an Agent subclass (it even has a rollout method)."""

    def rollout(self, task: Any, resources: Resources, rollout: Rollout) -> float:
        return 1.0


class BrokenConstructorAgent(Agent):
    """An Agent subclass whose own constructor fails: the user's error comes through unchanged."""

    def __init__(self) -> None:
        raise RuntimeError("cannot reach the tool server")


class Holder:
    """Reaches an agent by ``module:Holder.agent``."""

    agent = EchoAgent()

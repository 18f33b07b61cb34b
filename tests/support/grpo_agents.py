"""Agents for GRPO tests that record their own LLM spans (no model server needed): a fair coin
decides each completion, and the rewarded one is ``GOOD``."""

from __future__ import annotations

import collections
import random
import threading
import time

from agentgrad import semconv
from agentgrad.agents import rollout
from agentgrad.context import require_context
from agentgrad.training import PolicyTrainer, Published
from agentgrad.types import Span

PROMPT = list(range(3, 30))
GOOD, BAD = [100, 101, 102], [200, 201, 202]


class RecordingPublisher:
    def __init__(self) -> None:
        self.versions: list[str] = []

    def publish(self, trainer: PolicyTrainer) -> Published:
        self.versions.append(f"v{trainer.step}")
        return Published(version=self.versions[-1])


_coin_lock = threading.Lock()
_coin_draws: collections.Counter[tuple[str, int]] = collections.Counter()


def _coin(mode: str, k: int) -> bool:
    """A fair coin seeded by mode, task and draw number: every group of a task's rollouts gets the
    same outcomes on every run, whatever order the runner's threads draw in."""
    with _coin_lock:
        draw = _coin_draws[mode, k]
        _coin_draws[mode, k] += 1
    return random.Random(f"coin/{mode}/{k}/{draw}").random() < 0.5


def _record_call(task, resources, completion: list[int]) -> None:
    """Record one LLM call span with token ids for ``task``, as served by the resources' version."""
    context = require_context("a GRPO test agent")
    context.store.add_span(
        Span(
            rollout_id=context.rollout_id,
            attempt_id=context.attempt_id,
            name=semconv.SPAN_LLM_CALL,
            attributes={
                semconv.LLM_PROMPT_TOKEN_IDS: PROMPT + [task["k"]],
                semconv.LLM_COMPLETION_TOKEN_IDS: completion,
                semconv.LLM_LOGPROBS: [-6.0] * len(completion),
                semconv.MODEL_VERSION: resources.items["agentgrad_policy"].value["model_version"],
            },
        )
    )


@rollout
def coin_agent(task, resources):
    """Pretends to call an LLM: records a call span with token ids, rewards the GOOD completion.
    A task's ``sleep`` (seconds) makes it take that long first."""
    time.sleep(task.get("sleep", 0.0))
    good = _coin(require_context("coin_agent").rollout.mode, task["k"])
    _record_call(task, resources, GOOD if good else BAD)
    return 1.0 if good else 0.0


@rollout
def always_good_agent(task, resources):
    """Every completion earns the same reward: each GRPO group has zero variance."""
    _record_call(task, resources, GOOD)
    return 1.0


_settling_lock = threading.Lock()
_settling_draws: collections.Counter[object] = collections.Counter()


@rollout
def settling_agent(task, resources):
    """Its first ``task["first_step"]`` rollouts (GRPO's first step) are rewarded alternately
    within each task's group, so that step trains; every later one earns 1: the policy has
    "settled" and each later group has zero variance."""
    with _settling_lock:
        n = _settling_draws["all"]
        draw = _settling_draws[task["k"]]
        _settling_draws["all"] += 1
        _settling_draws[task["k"]] += 1
    good = n >= task["first_step"] or draw % 2 == 1
    _record_call(task, resources, GOOD if good else BAD)
    return 1.0 if good else 0.0

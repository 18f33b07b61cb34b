"""The one reward-number rule (agentgrad.rewards) and the places that read rewards by it.

Each place keeps its own reaction to a refused value (the runner and the emitters raise, the
store, the credit rules and the dashboard read it as "no reward"), but not its own rule: the
same values are refused everywhere.
"""

from __future__ import annotations

import math

import pytest

from agentgrad import semconv
from agentgrad.adapters.credit import reward_value
from agentgrad.dashboard.views import reward_rows
from agentgrad.rewards import reward_number
from agentgrad.runner import RewardError, reward_of
from agentgrad.store.memory import MemoryStore
from agentgrad.types import Span

REFUSED = [math.nan, math.inf, -math.inf, True, False, "0.5", "1", None, [1.0], {"reward": 1.0}, 10**400]
ACCEPTED = [(0, 0.0), (1, 1.0), (-3, -3.0), (0.25, 0.25), (-1e300, -1e300), (2**60, float(2**60))]


@pytest.mark.parametrize("value", REFUSED, ids=repr)
def test_refused(value: object) -> None:
    assert reward_number(value) is None


@pytest.mark.parametrize(("value", "expected"), ACCEPTED, ids=repr)
def test_accepted_as_float(value: object, expected: float) -> None:
    number = reward_number(value)
    assert number == expected and type(number) is float


def reward_span(value: object, **dimensions: object) -> Span:
    attributes = {semconv.REWARD_VALUE: value, **{semconv.REWARD_PREFIX + k: v for k, v in dimensions.items()}}
    return Span(rollout_id="ro-1", attempt_id="at-1", name=semconv.SPAN_REWARD, attributes=attributes)


@pytest.mark.parametrize("value", [v for v in REFUSED if v is not None and not isinstance(v, dict)], ids=repr)
def test_every_reader_refuses_the_same_values(value: object) -> None:
    with pytest.raises(RewardError, match="non-numeric reward"):  # the runner: the agent returned it
        reward_of(value)
    with pytest.raises(RewardError, match="non-numeric reward"):
        reward_of({"reward": value})
    assert reward_value(reward_span(value)) is None  # credit rules: a reward span that is not one is absent
    (row,) = reward_rows([reward_span(value)])  # the dashboard: shown, without a value
    assert row.value is None


def test_readers_agree_on_a_good_value() -> None:
    assert reward_of(1) == reward_of({"reward": 1}) == reward_value(reward_span(1)) == 1.0
    (row,) = reward_rows([reward_span(0.5, a=0.5, b=math.nan)])
    assert row.value == 0.5 and row.dimensions == {"a": 0.5}  # a NaN dimension is not shown as a number


@pytest.mark.parametrize("value", [True, "0.5", 10**400], ids=repr)
def test_the_store_keeps_the_last_reward_number(value: object) -> None:
    store = MemoryStore(watchdog_interval=None)
    try:
        store.enqueue_rollout({"x": 1})
        (claimed,) = store.dequeue_rollouts(1, worker_id="w")
        ids = {"rollout_id": claimed.rollout.rollout_id, "attempt_id": claimed.attempt.attempt_id}
        store.add_span(Span(**ids, name=semconv.SPAN_REWARD, attributes={semconv.REWARD_VALUE: 0.5}))
        store.add_span(Span(**ids, name=semconv.SPAN_REWARD, attributes={semconv.REWARD_VALUE: value}))
        assert store.get_rollout(claimed.rollout.rollout_id).reward == 0.5  # the refused value changed nothing
    finally:
        store.close()

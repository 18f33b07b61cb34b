"""normalize_json: one walk that checks without copying, and converts exactly as JSON would."""

from __future__ import annotations

import collections
import enum
import json

import pytest

from agentgrad.errors import InvalidInputError
from agentgrad.store.jsoncheck import MAX_VALUE_DEPTH, normalize_json


class Color(str, enum.Enum):
    RED = "red"


class Level(int, enum.Enum):
    HIGH = 2


def test_plain_json_comes_back_as_the_same_object():
    value = {"a": [1, 2.5, None, True, {"b": "c"}], "empty": {}, "big": 10**30}
    assert normalize_json(value, "input") is value


@pytest.mark.parametrize(
    "value",
    [
        {7: "int key", 2.5: "float key", True: "bool key", None: "none key"},
        {"pair": (1, 2), "nested": [(None, {"k": (1,)})]},
        {"enum": Color.RED, "int enum": Level.HIGH, "ordered": collections.OrderedDict(a=1)},
        [{"keep": [1]}, (2, 3)],
    ],
    ids=["keys", "tuples", "subclasses", "partly-plain"],
)
def test_conversions_match_a_json_round_trip(value):
    before = repr(value)
    normalized = normalize_json(value, "input")
    assert normalized == json.loads(json.dumps(value))
    assert json.dumps(normalized) == json.dumps(json.loads(json.dumps(value)))
    assert repr(value) == before, "the caller's value is never changed"


def test_parts_that_need_no_conversion_are_shared():
    plain = {"k": [1]}
    normalized = normalize_json({"plain": plain, "pair": (1, 2)}, "input")
    assert normalized == {"plain": {"k": [1]}, "pair": [1, 2]}
    assert normalized["plain"] is plain


@pytest.mark.parametrize(
    ("value", "path", "problem"),
    [
        ({"steps": [{"score": float("nan")}]}, "input.steps[0].score", "non-finite"),
        ({"tool": object()}, "input.tool", "value of type object"),
        ({"pair": (1, {2})}, "input.pair[1]", "value of type set"),
        ({(1, 2): "tuple key"}, "input.(1, 2)", "key of type tuple"),
    ],
    ids=["nan", "object", "set-in-tuple", "tuple-key"],
)
def test_refusals_name_the_field(value, path, problem):
    with pytest.raises(InvalidInputError) as info:
        normalize_json(value, "input", "rollout 3: ")
    message = str(info.value)
    assert message.startswith("rollout 3: ")
    assert repr(path) in message and problem in message


def test_cycles_and_runaway_nesting_are_refused_not_crashed():
    cycle: dict = {}
    cycle["self"] = cycle
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    for value in (cycle, deep):
        with pytest.raises(InvalidInputError, match="nested too deeply"):
            normalize_json(value, "input")


def test_nesting_up_to_the_limit_is_accepted_and_beyond_it_refused():
    """Stored values nest at most MAX_VALUE_DEPTH levels: deeper ones could be stored but never
    read back (pydantic's JSON parser, which reads every record and answer, stops at 200)."""
    deep: list = [1]
    for _ in range(MAX_VALUE_DEPTH - 1):
        deep = [deep]
    assert normalize_json(deep, "input") == deep
    with pytest.raises(InvalidInputError, match=f"more than {MAX_VALUE_DEPTH} levels"):
        normalize_json([deep], "input")
    nested_tuples: tuple = (1,)  # converted by JSON first, then bounded the same way
    for _ in range(MAX_VALUE_DEPTH + 5):
        nested_tuples = (nested_tuples,)
    with pytest.raises(InvalidInputError, match="nested too deeply"):
        normalize_json({"steps": nested_tuples}, "input")

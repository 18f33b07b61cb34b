"""Conformance: resources are immutable, versioned snapshots with typed items."""

from __future__ import annotations

import pytest

from agentgrad.errors import AlreadyExistsError, InvalidInputError, NotFoundError
from agentgrad.types import LLM, JsonResource, PromptTemplate


def test_versions_increase_by_one(store):
    versions = [store.add_resources({"n": i}).version for i in range(3)]
    assert versions == [1, 2, 3]


def test_generated_resources_ids_are_unique(store):
    ids = [store.add_resources({}).resources_id for _ in range(5)]
    assert all(ids) and len(set(ids)) == 5


def test_explicit_resources_id(store):
    res = store.add_resources({"n": 1}, resources_id="res-mine")
    assert res.resources_id == "res-mine"
    assert store.get_resources("res-mine").version == 1


def test_get_resources(store):
    first = store.add_resources({"n": 1})
    second = store.add_resources({"n": 2})
    assert store.get_resources(first.resources_id) == first
    assert store.get_resources(second.resources_id) == second
    assert store.get_resources(first.resources_id).items["n"].value == 1


def test_get_unknown_resources(store):
    with pytest.raises(NotFoundError) as info:
        store.get_resources("res-ghost")
    assert "res-ghost" in str(info.value)


def test_latest_resources_none_when_empty(store):
    assert store.get_latest_resources() is None
    assert store.query_resources() == []


def test_latest_resources_is_highest_version(store):
    store.add_resources({"n": 1}, resources_id="r1")
    store.add_resources({"n": 2}, resources_id="r2")
    latest = store.get_latest_resources()
    assert latest.resources_id == "r2" and latest.version == 2
    store.add_resources({"n": 3}, resources_id="r0")  # ids do not decide the order
    assert store.get_latest_resources().resources_id == "r0"


def test_duplicate_resources_id_is_refused(store):
    original = store.add_resources({"prompt": "v1"}, resources_id="res-fixed")
    with pytest.raises(AlreadyExistsError) as info:
        store.add_resources({"prompt": "v2"}, resources_id="res-fixed")
    assert "res-fixed" in str(info.value)
    assert store.get_resources("res-fixed") == original
    assert store.get_latest_resources() == original
    assert len(store.query_resources()) == 1
    # The refused call consumed no version.
    assert store.add_resources({"prompt": "v3"}).version == 2


def test_returned_snapshot_cannot_change_stored_one(store):
    res = store.add_resources({"cfg": {"a": [1]}}, resources_id="r")
    res.items["cfg"].value["a"].append(2)
    res.items["extra"] = JsonResource(value=1)
    fetched = store.get_resources("r")
    assert fetched.items["cfg"].value == {"a": [1]}
    assert set(fetched.items) == {"cfg"}


def test_typed_items_round_trip(store):
    llm = LLM(endpoint="http://localhost:8000/v1", model="qwen-0.5b", api_key="sk-x", sampling={"temperature": 0.7})
    template = PromptTemplate(template="Solve {question}", engine="f-string")
    jinja = PromptTemplate(template="Hi {{ name }}", engine="jinja")
    res = store.add_resources(
        {"llm": llm, "prompt": template, "jinja": jinja, "cfg": {"k": [1, {"a": None}]}, "temp": 0.5, "s": "x"}
    )
    for fetched in (store.get_resources(res.resources_id), store.get_latest_resources(), store.query_resources()[0]):
        assert isinstance(fetched.items["llm"], LLM)
        assert fetched.items["llm"] == llm
        assert isinstance(fetched.items["prompt"], PromptTemplate)
        assert fetched.items["prompt"] == template
        assert fetched.items["jinja"] == jinja
        assert isinstance(fetched.items["cfg"], JsonResource)
        assert fetched.items["cfg"].value == {"k": [1, {"a": None}]}
        assert fetched.items["temp"] == JsonResource(value=0.5)
        assert fetched.items["s"] == JsonResource(value="x")
        assert fetched.first(LLM) == llm


def test_items_given_as_dicts_are_typed(store):
    res = store.add_resources(
        {
            "llm": {"resource_type": "llm", "endpoint": "http://e/v1", "model": "m"},
            "prompt": {"resource_type": "prompt_template", "template": "T {x}"},
        }
    )
    fetched = store.get_resources(res.resources_id)
    assert isinstance(fetched.items["llm"], LLM) and fetched.items["llm"].model == "m"
    assert isinstance(fetched.items["prompt"], PromptTemplate)
    assert fetched.items["prompt"].format(x=1) == "T 1"


def test_create_time_is_set(store):
    import time

    before = time.time()
    res = store.add_resources({})
    assert before - 1 <= res.create_time <= time.time() + 1
    assert store.get_resources(res.resources_id).create_time == pytest.approx(res.create_time)


def test_query_resources_ordered_by_version(store):
    made = [store.add_resources({"n": i}, resources_id=rid) for i, rid in enumerate(["zz", "aa", "mm"])]
    got = store.query_resources()
    assert [r.version for r in got] == [1, 2, 3]
    assert [r.resources_id for r in got] == ["zz", "aa", "mm"]
    assert got == made


def test_non_json_resource_is_refused(store):
    store.add_resources({"n": 1})
    with pytest.raises(InvalidInputError) as info:
        store.add_resources({"cfg": {"fn": object()}})
    assert "fn" in str(info.value)
    assert len(store.query_resources()) == 1
    assert store.add_resources({}).version == 2

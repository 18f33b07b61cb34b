"""Conformance: bad input is refused with a clear error and changes nothing."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3

import pytest
from pydantic import ValidationError

from agentgrad.errors import (
    AlreadyExistsError,
    InvalidInputError,
    InvalidTransitionError,
    NotFoundError,
    StoreFileError,
)
from agentgrad.store.protocol import RolloutRequest

# ---- unknown ids -------------------------------------------------------------------------------

UNKNOWN_ROLLOUT_CALLS = {
    "get_rollout": lambda s, k: s.get_rollout("ro-unknown-1"),
    "get_attempts": lambda s, k: s.get_attempts("ro-unknown-1"),
    "update_attempt": lambda s, k: s.update_attempt("ro-unknown-1", "at-unknown-2", "running"),
    "heartbeat": lambda s, k: s.heartbeat("ro-unknown-1", "at-unknown-2"),
    "cancel_rollout": lambda s, k: s.cancel_rollout("ro-unknown-1"),
    "update_rollout_metadata": lambda s, k: s.update_rollout_metadata("ro-unknown-1", {"a": 1}),
    "query_spans": lambda s, k: s.query_spans("ro-unknown-1"),
    "add_span": lambda s, k: s.add_span(k.span("ro-unknown-1", "at-unknown-2")),
}


@pytest.mark.parametrize("call", list(UNKNOWN_ROLLOUT_CALLS))
def test_unknown_rollout_id_is_named(store, kit, call):
    store.enqueue_rollout()  # a store that is not empty
    with pytest.raises(NotFoundError) as info:
        UNKNOWN_ROLLOUT_CALLS[call](store, kit)
    assert "ro-unknown-1" in str(info.value)
    assert isinstance(info.value, KeyError)


UNKNOWN_ATTEMPT_CALLS = {
    "update_attempt": lambda s, rid: s.update_attempt(rid, "at-unknown-9", "running"),
    "heartbeat": lambda s, rid: s.heartbeat(rid, "at-unknown-9"),
    "query_spans": lambda s, rid: s.query_spans(rid, attempt_id="at-unknown-9"),
}


@pytest.mark.parametrize("call", list(UNKNOWN_ATTEMPT_CALLS))
def test_unknown_attempt_id_is_named(store, kit, call):
    claimed = kit.claim(store)
    rid = claimed.rollout.rollout_id
    with pytest.raises(NotFoundError) as info:
        UNKNOWN_ATTEMPT_CALLS[call](store, rid)
    assert "at-unknown-9" in str(info.value)
    assert store.get_latest_attempt(rid) == claimed.attempt
    assert store.get_rollout(rid).status == "preparing"


def test_attempt_of_another_rollout_is_not_found(store, kit):
    a = kit.claim(store)
    b = kit.claim(store)
    with pytest.raises(NotFoundError):
        store.update_attempt(a.rollout.rollout_id, b.attempt.attempt_id, "running")
    assert store.get_latest_attempt(a.rollout.rollout_id).status == "preparing"
    assert store.get_latest_attempt(b.rollout.rollout_id).status == "preparing"


def test_unknown_resources_id_is_named(store):
    store.add_resources({"a": 1})
    with pytest.raises(NotFoundError) as info:
        store.get_resources("res-unknown-3")
    assert "res-unknown-3" in str(info.value)


# ---- illegal transitions -----------------------------------------------------------------------

PATHS = {
    "succeeded": ["running", "succeeded"],
    "failed": ["running", "failed"],
    "timeout": ["running", "timeout"],
    "running": ["running"],
}


@pytest.mark.parametrize(
    "current,requested",
    [
        ("succeeded", "running"),
        ("succeeded", "failed"),
        ("failed", "succeeded"),
        ("timeout", "running"),
        ("running", "preparing"),
    ],
)
def test_illegal_transition_names_both_states(store, kit, current, requested):
    claimed = kit.claim(store)
    rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
    for status in PATHS[current]:
        store.update_attempt(rid, aid, status)
    rollout_before = store.get_rollout(rid)
    attempt_before = store.get_latest_attempt(rid)
    with pytest.raises(InvalidTransitionError) as info:
        store.update_attempt(rid, aid, requested)
    message = str(info.value)
    assert current in message and requested in message, message
    assert store.get_rollout(rid) == rollout_before
    assert store.get_latest_attempt(rid) == attempt_before


def test_unknown_status_is_refused(store, kit):
    claimed = kit.claim(store)
    rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
    with pytest.raises(ValueError):  # InvalidInputError and pydantic's ValidationError are ValueErrors
        store.update_attempt(rid, aid, "finished-ish")
    assert store.get_latest_attempt(rid).status == "preparing"


# ---- input that is not JSON ------------------------------------------------------------------------


def test_non_json_task_is_refused_naming_the_field(store):
    store.enqueue_rollout("existing")
    with pytest.raises(InvalidInputError) as info:
        store.enqueue_rollout({"a": {"b": object()}})
    message = str(info.value)
    assert re.search(r"\ba\W{1,4}b\b", message), f"the message should name the path a.b: {message}"
    assert store.count_rollouts() == 1
    with pytest.raises(InvalidInputError) as info:
        store.enqueue_rollout({"outer": [1, {"inner_field": object()}]})
    assert "inner_field" in str(info.value)
    assert store.count_rollouts() == 1


@pytest.mark.parametrize(
    "task",
    [object(), {"s": {1, 2}}, {"raw": b"bytes"}, ["ok", {"f": lambda: 1}]],
    ids=["object", "set", "bytes", "function-in-list"],
)
def test_non_json_values_are_refused(store, task):
    with pytest.raises(InvalidInputError):
        store.enqueue_rollout(task)
    assert store.count_rollouts() == 0
    assert store.dequeue_rollout() is None


def test_non_json_metadata_is_refused(store):
    with pytest.raises(InvalidInputError) as info:
        store.enqueue_rollout("t", metadata={"group_id": "g", "handle": object()})
    assert "handle" in str(info.value)
    assert store.count_rollouts() == 0


def test_batch_enqueue_is_all_or_nothing(store):
    store.enqueue_rollout("before")
    batch = [RolloutRequest(input=1), RolloutRequest(input={"x": [object()]}), RolloutRequest(input=3)]
    with pytest.raises(InvalidInputError):
        store.enqueue_rollouts(batch)
    assert store.count_rollouts() == 1
    assert [r.input for r in store.query_rollouts()] == ["before"]
    assert store.dequeue_rollout().rollout.input == "before"
    assert store.dequeue_rollout() is None


def test_non_json_span_attribute_is_refused(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    good = kit.span(rid, aid, "good")
    bad = kit.span(rid, aid, "bad", attributes={"payload": object()})
    with pytest.raises(InvalidInputError) as info:
        store.add_spans([good, bad])
    assert "payload" in str(info.value)
    assert store.query_spans(rid) == []


# ---- duplicates --------------------------------------------------------------------------------------


def test_duplicate_rollout_id_is_refused(store, kit):
    kit.claim(store, {"original": True}, rollout_id="ro-dup")
    before = store.get_rollout("ro-dup")
    with pytest.raises(AlreadyExistsError) as info:
        store.enqueue_rollout({"original": False}, rollout_id="ro-dup")
    assert "ro-dup" in str(info.value)
    assert store.get_rollout("ro-dup") == before
    assert store.count_rollouts() == 1
    assert len(store.get_attempts("ro-dup")) == 1


def test_batch_with_existing_id_stores_nothing(store):
    store.enqueue_rollout("orig", rollout_id="ro-taken")
    with pytest.raises(AlreadyExistsError):
        store.enqueue_rollouts(
            [RolloutRequest(input="new", rollout_id="ro-new"), RolloutRequest(input="dup", rollout_id="ro-taken")]
        )
    assert store.count_rollouts() == 1
    assert store.get_rollout("ro-taken").input == "orig"
    with pytest.raises(NotFoundError):
        store.get_rollout("ro-new")


def test_batch_with_repeated_id_stores_nothing(store):
    with pytest.raises((AlreadyExistsError, InvalidInputError)):
        store.enqueue_rollouts(
            [RolloutRequest(input=1, rollout_id="ro-twice"), RolloutRequest(input=2, rollout_id="ro-twice")]
        )
    assert store.count_rollouts() == 0


# ---- invalid configuration -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [{"max_attempts": 0}, {"timeout_seconds": -1}, {"unresponsive_seconds": 0}, {"retry_on": ["bogus"]}],
    ids=["max_attempts=0", "negative-timeout", "zero-unresponsive", "bad-retry-reason"],
)
def test_invalid_config_is_refused(store, config):
    with pytest.raises((ValidationError, InvalidInputError)):
        store.enqueue_rollout("t", config=config)
    assert store.count_rollouts() == 0


def test_invalid_mode_is_refused(store):
    with pytest.raises((ValidationError, InvalidInputError)):
        store.enqueue_rollout("t", mode="production")
    assert store.count_rollouts() == 0


# ---- files that are not ours (file-based backends) -------------------------------------------------


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_corrupt_file_is_refused(backend, tmp_path):
    backend.require("file_based")
    path = tmp_path / "corrupt.db"
    path.write_bytes(os.urandom(8192))
    digest = _digest(path)
    with pytest.raises(StoreFileError) as info:
        backend.open_file(path)
    assert path.name in str(info.value), f"the message should name the file: {info.value}"
    assert _digest(path) == digest, "a refused file must not be modified"


def test_foreign_database_file_is_refused(backend, tmp_path):
    backend.require("file_based")
    path = tmp_path / "foreign.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO customers (name) VALUES ('alice'), ('bob')")
    conn.close()
    digest = _digest(path)
    with pytest.raises(StoreFileError) as info:
        backend.open_file(path)
    assert path.name in str(info.value), f"the message should name the file: {info.value}"
    assert _digest(path) == digest, "a refused file must not be modified"
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT name FROM customers ORDER BY id").fetchall() == [("alice",), ("bob",)]
    conn.close()


def test_new_file_is_created(backend, tmp_path):
    backend.require("file_based")
    path = tmp_path / "sub" / "fresh.db"
    path.parent.mkdir()
    store = backend.open_file(path)
    store.enqueue_rollout("x")
    assert path.exists()
    assert store.count_rollouts() == 1


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_non_finite_numbers_are_refused(store, value):
    with pytest.raises(InvalidInputError) as info:
        store.enqueue_rollout({"score": value})
    assert "score" in str(info.value)
    assert store.count_rollouts() == 0


@pytest.mark.parametrize(
    "task",
    [{1: "int key"}, {"pair": (1, 2)}, [(1, "a"), {"k": (None,)}]],
    ids=["int-key", "tuple", "nested-tuples"],
)
def test_task_comes_back_as_json_would(store, task):
    """What a backend hands back must not depend on whether it serializes (memory vs SQL vs HTTP)."""
    try:
        rid = store.enqueue_rollout(task).rollout_id
    except InvalidInputError:
        assert store.count_rollouts() == 0
        return
    assert store.get_rollout(rid).input == json.loads(json.dumps(task))
    assert store.dequeue_rollout().rollout.input == json.loads(json.dumps(task))


@pytest.mark.parametrize("group_id", [["a", "b"], {"k": 1}, 7], ids=["list", "dict", "int"])
def test_non_string_group_id_is_refused_or_kept(store, group_id):
    try:
        rid = store.enqueue_rollout("t", metadata={"group_id": group_id}).rollout_id
    except InvalidInputError as exc:
        assert "group_id" in str(exc)
        assert store.count_rollouts() == 0
        return
    assert store.get_rollout(rid).metadata == {"group_id": group_id}
    assert store.count_rollouts() == 1


def test_garbled_store_file_is_refused(backend, tmp_path):
    backend.require("file_based")
    path = tmp_path / "garbled.db"
    store = backend.open_file(path)
    for i in range(20):
        store.enqueue_rollout({"i": i, "pad": "x" * 500})
    backend.close(store)
    data = bytearray(path.read_bytes())
    data[100:4096] = os.urandom(3996)  # the schema page, after the 100-byte file header
    path.write_bytes(bytes(data))
    digest = _digest(path)
    with pytest.raises(StoreFileError) as info:
        backend.open_file(path)
    assert path.name in str(info.value)
    assert _digest(path) == digest


@pytest.mark.parametrize(
    "attributes",
    [
        {"ids": list(range(40)), "pair": (1, 2)},
        {"logprobs": [-0.5] * 30 + [1], "flags": [True, False] * 10},
        {"keys": {str(i): i for i in range(20)} | {7: "int key"}},
        {"mixed": list(range(20)) + [(1, "a")]},
        {"big": [2**80] * 20, "huge_floats": [1e308] * 20},
    ],
    ids=["long-list-and-tuple", "numbers", "int-key-in-long-dict", "tuple-in-long-list", "overflowing-sums"],
)
def test_span_comes_back_as_json_would(store, kit, attributes):
    """The span add_spans returns, and every later read, hold what a JSON round trip gives; the
    HTTP client builds its answer from its own normalized span, so both must agree."""
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    expected = json.loads(json.dumps(attributes))
    returned = store.add_spans([kit.span(rid, aid, attributes=attributes), kit.span(rid, aid)])[0]
    assert returned.attributes == expected
    assert store.query_spans(rid)[0].attributes == expected
    assert json.dumps(returned.attributes) == json.dumps(expected)  # types too: lists, string keys


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_non_finite_number_in_long_list_is_refused(store, kit, bad):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    with pytest.raises(InvalidInputError) as info:
        store.add_span(kit.span(rid, aid, attributes={"logprobs": [-0.25] * 30 + [bad]}))
    assert "logprobs[30]" in str(info.value)
    assert store.query_spans(rid) == []

"""Conformance: query_rollouts / count_rollouts filters, ordering and paging; metadata updates."""

from __future__ import annotations

import time

import pytest

from agentgrad import semconv
from agentgrad.errors import InvalidInputError, NotFoundError
from agentgrad.store.protocol import RolloutFilter


def _ids(rollouts):
    return [r.rollout_id for r in rollouts]


def _finish(store, rid, status="succeeded"):
    attempt = store.get_latest_attempt(rid)
    if attempt.status == "preparing":
        store.update_attempt(rid, attempt.attempt_id, "running")
    store.update_attempt(rid, attempt.attempt_id, status)


@pytest.fixture
def mixed(store, kit):
    """Five rollouts in different states: queued, preparing, running, succeeded, failed."""
    ids = {}
    ids["succeeded"] = kit.start(store, mode="train", metadata={"group_id": "g1"}).rollout.rollout_id
    _finish(store, ids["succeeded"])
    ids["failed"] = kit.start(store, mode="val", metadata={"group_id": "g1"}).rollout.rollout_id
    _finish(store, ids["failed"], "failed")
    ids["running"] = kit.start(store, mode="test", metadata={"group_id": "g2"}).rollout.rollout_id
    ids["preparing"] = kit.claim(store, mode="train", resources_id="res-1").rollout.rollout_id
    ids["queuing"] = store.enqueue_rollout(mode="val", resources_id="res-1").rollout_id
    return ids


def test_query_all_in_enqueue_order(store, mixed):
    expected = [mixed[k] for k in ("succeeded", "failed", "running", "preparing", "queuing")]
    assert _ids(store.query_rollouts()) == expected
    assert _ids(store.query_rollouts(RolloutFilter())) == expected
    assert store.count_rollouts() == 5


def test_query_empty_store(store):
    assert store.query_rollouts() == []
    assert store.count_rollouts() == 0


def test_filter_by_status(store, mixed):
    assert _ids(store.query_rollouts(RolloutFilter(status=["running"]))) == [mixed["running"]]
    got = _ids(store.query_rollouts(RolloutFilter(status=["succeeded", "failed", "queuing"])))
    assert got == [mixed["succeeded"], mixed["failed"], mixed["queuing"]]
    assert store.count_rollouts(RolloutFilter(status=["preparing", "running"])) == 2
    assert store.query_rollouts(RolloutFilter(status=["cancelled"])) == []


def test_filter_by_empty_status_list(store, mixed):
    assert store.query_rollouts(RolloutFilter(status=[])) == []
    assert store.count_rollouts(RolloutFilter(status=[])) == 0


def test_filter_by_mode(store, mixed):
    assert _ids(store.query_rollouts(RolloutFilter(mode="val"))) == [mixed["failed"], mixed["queuing"]]
    assert store.count_rollouts(RolloutFilter(mode="train")) == 2
    assert _ids(store.query_rollouts(RolloutFilter(mode="test"))) == [mixed["running"]]


def test_filter_by_rollout_ids(store, mixed):
    wanted = [mixed["queuing"], mixed["succeeded"], "ro-unknown"]
    got = _ids(store.query_rollouts(RolloutFilter(rollout_ids=wanted)))
    assert got == [mixed["succeeded"], mixed["queuing"]]
    assert store.count_rollouts(RolloutFilter(rollout_ids=wanted)) == 2
    assert store.query_rollouts(RolloutFilter(rollout_ids=[])) == []


def test_filter_by_group_id(store, mixed):
    assert _ids(store.query_rollouts(RolloutFilter(group_id="g1"))) == [mixed["succeeded"], mixed["failed"]]
    assert store.count_rollouts(RolloutFilter(group_id="g2")) == 1
    assert store.query_rollouts(RolloutFilter(group_id="nope")) == []


def test_filter_by_resources_id(store, mixed):
    got = _ids(store.query_rollouts(RolloutFilter(resources_id="res-1")))
    assert got == [mixed["preparing"], mixed["queuing"]]


def test_filters_combine(store, mixed):
    f = RolloutFilter(group_id="g1", status=["failed"], mode="val")
    assert _ids(store.query_rollouts(f)) == [mixed["failed"]]
    assert store.count_rollouts(RolloutFilter(group_id="g1", mode="test")) == 0


def test_filter_no_llm_calls(store, kit):
    with_calls = kit.start(store).rollout.rollout_id
    aid = store.get_latest_attempt(with_calls).attempt_id
    store.add_span(kit.span(with_calls, aid, semconv.SPAN_LLM_CALL))
    _finish(store, with_calls)
    without = kit.start(store).rollout.rollout_id
    aid = store.get_latest_attempt(without).attempt_id
    store.add_span(kit.span(without, aid, "tool"))
    _finish(store, without)
    kit.start(store)  # running, no calls yet: not flagged yet
    store.enqueue_rollout()  # not finished: not flagged yet
    assert _ids(store.query_rollouts(RolloutFilter(no_llm_calls=True))) == [without]
    assert store.count_rollouts(RolloutFilter(no_llm_calls=True)) == 1


SORT_KEYS = ["enqueue_time", "start_time", "end_time", "rollout_id", "reward"]


@pytest.fixture
def sortable(store, kit):
    """Four finished rollouts whose order differs per sort key.

    enqueue/start order: c, a, d, b;  end order: d, b, c, a;  id order: a, b, c, d;
    reward order: b, d, a, c.
    """
    rewards = {"a": 0.5, "b": -1.0, "c": 2.0, "d": 0.0}
    attempts = {}
    for name in ["c", "a", "d", "b"]:
        claimed = kit.claim(store, rollout_id=f"ro-{name}")
        attempts[name] = claimed.attempt.attempt_id
        store.update_attempt(f"ro-{name}", claimed.attempt.attempt_id, "running")
        store.add_span(
            kit.span(
                f"ro-{name}",
                claimed.attempt.attempt_id,
                semconv.SPAN_REWARD,
                attributes={semconv.REWARD_VALUE: rewards[name]},
            )
        )
        time.sleep(0.005)
    for name in ["d", "b", "c", "a"]:
        store.update_attempt(f"ro-{name}", attempts[name], "succeeded")
        time.sleep(0.005)
    return {
        "enqueue_time": ["c", "a", "d", "b"],
        "start_time": ["c", "a", "d", "b"],
        "end_time": ["d", "b", "c", "a"],
        "rollout_id": ["a", "b", "c", "d"],
        "reward": ["b", "d", "a", "c"],
    }


@pytest.mark.parametrize("descending", [False, True], ids=["asc", "desc"])
@pytest.mark.parametrize("key", SORT_KEYS)
def test_sort_by(store, sortable, key, descending):
    got = _ids(store.query_rollouts(RolloutFilter(sort_by=key, descending=descending)))
    expected = [f"ro-{n}" for n in sortable[key]]
    assert got == (expected[::-1] if descending else expected)


def test_sort_by_status_groups_statuses(store, mixed):
    store.enqueue_rollout()  # a second queuing rollout makes grouping observable

    def runs(descending):
        got = store.query_rollouts(RolloutFilter(sort_by="status", descending=descending))
        assert len(got) == 6
        statuses = [r.status for r in got]
        return [s for i, s in enumerate(statuses) if i == 0 or statuses[i - 1] != s]

    asc, desc = runs(False), runs(True)
    assert len(asc) == 5, f"each status must form one contiguous run: {asc}"
    assert desc == asc[::-1]


def test_limit_and_offset_page_through(store):
    ids = [store.enqueue_rollout(i).rollout_id for i in range(10)]
    pages = [_ids(store.query_rollouts(RolloutFilter(limit=3, offset=o))) for o in (0, 3, 6, 9)]
    assert pages == [ids[0:3], ids[3:6], ids[6:9], ids[9:]]
    assert _ids(store.query_rollouts(RolloutFilter(offset=8))) == ids[8:]
    assert store.query_rollouts(RolloutFilter(offset=20)) == []
    assert store.query_rollouts(RolloutFilter(limit=0)) == []


def test_paging_applies_after_sorting_and_filtering(store):
    ids = [store.enqueue_rollout(i, mode="val" if i % 2 else "train").rollout_id for i in range(10)]
    val = [rid for i, rid in enumerate(ids) if i % 2]
    got = _ids(store.query_rollouts(RolloutFilter(mode="val", descending=True, limit=2, offset=1)))
    assert got == val[::-1][1:3]


def test_count_ignores_paging(store):
    for i in range(7):
        store.enqueue_rollout(i)
    assert store.count_rollouts(RolloutFilter(limit=2, offset=3)) == 7
    assert store.count_rollouts(RolloutFilter(limit=0)) == 7


def test_update_metadata_merges(store):
    rid = store.enqueue_rollout(metadata={"a": 1, "b": {"x": 1}}).rollout_id
    updated = store.update_rollout_metadata(rid, {"b": {"y": 2}, "c": [1, 2]})
    assert updated.metadata == {"a": 1, "b": {"y": 2}, "c": [1, 2]}
    assert store.get_rollout(rid).metadata == {"a": 1, "b": {"y": 2}, "c": [1, 2]}
    store.update_rollout_metadata(rid, {"a": "overwritten"})
    assert store.get_rollout(rid).metadata == {"a": "overwritten", "b": {"y": 2}, "c": [1, 2]}


def test_update_metadata_does_not_touch_status(store, kit):
    started = kit.start(store)
    rid = started.rollout.rollout_id
    store.update_rollout_metadata(rid, {"note": "hi"})
    rollout = store.get_rollout(rid)
    assert rollout.status == "running"
    assert rollout.metadata["note"] == "hi"


def test_update_metadata_group_id_is_queryable(store):
    rid = store.enqueue_rollout().rollout_id
    store.enqueue_rollout()
    store.update_rollout_metadata(rid, {"group_id": "late-group"})
    assert _ids(store.query_rollouts(RolloutFilter(group_id="late-group"))) == [rid]


def test_update_metadata_on_finished_rollout(store, kit):
    started = kit.start(store)
    rid = started.rollout.rollout_id
    _finish(store, rid)
    store.update_rollout_metadata(rid, {"score_note": "ok"})
    rollout = store.get_rollout(rid)
    assert rollout.metadata == {"score_note": "ok"}
    assert rollout.status == "succeeded"


def test_update_metadata_unknown_rollout(store):
    with pytest.raises(NotFoundError) as info:
        store.update_rollout_metadata("ro-ghost", {"a": 1})
    assert "ro-ghost" in str(info.value)


def test_update_metadata_refuses_non_json(store):
    rid = store.enqueue_rollout(metadata={"a": 1}).rollout_id
    with pytest.raises(InvalidInputError) as info:
        store.update_rollout_metadata(rid, {"ok": 1, "bad": {"inner": object()}})
    assert "inner" in str(info.value)
    assert store.get_rollout(rid).metadata == {"a": 1}


@pytest.mark.parametrize("descending", [False, True], ids=["asc", "desc"])
@pytest.mark.parametrize("key", ["start_time", "end_time", "reward"])
def test_missing_values_sort_last(store, kit, key, descending):
    """Rollouts without the sort value (not started, not ended, no reward) come last either way,
    so every backend pages the same way (SQL engines disagree on NULL placement by default)."""
    done = []
    for value in (0.2, 0.9):
        started = kit.start(store)
        rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
        store.add_span(kit.span(rid, aid, semconv.SPAN_REWARD, attributes={semconv.REWARD_VALUE: value}))
        store.update_attempt(rid, aid, "succeeded")
        done.append(rid)
        time.sleep(0.005)
    missing = store.enqueue_rollout().rollout_id
    got = _ids(store.query_rollouts(RolloutFilter(sort_by=key, descending=descending)))
    assert got == (done[::-1] if descending else done) + [missing]
